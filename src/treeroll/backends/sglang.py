"""Generation through an SGLang server's native ``/generate``: token ids in, ids and logprobs
out.

SGLang runs on GPUs only here; this module's requests and its reading of the answers are
tested on CPU against a fake server with SGLang's shapes and semantics
(``tests/test_engine_backends.py``), and ``bench/gpu_engines.sh`` runs it on a real GPU.
Written against SGLang 0.5.23; the facts it relies on:

- ``/generate`` takes a batch: ``input_ids`` (a list of id lists) with one
  ``sampling_params`` per prompt (``max_new_tokens``, ``temperature``, ``top_p``,
  ``stop_token_ids``, ``sampling_seed``), ``return_logprob`` and ``top_logprobs_num``, and
  answers one object per prompt with ``output_ids`` and ``meta_info``;
- ``meta_info.cached_tokens`` counts prompt tokens served from the radix cache,
  ``meta_info.output_token_logprobs`` holds ``(logprob, id, text)`` per sampled token,
  ``meta_info.output_top_logprobs`` a list per position (``None`` where there is none), and
  ``meta_info.finish_reason.type`` is ``stop`` or ``length``;
- SGLang honours ``sampling_seed`` only when the server runs with
  ``--enable-deterministic-inference`` (``sampling/sampling_batch_info.py``), which
  ``/server_info`` reports (the flat ``enable_deterministic_inference`` of the resolved server
  arguments; ``/get_server_info``, deprecated in 0.5.23, answers the same and is asked when
  ``/server_info`` is missing); that mode forces the pytorch sampler and, on some attention
  backends, disables the radix cache (``cached_tokens`` then stays 0). treeroll checks it
  before the first seeded request and refuses seeds the server would ignore (``seeded=False``
  sends none and promises no reproducibility);
- ``meta_info.output_token_logprobs`` are after temperature (unless the server runs with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``: do not set it for RL) but **before top-p, top-k and
  min-p** (``layers/sampler.py``): the distribution sampled from only when ``top_p = 1``. For
  ``top_p < 1`` treeroll asks ``return_sampling_mask`` and reads
  ``meta_info.output_token_sampling_logprobs``, the sampled token's logprob under the
  truncated distribution (SGLang 0.5.23; a server that does not return it is an error);
- weights: ``/update_weights_from_disk`` with a folder in transformers format, then
  ``/flush_cache``, which empties the radix cache.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treeroll.backends.http import ServerError, get_json, post_json, post_text
from treeroll.backends.weights import take_weights
from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.causal_lm import CausalLM

__all__ = ["SGLangBackend"]


def _truncated(params: SamplingParams) -> bool:
    """Whether the sampling distribution is truncated (top-p below 1 at a positive
    temperature), so that SGLang's ``output_token_logprobs`` are not its logprobs."""
    return params.top_p < 1 and params.temperature > 0


def _pairs(entries: Sequence[Any]) -> list[tuple[int, float]]:
    """``(id, logprob)`` from SGLang's ``(logprob, id, text)`` tuples or dict entries
    (``None`` entries, which SGLang leaves where it has nothing, are skipped)."""
    out = []
    for e in entries:
        if e is None:
            continue
        if isinstance(e, dict):
            out.append((int(e["token_id"]), float(e["logprob"])))
        else:
            out.append((int(e[1]), float(e[0])))
    return out


