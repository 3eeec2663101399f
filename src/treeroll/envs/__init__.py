"""Text environments that fork: FrozenLake in two conventions, any Gymnasium text env, and
``check_env`` for users' own environments."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from treeroll.base import Env
from treeroll.checks import checked
from treeroll.envs.check import EnvCheckError, check_env
from treeroll.envs.frozenlake import (
    FrozenLakeEnv,
    distance_to_goal,
    frozenlake_corpus,
    make_frozenlake,
    start_distance,
)
from treeroll.envs.frozenlake_maps import FrozenLakeConfig
from treeroll.envs.gym_text import GymTextEnv
from treeroll.registry import Registry, build_user_plugin, parse_options, plugin_section

__all__ = [
    "ENVS",
    "ENV_BLOCKS",
    "CheckedTogether",
    "EnvCheckError",
    "EnvConfig",
    "EnvSpec",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "FrozenLakeSettings",
    "GymTextEnv",
    "SWESettings",
    "check_env",
    "distance_to_goal",
    "env_names",
    "env_problems",
    "env_spec",
    "frozenlake_corpus",
    "make_env_factory",
    "make_frozenlake",
    "register_env",
    "start_distance",
]


@dataclass
class FrozenLakeSettings:
    """``env.frozenlake``: FrozenLake's settings over its convention's (``frozenlake_rllm``,
    ``frozenlake_ragen``); None keeps the convention's."""

    size_min: int | None = checked(None, ge=2)
    """Smallest map side."""
    size_max: int | None = checked(None, ge=2)
    """Largest map side."""
    slippery: bool | None = None
    """Slippery dynamics."""
    format_penalty: float | None = checked(None, ge=0)
    """Subtracted from a turn's reward when its reply held no valid action (the conventions':
    rLLM 0, RAGEN 0.1). Success is unchanged; only the reward RL ranks trajectories by sees
    it."""

    def problems(self) -> list[tuple[str, str]]:
        """``(setting, message)`` of settings that do not fit together."""
        low, high = self.size_min, self.size_max
        if low is not None and high is not None and low > high:
            return [("size_min", f"is {low}, above --env.frozenlake.size-max {high}")]
        return []


@dataclass
class SWESettings:
    """``env.swe``: which instances the SWE environment (``--env.name swe``) serves."""

    instances: str | None = None
    """A SWE-bench-format JSONL file of instances, validated before any work (None = the 240
    built-in tasks); a task seed picks instance ``seed mod count``."""
    repos: str | None = None
    """The folder holding the instances' git checkouts (``owner__name``, ``name`` or
    ``owner/name``, or the checkout itself); an instance's own ``repo_path`` wins."""

    def problems(self) -> list[tuple[str, str]]:
        """``(setting, message)``: ``repos`` needs ``instances``, and the instances load."""
        if self.instances is None:
            return [("repos", f"is {self.repos!r}, but --env.swe.instances is not set")] \
                if self.repos is not None else []
        from treeroll.envs.swe import SWEInstanceError, load_swebench_jsonl

        try:
            load_swebench_jsonl(self.instances, self.repos)
        except (SWEInstanceError, FileNotFoundError) as err:
            return [("instances", str(err))]
        return []


@runtime_checkable
class CheckedTogether(Protocol):
    """A settings block with checks across its fields (an ``EnvSpec``'s ``settings`` may
    have them; the per-field ones are :func:`treeroll.checks.checked`)."""

    def problems(self) -> list[tuple[str, str]]:
        """``(setting, message)`` of settings that do not fit together."""
        ...


EnvFactoryBuilder = Callable[["EnvConfig"], Callable[[], Env]]
"""``(env_config) -> constructor``: checks the settings (a bad one fails before any work) and
returns a zero-argument environment constructor."""


