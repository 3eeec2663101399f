"""Explicit registries of built-in plug-ins.

Each kind of plug-in has one registry, in its own package (``treeroll.strategies.STRATEGIES``,
``treeroll.backends.BACKENDS``, ...), where the built-ins are registered explicitly. A duplicate
name raises; an unknown name lists the valid ones; ``package.module:object`` loads a user's own
plug-in from its import path; installed packages may add theirs through entry points.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "build_user_plugin", "load_object", "parse_options", "plugin_section"]

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

    def load_entry_points(self, group: str, *, record: type | None = None,
                          check: Callable[[Any], str | None] | None = None) -> None:
        """Register every plug-in that installed packages declare in the entry-point
        ``group`` (``[project.entry-points."treeroll.strategies"]`` in a package's
        ``pyproject.toml``: ``name = "package.module:Class"``). A plug-in that fails to load,
        that is not an instance of this kind's ``record`` type (an environment's ``EnvSpec``),
        that ``check`` finds wrong (it returns why), or whose name is taken is skipped with a
        warning saying why: one broken package never stops treeroll from starting."""
        import warnings
        from importlib.metadata import entry_points

        for point in entry_points(group=group):
            if point.name in self._items:
                warnings.warn(f"{self.kind} {point.name!r} from entry point {point.value!r} "
                              "skipped: the name is taken", stacklevel=2)
                continue
            try:
                obj = point.load()
            except Exception as err:  # a third-party package's bug: skip it, say so
                warnings.warn(f"{self.kind} {point.name!r} from entry point {point.value!r} "
                              f"skipped: it did not load ({type(err).__name__}: {err})",
                              stacklevel=2)
                continue
            if record is not None and not isinstance(obj, record):
                why: str | None = (f"a registered {self.kind} is a {record.__module__}."
                                   f"{record.__qualname__}, not {type(obj).__name__}")
            else:
                why = check(obj) if check is not None else None
            if why:
                warnings.warn(f"{self.kind} {point.name!r} from entry point {point.value!r} "
                              f"skipped: {why}", stacklevel=2)
                continue
            self.register(point.name, obj)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def parse_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A user plug-in's config block with each string value read as YAML (``3`` an int,
    ``[1, 2]`` a list, ``true`` a bool; text that is not YAML stays text)."""
    import yaml

    values: dict[str, Any] = {}
    for key, text in options.items():
        try:
            values[key] = yaml.safe_load(text) if isinstance(text, str) else text
        except yaml.YAMLError:
            values[key] = text
    return values


def build_user_plugin(obj: Any, options: Mapping[str, str], where: str, *args: Any,
                      parsed: bool = False) -> Any:
    """A user's plug-in (``package.module:object``) built from its own config block.

    ``options`` is the block (``--<where>.options KEY VALUE ...`` or a mapping in YAML); each
    value is read as YAML (``3`` is an int, ``[1, 2]`` a list, ``true`` a bool). A dataclass
    is built with them as its fields (an unknown key is an error naming the valid ones) and its
    :func:`treeroll.checks.checked` rules are enforced; any other callable is called with
    ``*args`` and the options as keywords; an instance (not callable) takes no options.
    ``parsed``: ``options`` come from :func:`parse_options` already (read them once when a
    plug-in is built many times, as an environment factory is)."""
    from treeroll.checks import validate

    values: dict[str, Any] = dict(options) if parsed else parse_options(options)
    name = getattr(obj, "__name__", type(obj).__name__)
    if dataclasses.is_dataclass(obj) and isinstance(obj, type):
        fields = {f.name for f in dataclasses.fields(obj) if f.init}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"--{where}.options: {name} has no option {', '.join(unknown)}; "
                             f"valid: {', '.join(sorted(fields)) or 'none'}")
        hints = typing.get_type_hints(obj)
        for key, value in values.items():
            if hints.get(key) is float and isinstance(value, int) and not isinstance(value, bool):
                values[key] = float(value)
        made = obj(*args, **values)
        validate(made, f"{where}.options")
        return made
    if callable(obj):
        return obj(*args, **values)
    if values:
        raise ValueError(f"--{where}.options: {name} is an instance, not a class or builder; "
                         "it takes no options")
    return obj


def plugin_section(base: type[T], blocks: Mapping[str, type], name: str) -> type[T]:
    """A config section made from a registry: ``base`` (a dataclass holding the section's own
    fields, such as ``name`` and ``options``) with one more field per registered plug-in that
    has settings, named as it is registered and defaulting to that plug-in's config dataclass.

    So a plug-in's settings are declared once, beside the plug-in (a strategy's dataclass *is*
    its config), and ``strategy.patr.k`` in YAML or ``--strategy.patr.k`` on the command line
    reach it without the section listing plug-ins by hand. The class keeps ``base``'s module
    and docstring."""
    fields = [(key, block, dataclasses.field(default_factory=block))
              for key, block in blocks.items()]
    made = dataclasses.make_dataclass(name, fields, bases=(base,),
                                      namespace={"__doc__": base.__doc__})
    made.__module__, made.__qualname__ = base.__module__, name
    return made
