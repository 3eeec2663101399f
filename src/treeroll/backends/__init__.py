"""Generation backends: what samples the turns (:class:`treeroll.base.GenerationBackend`).

``hf`` (transformers in process, :mod:`treeroll.backends.hf`), ``llamacpp``
(:mod:`treeroll.backends.llamacpp`), ``vllm`` and ``sglang``; :data:`BACKENDS` maps each name to
its builder and settings (:mod:`treeroll.backends.configs`), :func:`make_backend` builds one.
Every backend a run uses is built here, so ``backend.<name>.*`` always applies. Adding one: a
builder ``(backend_config, policy) -> GenerationBackend`` and one ``register_backend`` line (or
a :class:`BackendSpec` under the ``treeroll.backends`` entry point of a package of your own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from treeroll.backends.configs import (
    HFBackendConfig,
    LlamaCppBackendConfig,
    SGLangBackendConfig,
    VLLMBackendConfig,
)
from treeroll.base import GenerationBackend, UpdatableBackend
from treeroll.causal_lm import CausalLM, PolicyParts
from treeroll.registry import Registry, build_user_plugin, plugin_section

__all__ = ["BACKENDS", "BackendConfig", "BackendSpec", "HFBackendConfig",
           "LlamaCppBackendConfig", "SGLangBackendConfig", "VLLMBackendConfig",
           "backend_streams", "make_backend", "register_backend", "sync_weights"]

BackendBuilder = Callable[["BackendConfig", "PolicyParts | None"], GenerationBackend]
"""``(backend_config, policy) -> backend``; ``policy`` is None only for a backend that acts
without one (a scripted agent: see :attr:`BackendSpec.tokenizer`)."""


def _policy(policy: PolicyParts | None, backend: str) -> PolicyParts:
    """``policy``, which backend ``backend`` decodes with; an error if there is none."""
    if policy is None:
        raise ValueError(f"backend {backend!r} decodes with a policy's model, and none was "
                         "given (--policy.init names one)")
    return policy


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """One backend's registration record (as :class:`treeroll.envs.EnvSpec` and
    :class:`treeroll.scorers.ScorerSpec` are): its builder (taking the ``BackendConfig`` and
    the policy), its settings dataclass, and what the rest of treeroll needs to know of it."""

    build: BackendBuilder
    _: dataclasses.KW_ONLY  # every other field by name: a record grows without reordering
    streams: bool = False
    """Whether what it builds is a :class:`~treeroll.base.StreamingBackend` (the config check
    refuses ``--rollout.continuous`` with one that is not, before anything is built)."""
    settings: type | None = None
    """The backend's settings dataclass, its ``backend.<name>`` block (None: none)."""
    in_process: bool = False
    """Whether it decodes with the trainer's own model object in this process (a lagged
    behaviour policy, ``optim.behaviour_lag``, needs a second such copy)."""
    tokenizer: Callable[[], Any] | None = None
    """For a backend that acts without a policy (a scripted agent: built with ``policy``
    None), the tokenizer its prompts are encoded with; None for one that runs a policy."""


BACKENDS: Registry[BackendSpec] = Registry("backend")
"""Backend name -> :class:`BackendSpec`."""


def register_backend(name: str, build: BackendBuilder, **spec: Any) -> BackendSpec:
    """Register backend ``name`` (the fields of :class:`BackendSpec` as keywords)."""
    return BACKENDS.register(name, BackendSpec(build, **spec))


def _hf_backend(config: BackendConfig, policy: PolicyParts | None) -> GenerationBackend:
    from treeroll.backends.hf import HFBackend

    hf, policy = config.hf, _policy(policy, "hf")
    return HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0,
                     max_batch_size=hf.max_batch_size, max_cached_tokens=hf.max_cached_tokens,
                     use_prefix_cache=hf.use_prefix_cache, keep_logits=hf.keep_logits,
                     replay=hf.replay, max_kept_logits_bytes=hf.max_kept_logits_mib * 2**20,
                     join_fraction=hf.join_fraction, join_wait=hf.join_wait)


register_backend("hf", _hf_backend, streams=True, settings=HFBackendConfig, in_process=True)


def _llamacpp_backend(config: BackendConfig, policy: PolicyParts | None) -> GenerationBackend:
    from treeroll.backends.llamacpp import LlamaCppBackend, ManagedLlamaCpp

    c, policy = config.llamacpp, _policy(policy, "llamacpp")
    if c.url is not None:
        return LlamaCppBackend(c.url, concurrency=c.slots, share_prompts=c.share_prompts,
                               eog_token_ids=(int(policy.tokenizer.eos_token_id),),
                               vocab_size=len(policy.tokenizer))
    return ManagedLlamaCpp(policy.model, policy.tokenizer, slots=c.slots,
                           ctx_per_slot=c.ctx_per_slot, threads=c.threads,
                           cache_ram_mib=c.cache_ram_mib, share_prompts=c.share_prompts)


CPU_BLOCK_SIZE = 32
"""``backend.vllm.block_size`` when unset on a machine without CUDA (the CPU engine)."""


