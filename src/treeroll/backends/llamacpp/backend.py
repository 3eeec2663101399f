"""Generation through a llama.cpp server: token ids in, token ids and logprobs out.

:class:`LlamaCppBackend` talks to a running ``llama-server`` (``/completion`` with the
prompt as ids, ``return_tokens``, ``n_probs`` with ``post_sampling_probs``, ``seed``), one
HTTP request per sequence and ``concurrency`` of them in flight, which the server decodes
together in its slots. :class:`ManagedLlamaCpp` also owns the server: it writes the policy as
GGUF (:func:`treeroll.backends.llamacpp.gguf.export_gguf`), starts the process, and on a weight
update
writes the new weights and restarts it, so nothing cached under old weights can be served.

What the server is asked for, and why:

- sampler chain ``temperature`` then ``top_p`` (``top_k`` 0, ``min_p`` 0, no penalties):
  the distribution the transformers backend samples from; llama.cpp's default chain adds
  top-k 40, min-p 0.05 and penalties.
- ``post_sampling_probs``: each sampled id's probability under that distribution. Without it
  llama.cpp reports a softmax of the raw logits, before temperature (the mismatch TRL hit
  with vLLM's default logprobs).
- Accounting comes from the server's own counters: ``timings.cache_n`` prompt tokens served
  from the slot's KV, ``timings.prompt_n`` computed. A prompt entirely cached is re-fed its
  last token, so the two add up to the prompt's length, as the backend protocol asks.
- Greedy decoding (temperature 0) reports logprob 0: the point mass it samples from.

llama.cpp stops on its end-of-generation tokens only (the GGUF's EOS), so a request whose
``stop_token_ids`` are not among them is refused rather than run past its stop.
"""

from __future__ import annotations

import atexit
import math
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treeroll.backends.http import ServerError, get_json, map_concurrently, post_json
from treeroll.backends.llamacpp.gguf import export_gguf
from treeroll.backends.llamacpp.server import LlamaServer, server_binary, source_dir
from treeroll.backends.weights import take_weights
from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.causal_lm import CausalLM, PolicyParts

__all__ = ["LlamaCppBackend", "ManagedLlamaCpp", "managed", "remote"]

NEUTRAL_SAMPLING = {"top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
                    "xtc_probability": 0.0, "mirostat": 0}
"""Every llama.cpp sampler treeroll does not use, switched off."""