@dataclass(frozen=True)
class EnvSpec:
    """One environment's registration record (Gymnasium's ``EnvSpec``, for treeroll's forking
    text environments): how it is built, which settings block it reads, and what the rest of
    treeroll needs to know about it, so no code outside this package names an environment."""

    build: EnvFactoryBuilder
    """Builds the environment constructor from the ``env`` section."""
    _: dataclasses.KW_ONLY  # every other field by name: a record grows without reordering
    block: str | None = None
    """The family settings block it reads, ``env.<block>``: both FrozenLake conventions read
    ``frozenlake``."""
    settings: type | None = None
    """That block's dataclass (its fields are ``env.<block>.*``; if it is
    :class:`CheckedTogether`, its ``problems()`` checks them together before any work)."""
    exclusive: bool = False
    """Its block's settings, changed for another environment, are an error rather than
    ignored (SWE's instances: data another environment would silently not read). Tuning
    another family's block is otherwise ignored, so one YAML serves with another
    ``--env.name``."""
    scorer: str | None = None
    """Its own process scorer, used when a scoring strategy (PATR) names none."""
    actor: str | None = None
    """A backend that acts in it without a policy (a scripted agent), for environments the
    shipped policies cannot read: ``treeroll rollout`` without ``--run`` uses it, and
    ``ray-rollout`` (which grows trees with the shipped start) refuses the environment."""
    run_defaults: Callable[[Any], Any] | None = None
    """The settings a run on it needs, applied by ``treeroll rollout`` (a training config in,
    one out): SWE's longer turns and PATR's K = 13 turns, as in the paper."""
    shown_as: str = ""
    """How ``--help`` and errors show a name family (``gym:<env id>``); empty for one name."""

    def __post_init__(self) -> None:
        if (self.block is None) != (self.settings is None):
            raise ValueError("an EnvSpec names its settings block and its dataclass together "
                             f"(block={self.block!r}, settings={self.settings!r})")
        if self.exclusive and self.block is None:
            raise ValueError("an exclusive EnvSpec needs a settings block")


ENVS: Registry[EnvSpec] = Registry("environment")
"""Environment name -> :class:`EnvSpec`. A name ending in ``:`` is a prefix: ``gym:`` serves
every ``gym:<env id>``."""


def register_env(name: str, build: EnvFactoryBuilder, **spec: Any) -> EnvSpec:
    """Register environment ``name`` (the fields of :class:`EnvSpec` as keywords)."""
    return ENVS.register(name, EnvSpec(build, **spec))


def _frozenlake(convention: str) -> EnvFactoryBuilder:
    def build(env_config: EnvConfig) -> Callable[[], Env]:
        from treeroll.envs.frozenlake import make_frozenlake

        settings = {**dataclasses.asdict(env_config.frozenlake),
                    "max_turns": env_config.max_turns}
        overrides = {key: value for key, value in settings.items() if value is not None}
        make_frozenlake(convention, **overrides)  # validate now, not in a worker
        return lambda: make_frozenlake(convention, **overrides)
    return build


register_env("frozenlake_rllm", _frozenlake("rllm"), block="frozenlake",
             settings=FrozenLakeSettings, scorer="frozenlake_progress")
register_env("frozenlake_ragen", _frozenlake("ragen"), block="frozenlake",
             settings=FrozenLakeSettings, scorer="frozenlake_progress")


def _swe(env_config: EnvConfig) -> Callable[[], Env]:
    from treeroll.envs.swe import builtin_tasks, load_swebench_jsonl, make_swe_env

    swe = env_config.swe
    tasks = (builtin_tasks() if swe.instances is None
             else load_swebench_jsonl(swe.instances, swe.repos))
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


def _swe_run_defaults(config: Any) -> Any:  # Any: a TrainConfig, and config.py is a layer up
    """A turn is a whole tool call (up to 4,096 tokens); PATR looks K = 13 turns ahead on SWE
    tasks, as in the paper (unless set)."""
    rollout, patr = config.rollout, config.strategy.patr
    if rollout.max_turn_tokens < 4096:
        config.rollout = dataclasses.replace(rollout, max_turn_tokens=4096)
    if patr.k_turns == type(patr)().k_turns:
        config.strategy = dataclasses.replace(
            config.strategy, patr=dataclasses.replace(patr, k_turns=13))
    return config


register_env("swe", _swe, block="swe", settings=SWESettings, exclusive=True, scorer="swe",
             actor="swe_scripted", run_defaults=_swe_run_defaults)


def _gym(env_config: EnvConfig) -> Callable[[], Env]:
    env_id = env_config.name.removeprefix("gym:")
    return lambda: GymTextEnv(env_id)


register_env("gym:", _gym, shown_as="gym:<env id>")


ENVS.load_entry_points("treeroll.envs", record=EnvSpec)  # installed packages' own


def _blocks() -> dict[str, type]:
    blocks: dict[str, type] = {}
    for name in ENVS:
        spec = ENVS.get(name)
        if spec.block is not None and spec.settings is not None and \
                blocks.setdefault(spec.block, spec.settings) is not spec.settings:
            raise ValueError(f"environment {name!r}: block {spec.block!r} is another "
                             "environment's, with other settings")
    return blocks


ENV_BLOCKS: dict[str, type] = _blocks()
"""Each environment family's settings block, ``env.<family>.*`` (from the records)."""


