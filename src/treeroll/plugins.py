"""Every built-in plug-in, registered in this one visible module.

Strategies, allocators, advantage estimators, environments and process scorers are looked up
here by the trainer and the CLI; ``package.module:object`` names a user's own plug-in instead.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from treeroll import advantages, allocators
from treeroll.base import (
    AdvantageEstimator,
    Allocator,
    Env,
    GenerationBackend,
    ProcessScorer,
    Strategy,
    UpdatableBackend,
)
from treeroll.registry import Registry, build_user_plugin, parse_options
from treeroll.strategies import PATR

__all__ = ["ADVANTAGES", "ALLOCATORS", "BACKENDS", "ENVS", "ENV_SCORERS", "SCORERS", "STRATEGIES",
           "BackendPlugin", "backend_streams", "make_allocator", "make_backend", "make_env_factory",
           "make_estimator", "make_strategy", "register_backend", "scorer_name_for",
           "sync_weights"]

ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")
ADVANTAGES.register("grpo", advantages.grpo)
ADVANTAGES.register("dr_grpo", advantages.dr_grpo)
ADVANTAGES.register("rloo", advantages.rloo)
ADVANTAGES.register("tree", advantages.tree_advantage)
ADVANTAGES.register("treerl", advantages.treerl)
ADVANTAGES.register("gigpo", advantages.gigpo)
ADVANTAGES.register("treepo", advantages.treepo)
ADVANTAGES.register("progress", advantages.progress_conditioned)
ADVANTAGES.register("planpo", advantages.planpo)
ADVANTAGES.register("arpo_hard", advantages.arpo_hard)
ADVANTAGES.register("sao", advantages.BatchBaseline)  # type: ignore[arg-type]  # a class


def make_estimator(advantage_config: Any) -> AdvantageEstimator:
    """The estimator named by ``advantage_config.name`` with its hyper-parameters bound.

    Every field of the config but ``name`` (``std``, ``singleton``, ``eps``) is passed as a
    keyword to an estimator that takes it (``functools.partial`` of a function; a class, a
    :class:`~treeroll.base.BatchAdvantageEstimator`, is built with them). An estimator that does not
    take an option never receives it, and a non-default value for it is an error naming the
    option and the estimator, rather than a setting silently ignored (``rloo`` takes none).
    """
    name = advantage_config.name
    estimator = ADVANTAGES.get(name)
    try:  # a class (a batch-level estimator) takes its options when built; a function after
        parameters = list(inspect.signature(estimator).parameters.values())  # the tree
        parameters = parameters if inspect.isclass(estimator) else parameters[1:]
    except (TypeError, ValueError):  # a callable whose signature cannot be read
        parameters = []
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    accepted = [p.name for p in parameters if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                         inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if ":" in name and getattr(advantage_config, "options", None):
        if inspect.isclass(estimator):  # a batch-level estimator: built with its options
            made: AdvantageEstimator = build_user_plugin(estimator, advantage_config.options,
                                                         "advantage")
            return made
        return build_user_plugin(functools.partial, advantage_config.options, "advantage",
                                 estimator)
    options: dict[str, Any] = {}
    for option in dataclasses.fields(advantage_config):
        if option.name in ("name", "options"):
            continue
        value = getattr(advantage_config, option.name)
        if takes_any or option.name in accepted:
            options[option.name] = value
        elif value != option.default:
            takes = ", ".join(accepted) or "no options"
            raise ValueError(f"advantage.{option.name}={value!r} does not apply to the "
                             f"{name!r} estimator (it takes: {takes}); leave it at its "
                             f"default {option.default!r} or choose an estimator that takes it")
    if inspect.isclass(estimator):
        built: AdvantageEstimator = estimator(**options)  # type: ignore[assignment]
        return built
    return functools.partial(estimator, **options)

AllocatorBuilder = Callable[[Any, Any], Allocator | None]
ALLOCATORS: Registry[AllocatorBuilder] = Registry("allocator")
"""Allocator name -> ``builder(allocator_config, rollout_config)`` of a fresh allocator for one
batch (``None``: ``rollout()``'s uniform default)."""
ALLOCATORS.register("uniform", lambda config, rollout: None)
ALLOCATORS.register("vigor", allocators.build_vigor)


def make_allocator(allocator_config: Any, rollout_config: Any) -> Allocator | None:
    """A fresh allocator for one batch, named by ``allocator_config.name`` (errors name the
    setting); ``None`` for the uniform default."""
    made: Allocator | None = ALLOCATORS.get(allocator_config.name)(allocator_config,
                                                                     rollout_config)
    return made


STRATEGIES: Registry[str] = Registry("strategy")
"""Strategy name -> the field of ``StrategyConfig`` that holds its (configured) instance."""
for _name in ("chain", "tree_grpo", "patr", "random_tree", "arpo", "rtpo", "igrpo"):
    STRATEGIES.register(_name, _name)


def make_strategy(strategy_config: Any) -> Strategy:
    """The configured strategy object named by ``strategy_config.name``."""
    name = strategy_config.name
    if name in STRATEGIES:
        strategy: Strategy = getattr(strategy_config, STRATEGIES.get(name))
        return strategy
    obj: Any = STRATEGIES.get(name)  # an import path, or raises listing the valid names
    made: Strategy = build_user_plugin(obj, strategy_config.options, "strategy")
    return made


EnvFactoryBuilder = Callable[[Any], Callable[[], Env]]
ENVS: Registry[EnvFactoryBuilder] = Registry("environment")


def _frozenlake(convention: str) -> EnvFactoryBuilder:
    def build(env_config: Any) -> Callable[[], Env]:
        from treeroll.envs.frozenlake import make_frozenlake

        overrides = {key: getattr(env_config, key)
                     for key in ("size_min", "size_max", "slippery", "max_turns",
                                 "format_penalty")
                     if getattr(env_config, key) is not None}
        make_frozenlake(convention, **overrides)  # validate now, not in a worker
        return lambda: make_frozenlake(convention, **overrides)
    return build


ENVS.register("frozenlake_rllm", _frozenlake("rllm"))
ENVS.register("frozenlake_ragen", _frozenlake("ragen"))


def _swe(env_config: Any) -> Callable[[], Env]:
    from treeroll.envs.swe import builtin_tasks, load_swebench_jsonl, make_swe_env

    tasks = (builtin_tasks() if env_config.instances is None
             else load_swebench_jsonl(env_config.instances, env_config.repos))
    settings = parse_options(env_config.options)  # SWEEnvConfig / SandboxLimits fields
    if "tools" in settings:
        settings["tools"] = tuple(settings["tools"])
    if env_config.max_turns is not None:
        settings["step_limit"] = env_config.max_turns
    try:  # a bad setting fails before work
        make_swe_env("mini", tasks, **settings).close()
    except (TypeError, ValueError) as err:
        raise ValueError(f"--env.options for swe: {err}") from None
    return lambda: make_swe_env("mini", tasks, **settings)


ENVS.register("swe", _swe)


def make_env_factory(env_config: Any) -> Callable[[], Env]:
    """A zero-argument environment constructor for ``env_config.name``."""
    name: str = env_config.name
    if name.startswith("gym:"):
        from treeroll.envs.gym_text import GymTextEnv

        env_id = name[4:]
        return lambda: GymTextEnv(env_id)
    if name in ENVS:
        return ENVS.get(name)(env_config)
    factory: Any = ENVS.get(name)  # raises with the valid names unless an import path
    if not env_config.options:
        return factory
    options = parse_options(env_config.options)  # read once, not at every environment made
    build_user_plugin(factory, options, "env", parsed=True)  # a bad option fails before work
    return functools.partial(build_user_plugin, factory, options, "env", parsed=True)


SCORERS: Registry[Callable[..., ProcessScorer]] = Registry("process scorer")
"""Filled by :mod:`treeroll.scorers` builders (name -> constructor taking the ScorerConfig)."""


def _scorer_builder(name: str) -> Callable[..., ProcessScorer]:
    """Builder of the built-in scorer ``name`` (``treeroll.scorers.build_<name>``), imported
    when a scorer is made so that this module stays light."""
    def build(config: Any, **context: Any) -> ProcessScorer:
        from treeroll import scorers

        builder: Callable[..., ProcessScorer] = getattr(scorers, f"build_{name}")
        return builder(config, **context)
    return build


for _name in ("frozenlake_progress", "degeneracy", "value", "judge", "blend"):
    SCORERS.register(_name, _scorer_builder(_name))


def _swe_scorer(config: Any, **context: Any) -> ProcessScorer:
    from treeroll.envs.swe import SWEProcessScorer

    return SWEProcessScorer()


SCORERS.register("swe", _swe_scorer)

ENV_SCORERS: dict[str, str] = {"frozenlake_rllm": "frozenlake_progress",
                               "frozenlake_ragen": "frozenlake_progress", "swe": "swe"}
"""Environment name -> its own process scorer, used when a scoring strategy names none."""


def scorer_name_for(scorer_name: str | None, strategy: Strategy, env_name: str) -> str | None:
    """The process scorer a run builds: ``scorer_name`` when set; else, for a strategy that
    steers by scores (PATR with ``use_scores``), the environment's own from
    :data:`ENV_SCORERS`, with a warning saying so; else ``None``.

    A scoring strategy on an environment without a scorer of its own is an error naming
    ``--scorer.name`` (PATR would otherwise silently become the random tree)."""
    if scorer_name or not (isinstance(strategy, PATR) and strategy.use_scores):
        return scorer_name or None
    default = ENV_SCORERS.get(env_name)
    if default is None:
        raise ValueError(f"strategy {strategy.name!r} steers by process scores, but no scorer "
                         f"is set and environment {env_name!r} has none of its own; pass "
                         f"--scorer.name (valid: {', '.join(SCORERS.names())}, or "
                         "package.module:object), or --strategy.name random_tree to branch "
                         "without scores")
    warnings.warn(f"strategy {strategy.name!r} has no --scorer.name: using the {env_name} "
                  f"environment's scorer {default!r}", stacklevel=2)
    return default


BackendBuilder = Callable[[Any, Any], GenerationBackend]


@dataclasses.dataclass(frozen=True)
class BackendPlugin:
    """A registered backend: its builder (taking the ``BackendConfig`` and the policy) and
    whether what it builds is a :class:`~treeroll.base.StreamingBackend` (the config check
    refuses ``--rollout.continuous`` with one that is not, before anything is built)."""

    build: BackendBuilder
    streams: bool


BACKENDS: Registry[BackendPlugin] = Registry("backend")
"""Backend name -> :class:`BackendPlugin`."""


def register_backend(name: str, builder: BackendBuilder, *, streams: bool) -> BackendBuilder:
    """Register ``builder`` as backend ``name`` (see :class:`BackendPlugin`)."""
    BACKENDS.register(name, BackendPlugin(builder, streams))
    return builder


def _hf_backend(config: Any, policy: Any) -> GenerationBackend:
    from treeroll.backends.hf import HFBackend

    hf = config.hf
    return HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0,
                     max_batch_size=hf.max_batch_size, max_cached_tokens=hf.max_cached_tokens,
                     use_prefix_cache=hf.use_prefix_cache, keep_logits=hf.keep_logits,
                     replay=hf.replay, max_kept_logits_bytes=hf.max_kept_logits_mib * 2**20,
                     join_fraction=hf.join_fraction, join_wait=hf.join_wait)