class LlamaCppBackend:
    """A :class:`~treeroll.base.GenerationBackend` over a running llama.cpp server at ``url``.

    ``concurrency``: requests in flight at once (match the server's ``-np`` slots).
    ``share_prompts``: send requests that continue the same prompt as one ``n_cmpl`` call
    (see :meth:`generate`).
    ``eog_token_ids``: the ids the server stops on (its GGUF's EOS/EOT); ``None`` trusts the
    caller's stop ids. ``vocab_size`` normalises the entropy ARPO asks for (see
    :meth:`generate`).
    """

    def __init__(self, url: str, *, concurrency: int = 8,
                 eog_token_ids: Sequence[int] | None = None, vocab_size: int | None = None,
                 share_prompts: bool = False, timeout: float = 600.0) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.url = url.rstrip("/")
        self.concurrency = concurrency
        self.eog_token_ids = None if eog_token_ids is None else frozenset(eog_token_ids)
        self.vocab_size = vocab_size
        self.share_prompts = share_prompts
        self.timeout = timeout
        self.stats = {"prefill": 0, "cached": 0, "generated": 0, "requests": 0}
        """Totals since construction, from the server's counters."""
        self._stats_lock = threading.Lock()  # answers are read on generate's threads

    # -- requests ------------------------------------------------------------------------------

    def payload(self, request: GenerationRequest, params: SamplingParams) -> dict[str, Any]:
        """The ``/completion`` body for one request."""
        cap = params.max_new_tokens if request.max_new_tokens is None else \
            min(params.max_new_tokens, request.max_new_tokens)
        n_probs = max(1, params.top_logprobs, 32 if params.entropy_window else 0)
        return {"prompt": list(request.prompt_ids), "n_predict": cap,
                "temperature": params.temperature, "top_p": params.top_p,
                "samplers": ["temperature", "top_p"], **NEUTRAL_SAMPLING,
                "seed": -1 if request.seed is None else request.seed % 2**32,
                "n_probs": n_probs, "post_sampling_probs": True, "return_tokens": True,
                "cache_prompt": True, "ignore_eos": False, "stream": False}

    def completion(self, response: dict[str, Any], request: GenerationRequest,
                   params: SamplingParams) -> Completion:
        """A :class:`~treeroll.base.Completion` from one ``/completion`` answer."""
        tokens = [int(t) for t in response.get("tokens") or ()]
        probs = response.get("completion_probabilities") or []
        if len(probs) != len(tokens):
            raise ServerError(f"{self.url}/completion returned {len(tokens)} tokens but "
                              f"{len(probs)} probabilities")
        logprobs, tops = [], []
        for token, entry in zip(tokens, probs, strict=True):
            if int(entry["id"]) != token:
                raise ServerError(f"{self.url}/completion: probability entry for id "
                                  f"{entry['id']} where token {token} was sampled")
            logprobs.append(0.0 if params.temperature == 0 else
                            math.log(max(float(entry["prob"]), 1e-45)))
            tops.append([(int(t["id"]), math.log(max(float(t["prob"]), 1e-45)))
                         for t in entry.get("top_probs", ())])
        stop_type = response.get("stop_type")
        if stop_type not in ("eos", "limit"):
            raise ServerError(f"{self.url}/completion stopped with stop_type {stop_type!r} "
                              "(expected 'eos' or 'limit')")
        timings = response.get("timings") or {}
        prefill, cached = int(timings.get("prompt_n", 0)), int(timings.get("cache_n", 0))
        with self._stats_lock:
            self.stats["prefill"] += prefill
            self.stats["cached"] += cached
            self.stats["generated"] += len(tokens)
            self.stats["requests"] += 1
        return Completion(
            token_ids=tokens, logprobs=logprobs,
            finish_reason="stop" if stop_type == "eos" else "length",
            prefill_tokens=prefill, cached_tokens=cached,
            entropy=self._entropy(tops, params.entropy_window) if params.entropy_window else
            None,
            top_logprobs=[t[:params.top_logprobs] for t in tops] if params.top_logprobs
            else None)

    def _entropy(self, tops: list[list[tuple[int, float]]], window: int) -> float | None:
        """Mean entropy of the first ``window`` positions, each from the server's top-32
        post-sampling probabilities (renormalised), over ``log(vocab_size)``: llama.cpp does
        not return whole distributions, so this is the entropy of their head."""
        values = []
        for top in tops[:window]:
            mass = sum(math.exp(lp) for _, lp in top)
            if mass <= 0:
                continue
            values.append(-sum(math.exp(lp) / mass * (lp - math.log(mass)) for _, lp in top))
        if not values:
            return None
        norm = math.log(self.vocab_size) if self.vocab_size else math.log(32)
        return sum(values) / len(values) / max(norm, 1e-9)

    def _check(self, params: SamplingParams) -> None:
        if self.eog_token_ids is not None and not set(params.stop_token_ids) <= \
                self.eog_token_ids:
            raise ValueError(f"stop_token_ids {sorted(params.stop_token_ids)}: llama.cpp "
                             f"stops only on its end-of-generation ids "
                             f"{sorted(self.eog_token_ids)}")

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        """Sample one continuation per request, ``concurrency`` requests in flight; results
        in request order.

        By default each request is its own ``/completion`` call, sampled by its own seed, so
        its tokens do not depend on the rest of the batch; requests continuing the same
        prompt (a branch point's children) then each compute it in their own slot. With
        ``share_prompts``, such requests go as one call with ``n_cmpl``: the server
        evaluates the prompt once and copies its KV to the other slots. llama.cpp seeds the
        i-th completion of such a call with the call's seed + i, so a grouped request's
        tokens then depend on its group's first seed (still the same for the same batch)."""
        self._check(params)
        requests = list(requests)
        calls: list[list[int]] = []
        if self.share_prompts:
            groups: dict[tuple[tuple[int, ...], int | None], list[int]] = {}
            for i, r in enumerate(requests):
                groups.setdefault((r.prompt_ids, r.max_new_tokens), []).append(i)
            for members in groups.values():
                calls += [members[j:j + self.concurrency]
                          for j in range(0, len(members), self.concurrency)]
        else:
            calls = [[i] for i in range(len(requests))]

        def call(members: list[int]) -> list[Completion]:
            first = requests[members[0]]
            body = self.payload(first, params)
            if len(members) > 1:
                body["n_cmpl"] = len(members)
            answer = post_json(self.url + "/completion", body, timeout=self.timeout)
            answers = sorted(answer, key=lambda a: int(a.get("index", 0))) \
                if isinstance(answer, list) else [answer]
            if len(answers) != len(members):
                raise ServerError(f"{self.url}/completion returned {len(answers)} "
                                  f"completions for n_cmpl {len(members)}")
            out = [self.completion(a, requests[i], params) for a, i in zip(answers, members,
                                                                             strict=True)]
            for child in out[1:]:  # its slot got the first one's KV (a copy, not computed);
                with self._stats_lock:  # the server copies the first one's counts
                    self.stats["prefill"] -= child.prefill_tokens
                    self.stats["cached"] += child.prefill_tokens
                child.cached_tokens += child.prefill_tokens
                child.prefill_tokens = 0
            return out

        done: list[Completion | None] = [None] * len(requests)
        for members, outs in zip(calls, map_concurrently(call, calls, self.concurrency),
                                 strict=True):
            for i, c in zip(members, outs, strict=True):
                done[i] = c
        return [c for c in done if c is not None]

    def reset_cache(self) -> None:
        """Erase every slot's KV (``POST /slots/<i>?action=erase``), which llama.cpp allows
        only on a server started with ``--slot-save-path DIR``; a server started with a
        host-memory prompt cache (``--cache-ram``, on by default) may still hold older
        prompts there. So a server whose weights change runs with ``--slot-save-path DIR
        --cache-ram 0``, or is a :class:`ManagedLlamaCpp`, which restarts its server."""
        for slot in get_json(self.url + "/slots", timeout=self.timeout):
            try:
                post_json(f"{self.url}/slots/{slot['id']}?action=erase", {},
                          timeout=self.timeout)
            except ServerError as e:
                if "HTTP 501" not in str(e):
                    raise
                raise ServerError(f"{self.url} cannot erase its slots (its cache would outlive "
                                  "a weight update): start llama-server with --slot-save-path "
                                  "DIR and --cache-ram 0") from None


