"""Checks of configuration values, declared beside each field and run before any work starts.

A field declares what is valid with :func:`checked` (a ``dataclasses.field`` carrying the rule
in its metadata)::

    lr: float = checked(1e-3, gt=0)
    normalisation: str = checked("token_mean", choices=("token_mean", "sequence_mean"))

A field typed ``Literal[...]`` (a plug-in's, e.g. ``EarlyForks.on_end``) is checked by
:func:`validate` and in config files the same way, its values being the choices, with the same
words (the literal also lets mypy check code that sets it; ``checked`` also carries bounds). A
class may still check the value when it is built, as ``EarlyForks`` does.

:func:`validate` walks a config (nested dataclasses included) and raises one
:class:`ConfigError` listing every invalid value with its option's name (``--optim.lr``), the
value and what is valid. The entry points (``train``, ``run_sft``, ``run_compare``,
``rollout``) call it first, so a bad value fails before a model is built or a run folder is
made. This module imports nothing from treeroll, so every config module can use it.

Written here rather than taken from pydantic or attrs validators: the configs are plain
dataclasses (tyro builds the command line from them), and the error must name the option as the
command line spells it, which only the walk from the top-level config knows.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["Check", "ConfigError", "check_duration", "checked", "field_hints", "literal_check",
           "option_name", "validate"]


class ConfigError(ValueError):
    """Invalid settings; ``problems`` holds one ``(option, message)`` pair each."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        lines = [f"{option} {message}" for option, message in self.problems]
        head = "invalid setting" if len(lines) == 1 else f"{len(lines)} invalid settings"
        super().__init__(head + ":\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class Check:
    """What a field accepts: numeric bounds (``ge``/``gt``/``le``/``lt``) or a set of
    ``choices``; ``None`` passes when the field allows it (its default is ``None`` or
    ``optional``)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    optional: bool = False

    def describe(self) -> str:
        """What is valid, in words."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        parts = [f"{sign} {bound:g}" for sign, bound in
                 ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                 if bound is not None]
        text = " and ".join(parts)
        return text + " (or null)" if self.optional else text

    def problem(self, value: Any) -> str | None:
        """``None`` when ``value`` is valid, else what is wrong with it."""
        if value is None:
            return None if self.optional else f"is null; must be {self.describe()}"
        if self.choices is not None:
            return None if value in self.choices else f"is {value!r}; must be {self.describe()}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is {value!r}; must be a number {self.describe()}"
        bad = (not math.isfinite(value)
               or (self.ge is not None and not value >= self.ge)
               or (self.gt is not None and not value > self.gt)
               or (self.le is not None and not value <= self.le)
               or (self.lt is not None and not value < self.lt))
        return f"is {value!r}; must be {self.describe()}" if bad else None


def checked(default: Any = dataclasses.MISSING, *,
            default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
            ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, choices: Sequence[Any] | None = None) -> Any:
    """A dataclass field whose valid values :func:`validate` checks (see the module doc)."""
    rule = Check(ge=ge, gt=gt, le=le, lt=lt,
                 choices=tuple(choices) if choices is not None else None,
                 optional=default is None)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"check": rule})
    return dataclasses.field(default=default, metadata={"check": rule})


def literal_check(hint: object) -> Check | None:
    """The rule a ``Literal[...]`` type hint declares (``Literal[...] | None`` too, and a
    union of literals); None for any other hint, or a union with a type that is not a
    literal (``Literal["auto"] | int`` accepts any int: no set of choices describes it)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    present = [o for o in options if o is not type(None)]
    if not present or any(typing.get_origin(o) is not typing.Literal for o in present):
        return None
    choices = tuple(value for o in present for value in typing.get_args(o))
    return Check(choices=choices, optional=type(None) in options)


@functools.cache
def field_hints(cls: type) -> Mapping[str, object]:
    """The resolved type hints of the dataclass ``cls``'s fields, by name, computed once per
    class (read-only: every caller shares them). Resolved as :func:`typing.get_type_hints`
    does (aliases such as ``Convention`` too); if one of them does not resolve (a name
    imported for the type checker only), each field's is tried alone, in the module of the
    class that declares it, and a field whose hint does not resolve is left out."""
    try:
        return MappingProxyType(typing.get_type_hints(cls))
    except Exception:
        pass
    hints: dict[str, object] = {}
    for item in dataclasses.fields(cls):
        owner = next((c for c in cls.__mro__ if item.name in vars(c).get(
            "__annotations__", {})), cls)
        module = sys.modules.get(owner.__module__)
        try:  # a string annotation is evaluated as get_type_hints evaluates it
            hints[item.name] = (eval(item.type, dict(vars(module)) if module else {})
                                if isinstance(item.type, str) else item.type)
        except Exception:
            continue
    return MappingProxyType(hints)


@functools.cache
def _literal_rules(cls: type) -> dict[str, Check]:
    """The rules ``cls``'s ``Literal``-typed fields declare, by field name (a field whose
    hint does not resolve declares none: :func:`field_hints`)."""
    hints = field_hints(cls)
    rules: dict[str, Check] = {}
    for item in dataclasses.fields(cls):
        rule = literal_check(hints.get(item.name))
        if rule is not None:
            rules[item.name] = rule
    return rules


def option_name(path: str) -> str:
    """The command-line spelling of a dotted config path (``optim.tasks_per_step`` ->
    ``--optim.tasks-per-step``)."""
    return "--" + path.replace("_", "-")


def problems(config: object, where: str = "") -> list[tuple[str, str]]:
    """Every ``(option, message)`` of ``config``'s declared checks, nested configs
    included."""
    found: list[tuple[str, str]] = []
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return found
    literals = _literal_rules(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{where}.{f.name}" if where else f.name
        rule = f.metadata.get("check") or literals.get(f.name)
        if isinstance(rule, Check):
            message = rule.problem(value)
            if message:
                found.append((option_name(path), message))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found += problems(value, path)
    return found


def validate(config: object, where: str = "",
             extra: Sequence[tuple[str, str]] = ()) -> None:
    """Raise :class:`ConfigError` if any declared check of ``config`` fails, or ``extra``
    (cross-field problems the caller found) is not empty."""
    found = problems(config, where) + list(extra)
    if found:
        raise ConfigError(found)


YEAR_SECONDS = 365.25 * 24 * 3600


def check_duration(option: str, steps: int, steps_left: int, seconds_per_step: float,
                   limit_seconds: float = YEAR_SECONDS) -> None:
    """Refuse a step count whose run would outlast ``limit_seconds`` (a year) at the measured
    ``seconds_per_step``: such a value is a typo (``--optim.steps 1000000000000``), and its
    progress bar would promise millions of days. Called after the second step a process runs
    (the first warms up), the first moment a step's cost is known; the run folder keeps both
    steps, so ``--resume`` with a smaller count continues it."""
    eta = steps_left * seconds_per_step
    if eta <= limit_seconds:
        return
    fits = int(limit_seconds / max(seconds_per_step, 1e-9))
    raise ConfigError([(option, f"{steps:,} is absurd: at {seconds_per_step:.2f} s a step "
                                f"(measured on the second one) the {steps_left:,} steps left "
                                f"take {eta / YEAR_SECONDS:,.0f} years, more than one; at most "
                                f"{fits:,} steps fit in a year")])