def torch_cuda_available() -> bool:
    """Whether torch sees a CUDA device (vLLM then runs its GPU engine)."""
    import torch

    return bool(torch.cuda.is_available())


def _vllm_backend(config: BackendConfig, policy: PolicyParts | None) -> GenerationBackend:
    import os
    import tempfile

    from treeroll.backends.vllm import VLLMBackend, make_llm

    policy = _policy(policy, "vllm")
    folder = tempfile.mkdtemp(prefix="treeroll-vllm-")  # vLLM loads a folder
    policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    c = config.vllm
    dtype = str(policy.model.dtype).removeprefix("torch.") if c.dtype == "auto" else c.dtype
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(c.cpu_kvcache_gib))
    block = c.block_size
    cpu = not torch_cuda_available()
    if block is None and cpu:
        block = CPU_BLOCK_SIZE
    extra: dict[str, object] = {} if block is None else {"block_size": block}
    if cpu:
        # vLLM's model runner rewinds a seeded request's generator after sampling a partial
        # (chunked) prefill, relying on CUDA generators' offsets (vllm-project/vllm#10097):
        # on the CPU that raises "CPU Generator does not use offset" once a batch's prompts
        # overflow one step's token budget. treeroll seeds every request, so on the CPU a
        # prompt is prefilled whole (one step then takes up to max_model_len tokens)
        extra["enable_chunked_prefill"] = False
    return VLLMBackend(make_llm(folder, gpu_memory_utilization=c.gpu_memory_utilization,
                                dtype=dtype, max_model_len=c.max_model_len,
                                enforce_eager=c.enforce_eager, **extra))


def _sglang_backend(config: BackendConfig, policy: PolicyParts | None) -> GenerationBackend:
    from treeroll.backends.sglang import SGLangBackend

    return SGLangBackend(config.sglang.url, model=None if policy is None else policy.model)


def _swe_scripted_backend(config: BackendConfig, policy: PolicyParts | None
                          ) -> GenerationBackend:
    from treeroll.envs.swe import ScriptedSWEAgent, builtin_tasks

    return ScriptedSWEAgent(builtin_tasks())


def _byte_tokenizer() -> Any:
    from treeroll.formatting import ByteTokenizer

    return ByteTokenizer()


register_backend("swe_scripted", _swe_scripted_backend,
                 tokenizer=_byte_tokenizer)  # the SWE env's actor (no policy): its EnvSpec
register_backend("llamacpp", _llamacpp_backend, settings=LlamaCppBackendConfig)
register_backend("vllm", _vllm_backend, settings=VLLMBackendConfig)
register_backend("sglang", _sglang_backend, settings=SGLangBackendConfig)


# installed packages' own
BACKENDS.load_entry_points("treeroll.backends", record=BackendSpec)


@dataclass
class BackendSection:
    """What generates the rollouts."""

    name: str = "hf"
    """``hf`` (transformers, in process), ``llamacpp``, ``vllm``, ``sglang`` or
    ``package.module:builder`` (called with the policy and ``options``; returns a
    GenerationBackend)."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own backend: its config block, ``KEY VALUE`` pairs on the command line or a
    mapping in YAML, each value read as YAML; given to the builder as keywords."""


if TYPE_CHECKING:  # what plugin_section makes, as the type checker sees the built-ins
    @dataclass
    class BackendConfig(BackendSection):
        hf: HFBackendConfig = field(default_factory=HFBackendConfig)
        llamacpp: LlamaCppBackendConfig = field(default_factory=LlamaCppBackendConfig)
        vllm: VLLMBackendConfig = field(default_factory=VLLMBackendConfig)
        sglang: SGLangBackendConfig = field(default_factory=SGLangBackendConfig)
else:
    BackendConfig = plugin_section(BackendSection, {
        name: spec.settings for name in BACKENDS
        if (spec := BACKENDS.get(name)).settings is not None}, "BackendConfig")


def backend_streams(name: str) -> bool | None:
    """Whether the backend registered as ``name`` decodes continuously
    (:class:`~treeroll.base.StreamingBackend`); None for a user's ``package.module:builder``,
    known only once built (``rollout()`` checks the built backend)."""
    return BACKENDS.get(name).streams if name in BACKENDS else None


def make_backend(backend_config: BackendConfig, policy: PolicyParts | None) -> GenerationBackend:
    """The backend named by ``backend_config.name`` for ``policy``; a user's
    ``package.module:builder`` is called with the policy and its ``options`` block."""
    plugin = BACKENDS.get(backend_config.name)  # registered, or a user's loaded builder
    if isinstance(plugin, BackendSpec):
        return plugin.build(backend_config, policy)
    made: GenerationBackend = build_user_plugin(plugin, backend_config.options, "backend",
                                                policy)
    return made


def sync_weights(backend: GenerationBackend, model: CausalLM) -> None:
    """After an update: an :class:`~treeroll.base.UpdatableBackend` loads the model's new
    weights (and forgets its cache); any other backend, which must share the model object in
    process, only forgets its cache."""
    if isinstance(backend, UpdatableBackend):
        backend.load_weights(model.state_dict())
    else:
        backend.reset_cache()