class SGLangBackend:
    """A :class:`~treeroll.base.UpdatableBackend` over an SGLang server at ``url``.

    ``model``: the policy object whose weights the server should follow; ``load_weights``
    writes it with ``save_pretrained`` under ``weights_dir`` (a temporary folder by default)
    and asks the server to load that folder. Without it, the server's weights are the
    caller's business and only ``reset_cache`` applies.

    ``seeded``: send each request's seed, after checking once that the server honours seeds
    (``--enable-deterministic-inference``); False sends none (no reproducibility promised).
    """

    def __init__(self, url: str, *, model: CausalLM | None = None,
                 weights_dir: str | Path | None = None, timeout: float = 600.0,
                 seeded: bool = True) -> None:
        self.url = url.rstrip("/")
        self.seeded = seeded
        self._deterministic: bool | None = None  # what /get_server_info said, once asked
        self.model = model
        self.weights_dir = Path(weights_dir) if weights_dir else None
        self.timeout = timeout
        self.weight_version = 0
        self.stats = {"prefill": 0, "cached": 0, "generated": 0, "requests": 0}

    def payload(self, requests: Sequence[GenerationRequest],
                params: SamplingParams) -> dict[str, Any]:
        """The ``/generate`` body for a batch of requests."""
        sampling = []
        for r in requests:
            cap = params.max_new_tokens if r.max_new_tokens is None else \
                min(params.max_new_tokens, r.max_new_tokens)
            one: dict[str, Any] = {"max_new_tokens": cap, "temperature": params.temperature,
                                   "top_p": params.top_p, "top_k": -1, "min_p": 0.0,
                                   "stop_token_ids": list(params.stop_token_ids),
                                   "skip_special_tokens": False, "no_stop_trim": True}
            if r.seed is not None and self.seeded:
                one["sampling_seed"] = r.seed % 2**63
            sampling.append(one)
        body = {"input_ids": [list(r.prompt_ids) for r in requests],
                "sampling_params": sampling, "return_logprob": True,
                "top_logprobs_num": params.top_logprobs, "logprob_start_len": -1,
                "stream": False}
        if _truncated(params):  # the sampled tokens' logprobs under the truncated distribution
            body["return_sampling_mask"] = True
        return body

    def completion(self, answer: dict[str, Any], request: GenerationRequest,
                   params: SamplingParams) -> Completion:
        """A :class:`~treeroll.base.Completion` from one answer of the batch."""
        tokens = [int(t) for t in answer.get("output_ids") or ()]
        meta = answer.get("meta_info") or {}
        sampled = _pairs(meta.get("output_token_logprobs") or ())
        if [i for i, _ in sampled] != tokens:
            raise ServerError(f"{self.url}/generate: output_token_logprobs do not match "
                              f"output_ids ({len(sampled)} entries for {len(tokens)} ids)")
        logprobs = [lp for _, lp in sampled]
        if _truncated(params):
            behaviour = meta.get("output_token_sampling_logprobs")
            if not isinstance(behaviour, list) or len(behaviour) != len(tokens):
                raise ServerError(f"{self.url}/generate returned no output_token_sampling_"
                                  f"logprobs for top_p {params.top_p} (SGLang 0.5.23 does with "
                                  "return_sampling_mask): its output_token_logprobs are taken "
                                  "before top-p; use top_p = 1 with this server")
            logprobs = [float(lp) for lp in behaviour]
        finish = (meta.get("finish_reason") or {}).get("type")
        if finish not in ("stop", "length"):
            raise ServerError(f"{self.url}/generate finished a request with {finish!r}")
        cached = min(int(meta.get("cached_tokens", 0)), len(request.prompt_ids))
        prefill = len(request.prompt_ids) - cached
        self.stats["prefill"] += prefill
        self.stats["cached"] += cached
        self.stats["generated"] += len(tokens)
        self.stats["requests"] += 1
        tops = [[] if step is None else _pairs(step)  # None: SGLang had none there
                for step in meta.get("output_top_logprobs") or ()] \
            if params.top_logprobs else None
        return Completion(token_ids=tokens,
                          logprobs=[0.0 if params.temperature == 0 else lp
                                    for lp in logprobs],
                          finish_reason=finish, prefill_tokens=prefill, cached_tokens=cached,
                          top_logprobs=tops)

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        """Sample one continuation per request in one ``/generate`` call; request order."""
        if params.entropy_window:
            raise ValueError("the SGLang backend reports no entropy (ARPO's entropy_window); "
                             "use the hf backend for ARPO")
        if not requests:
            return []
        self._check(requests, params)
        answer = post_json(self.url + "/generate", self.payload(requests, params),
                           timeout=self.timeout)
        answers = answer if isinstance(answer, list) else [answer]
        if len(answers) != len(requests):
            raise ServerError(f"{self.url}/generate answered {len(answers)} completions for "
                              f"{len(requests)} prompts")
        return [self.completion(a, r, params) for a, r in zip(answers, requests, strict=True)]

    def _check(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> None:
        """Refuse what SGLang would silently do otherwise: seeds a server that is not
        deterministic ignores, requests its sampling parameters refuse."""
        for r in requests:  # (a negative temperature never gets here: SamplingParams)
            if r.max_new_tokens is not None and r.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens {r.max_new_tokens}: SGLang needs >= 0")
        if self.seeded and any(r.seed is not None for r in requests):
            if self._deterministic is None:
                self._deterministic = bool(self.server_info().get(
                    "enable_deterministic_inference"))
            if not self._deterministic:
                raise ValueError(f"{self.url} ignores sampling_seed: SGLang honours seeds only "
                                 "with --enable-deterministic-inference (which forces the "
                                 "pytorch sampler and may disable the radix cache); start the "
                                 "server with it, or make the backend with seeded=False "
                                 "(samples are then not reproducible)")

    def server_info(self) -> dict[str, Any]:
        """The server's resolved arguments: ``/server_info``, or the deprecated
        ``/get_server_info`` where the first is missing (an older SGLang)."""
        try:
            info = get_json(self.url + "/server_info", timeout=self.timeout)
        except ServerError as err:
            if "HTTP 404" not in str(err):
                raise
            info = get_json(self.url + "/get_server_info", timeout=self.timeout)
        return info if isinstance(info, dict) else {}

    def reset_cache(self) -> None:
        """Empty the server's radix cache (``/flush_cache``, which answers in prose and with
        an HTTP error when requests are still running: that error is raised)."""
        post_text(self.url + "/flush_cache", {}, timeout=self.timeout)

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Write ``model`` with these weights to a new folder, have the server load it
        (``/update_weights_from_disk``) and flush its cache."""
        if self.model is None:
            raise ValueError("SGLangBackend.load_weights needs the model (pass model=...) "
                             "to write the weights in transformers format")
        take_weights(self.model, state_dict)
        self.weight_version += 1
        root = self.weights_dir or Path(tempfile.mkdtemp(prefix="treeroll-sglang-"))
        self.weights_dir = root
        folder = root / f"v{self.weight_version}"
        self.model.save_pretrained(folder)
        self._post("/update_weights_from_disk", {"model_path": str(folder)})
        self.reset_cache()

    def _post(self, path: str, body: dict[str, Any]) -> None:
        answer = post_json(self.url + path, body, timeout=self.timeout)
        if isinstance(answer, dict) and answer.get("success") is False:
            raise ServerError(f"{self.url}{path} failed: {answer.get('message', answer)}")