register_backend("hf", _hf_backend, streams=True)


def _llamacpp_backend(config: Any, policy: Any) -> GenerationBackend:
    from treeroll.backends.llamacpp import LlamaCppBackend, ManagedLlamaCpp

    c = config.llamacpp
    if c.url is not None:
        return LlamaCppBackend(c.url, concurrency=c.slots, share_prompts=c.share_prompts,
                               eog_token_ids=(int(policy.tokenizer.eos_token_id),),
                               vocab_size=len(policy.tokenizer))
    return ManagedLlamaCpp(policy.model, policy.tokenizer, slots=c.slots,
                           ctx_per_slot=c.ctx_per_slot, threads=c.threads,
                           cache_ram_mib=c.cache_ram_mib, share_prompts=c.share_prompts)


def _vllm_backend(config: Any, policy: Any) -> GenerationBackend:
    import tempfile

    from treeroll.backends.vllm import VLLMBackend, make_llm

    folder = tempfile.mkdtemp(prefix="treeroll-vllm-")  # vLLM loads a folder
    policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    c = config.vllm
    return VLLMBackend(make_llm(folder, gpu_memory_utilization=c.gpu_memory_utilization,
                                dtype=c.dtype, max_model_len=c.max_model_len,
                                enforce_eager=c.enforce_eager))


