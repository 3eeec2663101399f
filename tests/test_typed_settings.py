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
