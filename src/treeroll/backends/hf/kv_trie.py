"""The KV-cache trie of the embedded backend (:class:`treeroll.backends.hf.HFBackend`).

Every sequence the backend has run leaves its keys and values in a radix trie keyed by token
ids (the idea of SGLang's RadixAttention, at token granularity, on the CPU); a request
continues the longest cached prefix of its prompt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["KV", "KVTrie"]

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys, values)``, each ``[heads, tokens, head_dim]``."""


@dataclass(eq=False)
class _TrieNode:
    tokens: tuple[int, ...]
    kv: KV
    parent: _TrieNode | None
    children: dict[int, _TrieNode] = field(default_factory=dict)
    last_used: float = 0.0


class KVTrie:
    """A radix trie of token ids whose edges hold the KV tensors of their tokens.

    Each token's keys and values are stored once, however many sequences share it.
    ``max_tokens`` bounds the stored tokens; least recently used leaves are evicted first.
    """

    def __init__(self, max_tokens: int = 2_000_000) -> None:
        self.root = _TrieNode(tokens=(), kv=[], parent=None)
        self.max_tokens = max_tokens
        self.num_tokens = 0

    def match_pieces(self, ids: Sequence[int]) -> tuple[int, list[KV]]:
        """Longest cached prefix of ``ids``: its length and its KV as the trie's pieces, in
        order (one per edge walked; views, nothing copied)."""
        node, pos = self.root, 0
        pieces: list[KV] = []
        now = time.monotonic()
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            common = _common_length(child.tokens, ids, pos)
            child.last_used = now
            if common < len(child.tokens):
                pieces.append([(k[:, :common], v[:, :common]) for k, v in child.kv])
                pos += common
                break
            pieces.append(child.kv)
            pos += common
            node = child
        return pos, pieces

    def match(self, ids: Sequence[int]) -> tuple[int, KV]:
        """Longest cached prefix of ``ids``: its length and its KV (concatenated per layer)."""
        pos, pieces = self.match_pieces(ids)
        if not pieces:
            return 0, []
        if len(pieces) == 1:
            return pos, pieces[0]
        layers = len(pieces[0])
        kv = [(torch.cat([p[layer][0] for p in pieces], dim=1),
               torch.cat([p[layer][1] for p in pieces], dim=1)) for layer in range(layers)]
        return pos, kv

    def match_length(self, ids: Sequence[int]) -> int:
        """Length of the longest cached prefix of ``ids`` (no KV gathered, no use recorded)."""
        node, pos = self.root, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            common = _common_length(child.tokens, ids, pos)
            pos += common
            if common < len(child.tokens):
                break
            node = child
        return pos

    def insert(self, ids: Sequence[int], kv: KV) -> None:
        """Store ``ids`` whose KV (every position of ``ids``) is ``kv``; shared parts once."""
        node, pos = self.root, 0
        now = time.monotonic()
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            common = _common_length(child.tokens, ids, pos)
            child.last_used = now
            if common < len(child.tokens):
                child = self._split(child, common)
            pos += common
            node = child
        if pos < len(ids):
            new = _TrieNode(tokens=tuple(ids[pos:]),
                            kv=[(k[:, pos:].clone(), v[:, pos:].clone()) for k, v in kv],
                            parent=node, last_used=now)
            node.children[ids[pos]] = new
            self.num_tokens += len(new.tokens)
        if self.num_tokens > self.max_tokens:
            self._evict()

    def _split(self, child: _TrieNode, at: int) -> _TrieNode:
        parent = child.parent
        assert parent is not None
        middle = _TrieNode(tokens=child.tokens[:at], parent=parent, last_used=child.last_used,
                           kv=[(k[:, :at], v[:, :at]) for k, v in child.kv])
        child.tokens = child.tokens[at:]
        child.kv = [(k[:, at:], v[:, at:]) for k, v in child.kv]
        child.parent = middle
        middle.children[child.tokens[0]] = child
        parent.children[middle.tokens[0]] = middle
        return middle

    def _evict(self) -> None:
        leaves = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node is not self.root:
                leaves.append(node)
        leaves.sort(key=lambda n: n.last_used)
        target = self.max_tokens * 3 // 4
        for leaf in leaves:
            if self.num_tokens <= target:
                break
            assert leaf.parent is not None
            del leaf.parent.children[leaf.tokens[0]]
            self.num_tokens -= len(leaf.tokens)

    def nbytes(self) -> int:
        """Bytes of key and value storage the trie holds (shared storages counted once)."""
        seen: dict[int, int] = {}
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for keys, values in node.kv:
                for tensor in (keys, values):
                    storage = tensor.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def clear(self) -> None:
        """Drop everything."""
        self.root = _TrieNode(tokens=(), kv=[], parent=None)
        self.num_tokens = 0


def _common_length(edge: tuple[int, ...], ids: Sequence[int], start: int) -> int:
    n = min(len(edge), len(ids) - start)
    i = 0
    while i < n and edge[i] == ids[start + i]:
        i += 1
    return i