class ManagedLlamaCpp(LlamaCppBackend):
    """A llama.cpp server treeroll starts for ``model`` (a transformers Llama) and
    ``tokenizer``, and restarts on every weight update (an
    :class:`~treeroll.base.UpdatableBackend`).

    The GGUF files live in ``workdir`` (a temporary folder by default), one per weight
    version; the process is stopped by :meth:`close`, on exit, or by ``with``. ``gguf``: a
    file to serve as it is until the first weight update (a registry model's own, e.g.
    SmolLM2's Q4_1: its logprobs are the quantised model's, not the float32 model's the
    trainer holds; ``bench/real_model.py`` measures the gap); every later version is the
    model's float32 weights.
    """

    def __init__(self, model: CausalLM, tokenizer: Any, *, workdir: str | Path | None = None,
                 slots: int = 8, ctx_per_slot: int = 2048, threads: int = 2,
                 cache_ram_mib: int = 1024, share_prompts: bool = False,
                 timeout: float = 600.0, gguf: str | Path | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.original = Path(gguf) if gguf else None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="treeroll-"
                                                                                 "gguf-"))
        self.version = 0
        self.server_options = {"slots": slots, "ctx_per_slot": ctx_per_slot,
                               "threads": threads, "cache_ram_mib": cache_ram_mib}
        self.server: LlamaServer | None = None
        super().__init__("http://127.0.0.1:0", concurrency=slots,
                         eog_token_ids=(int(tokenizer.eos_token_id),),
                         vocab_size=int(model.config.vocab_size), share_prompts=share_prompts,
                         timeout=timeout)
        self._start()
        atexit.register(self.close)

    def _start(self) -> None:
        server_binary()  # on a cold cache this fetches the sources the GGUF writer comes from
        if self.version == 0 and self.original is not None:
            path = self.original
        else:
            path = export_gguf(self.model, self.tokenizer,
                               self.workdir / f"policy-v{self.version}.gguf",
                               gguf_source=source_dir())
        self.server = LlamaServer(path, **self.server_options).start()  # type: ignore[arg-type]
        self.url = self.server.url

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Take these weights (copied into the model unless they are its own tensors), write
        them as a new GGUF version and restart the server on it: a fresh process has no KV
        and no prompt cache, so nothing from the old weights can be served."""
        take_weights(self.model, state_dict)
        self.reset_cache()

    def reset_cache(self) -> None:
        """Restart the server on the model's current weights (a new GGUF version)."""
        old = self.server.model if self.server else None
        self.close()
        self.version += 1
        self._start()
        if old is not None and old != self.original:
            old.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the server."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> ManagedLlamaCpp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def managed(policy: PolicyParts, **options: Any) -> ManagedLlamaCpp:
    """``--backend.name treeroll.backends.llamacpp:managed``: a llama.cpp server started for
    the policy (``--backend.options slots 8 threads 2 ...``). A registry policy's own GGUF
    (``treeroll.json``'s ``gguf``) is served as it is until the first update unless
    ``gguf`` is given (``--backend.options gguf ''`` writes the float32 weights from the
    start); each slot holds the model's positions (at most 8,192) unless ``ctx_per_slot`` is
    given."""
    source = (getattr(policy, "meta", None) or {}).get("gguf")  # a Policy has meta
    options.setdefault("gguf", source if source and Path(source).is_file() else None)
    positions = getattr(policy.model.config, "max_position_embeddings", None)
    if positions:  # room for the longest context the model takes (at most 8,192 a slot)
        options.setdefault("ctx_per_slot", min(int(positions), 8192))
    return ManagedLlamaCpp(policy.model, policy.tokenizer, **options)


def remote(policy: PolicyParts, url: str, **options: Any) -> LlamaCppBackend:
    """``--backend.name treeroll.backends.llamacpp:remote --backend.options url URL``: a
    llama.cpp server already running at ``url``, serving the policy's weights."""
    return LlamaCppBackend(url, eog_token_ids=(int(policy.tokenizer.eos_token_id),),
                           vocab_size=len(policy.tokenizer), **options)
