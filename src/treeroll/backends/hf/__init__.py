"""The embedded transformers backend: :class:`HFBackend` (:mod:`~treeroll.backends.hf.backend`)
with its batched decode (:mod:`~treeroll.backends.hf.decode`), the growing KV cache
(:mod:`~treeroll.backends.hf.cache`) and the KV-cache trie
(:mod:`~treeroll.backends.hf.kv_trie`)."""

from treeroll.backends.hf.backend import HFBackend
from treeroll.backends.hf.kv_trie import KVTrie

__all__ = ["HFBackend", "KVTrie"]
