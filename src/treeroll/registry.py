"""Explicit registries of built-in plug-ins.

Every built-in is registered in this one module (no registration by import side effect). A
duplicate name raises; an unknown name lists the valid ones; ``package.module:object`` loads a
user's own plug-in from its import path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "load_object"]

T = TypeVar("T")


def load_object(spec: str) -> object:
    """Import ``package.module:attribute``; errors say what was wrong with ``spec``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{spec!r} is not of the form 'package.module:object'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} from {spec!r}: {err}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None


class Registry(Generic[T]):
    """Name -> plug-in, for one kind of plug-in (``kind`` appears in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``; a name may be registered once."""
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        """The plug-in called ``name``, or one loaded from ``package.module:object``."""
        if name in self._items:
            return self._items[name]
        if ":" in name:
            return load_object(name)  # type: ignore[return-value]
        raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}"
                         " (or 'package.module:object' for your own)")

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def validate_choice(kind: str, name: str, valid: Callable[[], list[str]]) -> None:
    """Raise a clear error unless ``name`` is one of ``valid()`` or an import path."""
    if ":" not in name and name not in valid():
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(valid())}")
