"""The decode batch of the embedded backend (:class:`treeroll.backends.hf.HFBackend`).

A :class:`DecodeBatch` holds the requests being decoded together: one left-padded KV cache
with a row per distinct history, the attention mask, each row's next position and the logits
its next token is sampled from. :meth:`DecodeBatch.step` samples one token for every request,
stores the finished ones' KV in the trie and forwards the continuing rows one token;
:meth:`DecodeBatch.join` adds freshly prefilled requests to a batch already decoding
(continuous batching: a request need not wait for the batch's longest reply to end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from treeroll.base import Completion, SamplingParams

__all__ = ["DecodeBatch", "DecodeHost", "Prefilled"]


class DecodeHost(Protocol):
    """What a :class:`DecodeBatch` needs of the backend that runs it (``HFBackend``): its
    forward, sampler, KV store and kept logits, declared here so that the batch does not
    import the backend that imports it."""

    use_prefix_cache: bool
    replay: bool
    stats: dict[str, int]

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: Any) -> torch.Tensor: ...

    def _sample(self, logits: torch.Tensor, rows: Any, params: SamplingParams) -> Any: ...

    def _keep(self, context: tuple[int, ...], logits: torch.Tensor) -> None: ...

    def _store(self, row: Any, cache: Any, mask: torch.Tensor, b: int) -> None: ...


@dataclass
class _Row:
    """One request being decoded."""

    index: int  # the caller's name for it: position in its request list, or a stream ticket
    prompt: tuple[int, ...]
    max_new: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    prefill: int = 0
    cached: int = 0
    shared: int = 0  # sampled tokens an earlier request of the call holds in the same context
    reused: int = 0  # sampled tokens, not its last, this request did not feed (kept logits)
    finish: str = ""

    @property
    def context(self) -> tuple[int, ...]:
        """The prompt and the tokens so far: before decoding, what the prefill continues
        (the tokens replayed from kept logits); while decoding, what the next forward feeds."""
        return self.prompt + tuple(self.tokens)

    def completion(self, params: SamplingParams) -> Completion:
        """What the caller gets back."""
        return Completion(
            token_ids=self.tokens, logprobs=self.logprobs, finish_reason=self.finish,
            prefill_tokens=self.prefill, cached_tokens=self.cached, shared_tokens=self.shared,
            reused_tokens=self.reused,
            entropy=(sum(self.entropies) / len(self.entropies)) if self.entropies else None,
            top_logprobs=self.top if params.top_logprobs else None)


@dataclass
class Prefilled:
    """Requests whose contexts were just prefilled: ``owner[i]`` is request ``i``'s row of
    ``cache`` / ``mask`` / ``next_pos`` / ``logits`` (requests with one context share one)."""

    rows: list[_Row]
    owner: list[int]
    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    logits: torch.Tensor


class DecodeBatch:
    """Requests decoded together, one batch row per distinct history (see the module
    docstring). Requests that sampled the same tokens from the same context share a row, so
    identical sibling turns are forwarded once, and a row is copied only where its requests'
    samples part. Each request samples with its own generator from its row's logits, so its
    tokens are those it would sample alone given those logits."""

    def __init__(self, backend: DecodeHost, params: SamplingParams) -> None:
        self.backend, self.params = backend, params
        self.rows: list[_Row] = []
        self.row_of: list[int] = []  # request -> batch row
        self.cache: Any = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)
        self.logits = torch.zeros(0, 0)

    @property
    def live(self) -> int:
        """Requests still decoding."""
        return len(self.rows)

    def join(self, new: Prefilled) -> None:
        """Add prefilled requests; both caches are left-padded to the longer past."""
        if not self.rows:
            self.rows, self.row_of = list(new.rows), list(new.owner)
            self.cache, self.mask = new.cache, new.mask
            self.next_pos, self.logits = new.next_pos, new.logits
            return
        from treeroll.backends.hf.cache import growing_cache, room_for  # imports transformers

        offset = self.mask.shape[0]
        past = max(self.mask.shape[1], new.mask.shape[1])
        layers = []
        for old_layer, new_layer in zip(self.cache.layers, new.cache.layers, strict=True):
            layers.append((_left_pad_cat(old_layer.keys, new_layer.keys, past, room_for(past)),
                           _left_pad_cat(old_layer.values, new_layer.values, past,
                                         room_for(past))))
        self.cache = growing_cache(layers, past)
        self.mask = torch.cat([_left_pad(self.mask, past), _left_pad(new.mask, past)])
        self.next_pos = torch.cat([self.next_pos, new.next_pos])
        self.logits = torch.cat([self.logits, new.logits])
        self.rows.extend(new.rows)
        self.row_of.extend(offset + b for b in new.owner)

    def _trim(self) -> None:
        """Drop the leading positions no row attends to (left padding left behind by rows
        that finished), so a long-running batch stays as wide as its longest live row."""
        used = self.mask.any(dim=0)
        first = int(used.int().argmax()) if bool(used.any()) else 0
        if first == 0:
            return
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.drop_front(first)

    def step(self) -> list[_Row]:
        """Sample one token for every request; forward the continuing rows one token.
        Returns the requests that finished (their KV stored in the trie)."""
        backend, params, rows = self.backend, self.params, self.rows
        tokens = backend._sample(self.logits[torch.tensor(self.row_of)], rows, params)
        following: dict[tuple[int, int], int] = {}  # (batch row, token) -> next batch row
        continuing: list[tuple[int, tuple[int, int]]] = []
        finished: list[_Row] = []
        stored: set[int] = set()
        for i, row in enumerate(rows):
            key = (self.row_of[i], int(tokens[i]))
            if key in following:
                row.shared += 1  # an earlier request holds this very token in this context
            else:
                following[key] = len(following)
            if row.tokens[-1] in params.stop_token_ids:
                row.finish = "stop"
            elif len(row.tokens) >= row.max_new:
                row.finish = "length"
            else:
                continuing.append((i, key))
                continue
            finished.append(row)
            if backend.use_prefix_cache and self.row_of[i] not in stored:
                stored.add(self.row_of[i])
                backend._store(row, self.cache, self.mask, self.row_of[i])
        if not continuing:
            self.rows, self.row_of = [], []
            return finished
        fed: dict[tuple[int, int], int] = {}  # the next batch: the continuing keys
        contexts: dict[int, tuple[int, ...]] = {}  # batch row -> the context it feeds
        row_of = []
        for i, key in continuing:
            row_of.append(fed.setdefault(key, len(fed)))
            if backend.replay and row_of[-1] not in contexts:
                contexts[row_of[-1]] = rows[i].context
        self.rows, self.row_of = [rows[i] for i, _ in continuing], row_of
        parents = [b for b, _ in fed]
        if parents != list(range(self.mask.shape[0])):
            select = torch.tensor(parents)
            self.cache.batch_select_indices(select)
            self.mask, self.next_pos = self.mask[select], self.next_pos[select]
        self._trim()
        self.mask = torch.cat([self.mask, torch.ones(len(fed), 1, dtype=self.mask.dtype)], dim=1)
        step = torch.tensor([token for _, token in fed])
        self.logits = backend._forward(step[:, None], self.mask, self.next_pos[:, None],
                                       self.cache)[:, -1]
        backend.stats["forward_tokens"] += len(fed)
        for b, context in contexts.items():
            backend._keep(context, self.logits[b])
        self.next_pos = self.next_pos + 1
        return finished


def _left_pad(mask: torch.Tensor, length: int) -> torch.Tensor:
    """``mask`` [batch, n] padded on the left with zeros to ``length`` columns."""
    return torch.cat([mask.new_zeros(mask.shape[0], length - mask.shape[1]), mask], dim=1)


def _left_pad_cat(old: torch.Tensor, new: torch.Tensor, length: int,
                  capacity: int) -> torch.Tensor:
    """Two ``[batch, heads, n, dim]`` caches stacked on the batch axis, each left-padded with
    zeros to ``length`` positions, in a buffer of ``capacity`` positions (room to append)."""
    out = old.new_zeros(old.shape[0] + new.shape[0], old.shape[1], capacity, old.shape[3])
    out[:old.shape[0], :, length - old.shape[2]:length] = old
    out[old.shape[0]:, :, length - new.shape[2]:length] = new
    return out
