"""The registration records refuse what they cannot serve, before anything is registered or
run: an entry point of the wrong kind, an environment record that does not fit together, an
estimator block added after its section is built; and the rules read from types (a
``Literal`` field's choices) and a plain-function view are what they say."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

import pytest

from treeroll.checks import ConfigError, literal_check, validate
from treeroll.registry import Registry


@dataclass(frozen=True)
class Record:
    """A kind's registration record, for the registry tests."""

    build: object = None


@dataclass
class _Point:
    """What ``importlib.metadata.entry_points`` yields: a name, a value, ``load()``."""

    name: str
    value: str
    loaded: object = field(default=None)

    def load(self) -> object:
        return self.loaded


def test_an_entry_point_that_is_not_its_kinds_record_is_skipped_saying_why(monkeypatch):
    import importlib.metadata

    good, bad = Record(), "just a string"
    points = [_Point("good", "pkg.mod:GOOD", good), _Point("bad", "pkg.mod:BAD", bad)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points)
    registry: Registry[Record] = Registry("gadget")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        registry.load_entry_points("treeroll.gadgets", record=Record)
    assert registry.names() == ["good"] and registry.get("good") is good
    assert len(said) == 1
    assert "gadget 'bad'" in str(said[0].message) and "Record, not str" in str(said[0].message)


def test_an_environment_record_must_name_its_block_and_settings_together():
    from treeroll.envs import EnvSpec, FrozenLakeSettings

    def build(env_config: object) -> object:
        return object

    with pytest.raises(ValueError, match="block and its dataclass together"):
        EnvSpec(build, block="lake")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block and its dataclass together"):
        EnvSpec(build, settings=FrozenLakeSettings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exclusive EnvSpec needs a settings block"):
        EnvSpec(build, exclusive=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # every field but the builder is given by name
        EnvSpec(build, "lake", FrozenLakeSettings)  # type: ignore[arg-type, misc]


def test_an_estimator_block_cannot_be_added_once_its_section_is_built():
    from treeroll.credit import ADVANTAGES, AdvantageConfig, register_estimator

    @dataclass
    class Late:
        width: int = 1

    def late(tree: object, width: int = 1) -> list[float]:
        return []

    with pytest.raises(ValueError, match="cannot be added once AdvantageConfig is built"):
        register_estimator("late_with_block", late, settings=Late)
    assert "late_with_block" not in ADVANTAGES  # refused before anything was registered
    assert not hasattr(AdvantageConfig(), "late_with_block")


@pytest.mark.parametrize(("hint", "choices", "optional"), [
    (Literal["a", "b"], ("a", "b"), False),
    (Literal["a"] | None, ("a",), True),
    (Literal["a"] | Literal["b"], ("a", "b"), False),
    (Literal["auto"] | int, None, None),  # any int is valid: no set of choices says so
    (str, None, None),
])
def test_a_literal_hint_declares_its_choices_and_any_other_hint_none(hint, choices, optional):
    rule = literal_check(hint)
    if choices is None:
        assert rule is None
    else:
        assert rule is not None and rule.choices == choices and rule.optional == optional


Mode = Literal["fast", "exact"]


@dataclass
class Aliased:
    """A settings block whose choices are named by a type alias."""

    mode: Mode = "fast"


def test_a_literal_behind_a_type_alias_is_checked():
    validate(Aliased(mode="exact"))
    with pytest.raises(ConfigError, match="--mode is 'slow'; must be one of 'fast', 'exact'"):
        validate(Aliased(mode="slow"))  # type: ignore[arg-type]


def test_a_plain_function_is_a_view_that_needs_no_words():
    from treeroll.views import VIEWS, View, as_view

    def shout(text: str, first: bool = True) -> str:
        return text.upper()

    view = as_view(shout)
    assert isinstance(view, View) and view("go left", True) == "GO LEFT"
    assert view.words is None and view.word_pattern is None and not view.coordinate_words
    cells = as_view(VIEWS.get("cell_coordinates_safe"))
    assert cells is VIEWS.get("cell_coordinates_safe") and cells.coordinate_words


@dataclass
class HalfResolved:
    """A settings block one of whose hints names a type the module never defines (as a name
    imported for the type checker only would be at run time)."""

    mode: Mode = "fast"
    handle: NotDefinedHere | None = None  # type: ignore[name-defined]  # noqa: F821


def test_a_hint_that_does_not_resolve_leaves_the_others_checked_and_its_value_as_written(
        tmp_path):
    from treeroll.checks import field_hints
    from treeroll.config import load_config

    hints = field_hints(HalfResolved)
    assert hints["mode"] == Mode and "handle" not in hints
    with pytest.raises(ConfigError, match="--mode is 'slow'"):
        validate(HalfResolved(mode="slow"))  # type: ignore[arg-type]
    path = tmp_path / "half.yaml"
    path.write_text("mode: exact\nhandle: anything\n")
    loaded = load_config(path, HalfResolved)
    assert loaded.mode == "exact" and loaded.handle == "anything"