def _sglang_backend(config: Any, policy: Any) -> GenerationBackend:
    from treeroll.backends.sglang import SGLangBackend

    return SGLangBackend(config.sglang.url, model=policy.model)


register_backend("llamacpp", _llamacpp_backend, streams=False)
register_backend("vllm", _vllm_backend, streams=False)
register_backend("sglang", _sglang_backend, streams=False)


def backend_streams(name: str) -> bool | None:
    """Whether the backend registered as ``name`` decodes continuously
    (:class:`~treeroll.base.StreamingBackend`); None for a user's ``package.module:builder``,
    known only once built (``rollout()`` checks the built backend)."""
    return BACKENDS.get(name).streams if name in BACKENDS else None


def make_backend(backend_config: Any, policy: Any) -> GenerationBackend:
    """The backend named by ``backend_config.name`` for ``policy``; a user's
    ``package.module:builder`` is called with the policy and its ``options`` block."""
    plugin = BACKENDS.get(backend_config.name)  # registered, or a user's loaded builder
    if isinstance(plugin, BackendPlugin):
        return plugin.build(backend_config, policy)
    made: GenerationBackend = build_user_plugin(plugin, backend_config.options, "backend",
                                                policy)
    return made


def sync_weights(backend: GenerationBackend, model: Any) -> None:
    """After an update: an :class:`~treeroll.base.UpdatableBackend` loads the model's new
    weights (and forgets its cache); any other backend, which must share the model object in
    process, only forgets its cache."""
    if isinstance(backend, UpdatableBackend):
        backend.load_weights(model.state_dict())
    else:
        backend.reset_cache()
