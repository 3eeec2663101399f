"""mypy checks a plug-in's settings (issue #51): the config sections are typed with the
built-in plug-ins' blocks, so code that reads a setting a strategy, scorer, backend,
estimator or environment does not have fails type checking, and one that it has passes."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parent.parent

READS = {
    "config.strategy.patr.k_turns": "int",
    "config.strategy.tree_grpo.m": "int",
    "config.scorer.blend.weight": "float",
    "config.backend.hf.max_batch_size": "int",
    "config.advantage.gigpo.gamma": "float",
    "config.env.frozenlake.size_min": "int | None",
}
"""Settings the built-in plug-ins have, and their types."""


def _mypy(tmp_path: Path, body: str) -> tuple[str, int]:
    snippet = tmp_path / "reads.py"
    snippet.write_text("from treeroll.config import TrainConfig\n\n"
                       "config = TrainConfig()\n" + body)
    out, err, status = mypy_api.run([
        "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
        str(ROOT / ".mypy_cache"), "--no-error-summary", str(snippet)])
    return out + err, status


def test_reading_a_setting_a_plug_in_has_type_checks_with_its_type(tmp_path):
    body = "".join(f"{name.replace('.', '_')}: {kind} = {name}\n"
                   for name, kind in READS.items())
    said, status = _mypy(tmp_path, body)
    assert status == 0, said


@pytest.mark.parametrize("wrong", ["config.strategy.patr.k_turnz", "config.scorer.judge.weight",
                                   "config.backend.vllm.max_batch_size",
                                   "config.env.swe.size_min"])
def test_reading_a_setting_a_plug_in_does_not_have_fails_type_checking(tmp_path, wrong):
    said, status = _mypy(tmp_path, f"value = {wrong}\n")
    assert status != 0 and "has no attribute" in said, said


SECTIONS = {
    "treeroll.strategies": "StrategyConfig",
    "treeroll.envs": "EnvConfig",
    "treeroll.scorers": "ScorerConfig",
    "treeroll.backends": "BackendConfig",
    "treeroll.credit": "AdvantageConfig",
}
"""The config sections built from a registry, and the module declaring them for mypy."""


def _declared_blocks(module: str, section: str) -> dict[str, str]:
    """The fields the ``if TYPE_CHECKING:`` class of ``section`` in ``module`` declares,
    read from its source: ``{name: annotation}``."""
    import ast
    import importlib

    source = Path(importlib.import_module(module).__file__).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for item in node.body:
                if isinstance(item, ast.ClassDef) and item.name == section:
                    return {f.target.id: ast.unparse(f.annotation) for f in item.body
                            if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)}
    raise AssertionError(f"{module} declares no {section} for the type checker")


@pytest.mark.parametrize("module", sorted(SECTIONS))
def test_what_the_type_checker_is_told_of_a_section_is_what_the_registry_builds(module):
    # the TYPE_CHECKING declaration is written by hand: a block registered or renamed without
    # it (or the other way round) would let mypy check settings that are not there
    import dataclasses
    import importlib

    section = getattr(importlib.import_module(module), SECTIONS[module])
    own = {f.name for f in dataclasses.fields(section.__mro__[1])}
    built = {f.name: f.default_factory.__name__ for f in dataclasses.fields(section)
             if f.name not in own}
    assert built, f"{module}: the registry built no blocks"
    assert _declared_blocks(module, SECTIONS[module]) == built


TYPED_ROLES = {"config", "policy", "model", "ref_model", "optimizer", "trained", "estimator",
               "allocator", "scorer"}
"""Parameters that hold one of treeroll's parts (or a config, ``*_config``): their types can
be named, so ``Any`` there is allowed only where they are a third party's (said why)."""


def _any_parts(package: Path) -> list[tuple[str, int, str, str]]:
    """``(file, line, parameter, source line)`` of each part-holding parameter typed ``Any``
    in the modules under ``package``."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                role = arg.arg in TYPED_ROLES or arg.arg.endswith("_config")
                if role and arg.annotation is not None and ast.unparse(arg.annotation) in (
                        "Any", "Any | None"):
                    found.append((str(path.relative_to(package)), arg.lineno, arg.arg,
                                  lines[arg.lineno - 1]))
    return found


def test_a_part_is_typed_any_only_where_it_is_a_third_partys_and_says_why():
    found = _any_parts(ROOT / "src" / "treeroll")
    assert len(found) <= 15, "\n".join(f"{f}:{n} {a}" for f, n, a, _ in found)
    unexplained = [f"{f}:{n} {a}" for f, n, a, line in found if "# Any:" not in line]
    assert unexplained == []


def test_the_finder_of_parts_typed_any_finds_them(tmp_path):
    # the check above must not pass because it finds nothing
    (tmp_path / "m.py").write_text("from typing import Any\n\n"
                                   "def f(model: Any, rollout_config: Any | None,\n"
                                   "      n: Any) -> None:\n"
                                   "    pass\n")
    assert [(a, n) for _, n, a, _ in _any_parts(tmp_path)] == [("model", 3), ("rollout_config", 3)]
