"""A KV cache for the embedded backend's decode batches that appends without copying.

transformers' ``DynamicLayer.update`` concatenates each step's key/value onto the cache, which
copies the whole cache on every decode step (O(length) per token; 13-14% of a quick
FrozenLake or SWE rollout's wall time on the 2-core CPU, measured with cProfile: ``torch.cat``).
Its ``StaticLayer`` preallocates ``max_cache_len`` for every row, which a decode batch whose
rows come from the trie with mixed lengths (and that rows join and leave) cannot size in
advance. :class:`GrowingLayer` is a ``DynamicLayer`` whose keys and values are views of a
buffer with spare room at the end: a step writes into the room (no copy); a full buffer is
reallocated with ``max(64, length / 8)`` positions to spare (amortised O(1) per token, at most
an eighth more memory). Dropping leading positions (:meth:`GrowingLayer.drop_front`) and
selecting rows keep the buffer. The values the model sees are the same tensors, so the
samples are the same (a test rolls out the same trees either way).

Written here because transformers has no growable dynamic layer (5.x: ``DynamicLayer``,
``StaticLayer``, their sliding-window variants, and offloading ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["GrowingLayer", "growing_cache", "room_for"]

_MIN_ROOM = 64


def room_for(length: int) -> int:
    """Positions a buffer holding ``length`` gets: ``length`` plus ``max(64, length / 8)``
    spare (a caller that builds a cache allocates this many, and the layer adopts it)."""
    return length + max(_MIN_ROOM, length // 8)


class GrowingLayer(DynamicLayer):
    """A cache layer whose ``keys``/``values`` ([batch, heads, length, dim]) are views of
    buffers with room to append; anything that replaces ``keys`` from outside (a crop, a
    reorder) is adopted on the next :meth:`update` by one copy into a fresh buffer."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._view: torch.Tensor | None = None  # the keys this layer last handed out
        self._start = 0
        self._end = 0

    def _owns_view(self) -> bool:
        return self._key_buffer is not None and self.keys is self._view

    def _set_view(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._key_buffer is not None and self._value_buffer is not None
        keys = self._key_buffer[:, :, self._start:self._end]
        values = self._value_buffer[:, :, self._start:self._end]
        self.keys, self.values, self._view = keys, values, keys
        return keys, values

    def _held(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` ([batch, heads, new, dim]); return the
        whole cache (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if not self._owns_view() or self._end + new > self._capacity():
            self._reallocate(key_states, value_states, new)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, self._end:self._end + new] = key_states
        self._value_buffer[:, :, self._end:self._end + new] = value_states
        self._end += new
        return self._set_view()

    def _capacity(self) -> int:
        return 0 if self._key_buffer is None else self._key_buffer.shape[2]

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor,
                    new: int) -> None:
        """A fresh buffer holding the current keys/values, with room for ``new`` and more."""
        old_keys, old_values = self._held()
        held = old_keys.shape[-2] if old_keys.numel() else 0
        room = room_for(held + new)
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_empty(batch, heads, room, dim)
        values = value_states.new_empty(batch, heads, room, value_states.shape[-1])
        if held:
            keys[:, :, :held] = old_keys
            values[:, :, :held] = old_values
        self._key_buffer, self._value_buffer = keys, values
        self._start, self._end = 0, held

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Hold ``keys``/``values`` ([batch, heads, capacity, dim], their first ``length``
        positions filled) as this layer's buffers, without copying them."""
        if keys.shape[2] < length or values.shape[2] < length:
            raise ValueError(f"buffers of {keys.shape[2]} positions cannot hold {length}")
        self.lazy_initialization(keys, values)
        self._key_buffer, self._value_buffer = keys, values
        self._start, self._end = 0, length
        self._set_view()

    def drop_front(self, positions: int) -> None:
        """Forget the first ``positions`` positions of every row (no copy)."""
        if self._owns_view():
            self._start += positions
            self._set_view()
        else:
            keys, values = self._held()
            self.keys, self.values = keys[:, :, positions:], values[:, :, positions:]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (the buffer's room is kept)."""
        if not self._owns_view():
            super().batch_select_indices(indices)
            return
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self._set_view()


def growing_cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
                  length: int | None = None) -> DynamicCache:
    """A ``DynamicCache`` of :class:`GrowingLayer` holding ``layers`` (one ``(keys, values)``
    per model layer; empty: the layers are made by the first forward). With ``length``, the
    tensors are buffers whose first ``length`` positions are filled (allocate
    :func:`room_for` positions): they are adopted, not copied."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    for keys, values in layers:
        layer = GrowingLayer()
        if length is None:
            layer.update(keys, values)
        else:
            layer.adopt(keys, values, length)
        cache.layers.append(layer)
    return cache