@dataclass
class EnvSection:
    """Which environment the tasks come from."""

    name: str = "frozenlake_rllm"
    """``frozenlake_rllm`` (PATR's benchmark), ``frozenlake_ragen``, ``swe``, ``gym:<env id>``,
    or ``package.module:factory`` (a callable returning an Env, called with ``options``)."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own environment factory (``package.module:object``): its config block, ``KEY
    VALUE`` pairs on the command line or a mapping in YAML, each value read as YAML; a
    dataclass gets them as its fields, a builder as keywords. For ``swe``: ``SWEEnvConfig``
    and ``SandboxLimits`` fields (``tools "[/opt/conda]"``, ``memory_mb 2048``, ``isolation
    copy``)."""
    max_turns: int | None = checked(None, ge=1)
    """Cap on turns per episode (None = the environment's)."""
    train_tasks: int = checked(10_000, ge=1)
    """Task seeds in the training pool (rLLM: 10,000)."""
    task_seed: int = checked(0, ge=0)
    """Seed of the generator that draws the training pool's task seeds."""


if TYPE_CHECKING:  # what plugin_section makes, as the type checker sees the built-ins
    @dataclass
    class EnvConfig(EnvSection):
        frozenlake: FrozenLakeSettings = field(default_factory=FrozenLakeSettings)
        swe: SWESettings = field(default_factory=SWESettings)
else:
    EnvConfig = plugin_section(EnvSection, ENV_BLOCKS, "EnvConfig")


def env_spec(name: str) -> EnvSpec | None:
    """The registration record of environment ``name`` (a prefix's for ``gym:<env id>``), or
    None for a user's ``package.module:factory`` (imported here); an unknown name, or a
    prefix without its id, raises listing the valid ones."""
    for prefix in ENVS:
        if prefix.endswith(":") and name.startswith(prefix):
            if name == prefix:
                raise ValueError(f"environment {name!r} needs an id after it: "
                                 f"{ENVS.get(prefix).shown_as}")
            return ENVS.get(prefix)
    found = ENVS.get(name)  # raises with the valid names unless an import path
    return found if isinstance(found, EnvSpec) else None


def env_names() -> list[str]:
    """The registered environments as ``--help`` and errors show them."""
    return [ENVS.get(name).shown_as or name for name in ENVS]


def make_env_factory(env_config: EnvConfig) -> Callable[[], Env]:
    """A zero-argument environment constructor for ``env_config.name``."""
    spec = env_spec(env_config.name)
    if spec is not None:
        return spec.build(env_config)
    factory: Any = ENVS.get(env_config.name)  # a user's package.module:factory
    if not env_config.options:
        return factory
    options = parse_options(env_config.options)  # read once, not at every environment made
    build_user_plugin(factory, options, "env", parsed=True)  # a bad option fails before work
    return functools.partial(build_user_plugin, factory, options, "env", parsed=True)


def env_problems(env_config: EnvConfig) -> list[tuple[str, str]]:
    """Problems of the ``env`` section's name and family blocks, as ``(dotted setting,
    message)``: an unknown name; the environment's own block's checks (its ``problems()``, if
    it is :class:`CheckedTogether`); a setting of another family's block whose environment is
    ``exclusive`` (SWE's instances: data another environment would silently not read). Nothing
    is built."""
    name = env_config.name
    spec = None
    if ":" not in name or any(name.startswith(p) for p in ENVS if p.endswith(":")):
        try:
            spec = env_spec(name)
        except ValueError as err:
            return [("env.name", f"is {name!r}: {err}" if name in ENVS else
                     f"is {name!r}; valid: {', '.join(env_names())} or "
                     "'package.module:object' for your own")]
    own = spec.block if spec is not None else None
    found: list[tuple[str, str]] = []
    for block, settings_type in ENV_BLOCKS.items():
        settings = getattr(env_config, block)
        if block == own:
            if isinstance(settings, CheckedTogether):
                found += [(f"env.{block}.{key}", message)
                          for key, message in settings.problems()]
            continue
        users = [n for n in ENVS if ENVS.get(n).block == block]
        if not any(ENVS.get(n).exclusive for n in users):
            continue  # tuning another family's block is ignored (a YAML reused with --env.name)
        defaults = settings_type()
        for item in dataclasses.fields(settings_type):
            value = getattr(settings, item.name)
            if value != getattr(defaults, item.name):
                found.append((f"env.{block}.{item.name}", f"is {value!r}; it is for "
                              f"--env.name {' or '.join(users)}, not {name!r}"))
    return found
