"""llama.cpp: :class:`LlamaCppBackend` for a running ``llama-server`` and :class:`ManagedLlamaCpp`,
which writes the policy as GGUF (:mod:`~treeroll.backends.llamacpp.gguf`) and runs the server
it builds (:mod:`~treeroll.backends.llamacpp.server`)."""

from treeroll.backends.llamacpp.backend import LlamaCppBackend, ManagedLlamaCpp, managed, remote

__all__ = ["LlamaCppBackend", "ManagedLlamaCpp", "managed", "remote"]
