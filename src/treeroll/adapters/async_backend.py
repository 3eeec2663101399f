"""A treeroll backend over a trainer's own asynchronous, token-in / token-out engine.

verl's agent loops and rLLM's workflows are coroutines on an event loop, and their inference
engines are reached by awaiting one request at a time. treeroll's engine is synchronous, so an
adapter runs it in a worker thread (``asyncio.to_thread``) and gives it an
:class:`AsyncTokenBackend`: each ``generate`` call sends its requests to the event loop
(``run_coroutine_threadsafe``) and waits for all of them together, so the trainer's server
sees them concurrently and batches them. Subclasses say how one request is sent
(:meth:`AsyncTokenBackend.send`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from treeroll.base import Completion, GenerationRequest, SamplingParams

__all__ = ["AsyncTokenBackend"]


class AsyncTokenBackend:
    """Base of the adapters' backends: ``generate`` waits on the event loop ``loop`` for one
    :meth:`send` per request. Prefix reuse is the trainer's engine's own (vLLM's prefix
    cache, SGLang's radix tree); it is not reported back, so ``cached_tokens`` is 0 and
    ``prefill_tokens`` the whole prompt. ``requests`` counts the requests sent."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.requests = 0

    async def send(self, request: GenerationRequest, params: SamplingParams) -> Any:
        """Send one request; return an object with ``token_ids`` and ``log_probs``."""
        raise NotImplementedError

    @staticmethod
    def options(request: GenerationRequest, params: SamplingParams) -> dict[str, Any]:
        """The request's sampling options in the vLLM / SGLang spelling both trainers pass
        on: ``temperature``, ``top_p``, ``max_tokens``, ``stop_token_ids``, ``seed``."""
        out: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p,
                               "max_tokens": request.max_new_tokens or params.max_new_tokens}
        if params.stop_token_ids:
            out["stop_token_ids"] = list(params.stop_token_ids)
        if request.seed is not None:
            out["seed"] = int(request.seed) % 2**31
        return out

    async def _all(self, requests: Sequence[GenerationRequest],
                   params: SamplingParams) -> list[Any]:
        return list(await asyncio.gather(*(self.send(r, params) for r in requests)))

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        """Send every request and wait for all of them (called from the engine's thread)."""
        outputs = asyncio.run_coroutine_threadsafe(self._all(requests, params),
                                                   self.loop).result()
        self.requests += len(requests)
        completions = []
        for request, output in zip(requests, outputs, strict=True):
            ids = [int(t) for t in output.token_ids]
            logprobs = output.log_probs
            if logprobs is None or len(logprobs) != len(ids):
                got = "none" if logprobs is None else str(len(logprobs))
                stop = getattr(output, "stop_reason", None)
                raise ValueError(f"{type(self).__name__}: the engine returned {len(ids)} tokens "
                                 f"and {got} logprobs (stop reason {stop!r}); trees record a "
                                 "sampling logprob per token: check the engine's logprob "
                                 "settings, or whether the request was aborted")
            stopped = bool(ids) and ids[-1] in params.stop_token_ids
            completions.append(Completion(token_ids=ids, logprobs=[float(x) for x in logprobs],
                                          finish_reason="stop" if stopped else "length",
                                          prefill_tokens=len(request.prompt_ids)))
        return completions

    def reset_cache(self) -> None:
        """Nothing to do: the trainer flushes its engine's cache when it syncs weights."""
