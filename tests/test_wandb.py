"""W&B logging (``--wandb.project``): an offline run's figures, read back from its files, are
``metrics.jsonl``'s; a resumed run continues the same W&B run without logging a step twice."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from treeroll.config import TrainConfig, WandbConfig
from treeroll.config_checks import check_config
from treeroll.training.tensorboard import flatten_scalars

ROOT = Path(__file__).resolve().parent.parent


def read_records(run_file: Path) -> list:
    """Every ``wandb_internal_pb2.Record`` of an offline ``run-*.wandb`` file, in order.

    wandb 0.31 dropped its Python reader (the Go core writes the file), so this reads the
    format itself: a 7-byte ``:W&B`` header, then LevelDB's log format (32 KiB blocks of
    records with a 7-byte header: CRC, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a W&B run file"
    pos, block, pieces, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # block padding
            pos += left
            continue
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            out.append(record)
    return out


def read_history(run_file: Path, wait_s: float = 60.0) -> list[tuple[int, dict[str, float]]]:
    """``(step, scalars)`` of every history record of an offline run file, once the file is
    complete: W&B's service may still be writing it after ``run.finish()`` returns (a loaded
    CI machine read a resumed run's file before its history reached it), so this waits for
    the run's closing ``exit`` record, up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        records = read_records(run_file)
        kinds = [record.WhichOneof("record_type") for record in records]
        if "exit" in kinds:
            break
        assert time.monotonic() < deadline, f"{run_file} has no exit record after {wait_s} s"
        time.sleep(0.2)
    out = []
    for record, kind in zip(records, kinds, strict=True):
        if kind == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                     for i in record.history.item}
            out.append((record.history.step.num,
                        {k: v for k, v in items.items() if not k.startswith("_")}))
    return out


def _train(runs: Path, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "treeroll.cli", "train", "--config",
                    "configs/tiny.yaml", "--runs-dir", str(runs), "--name", "w",
                    "--threads", "1", "--wandb.project", "treeroll-test",
                    "--wandb.mode", "offline", *extra],
                   cwd=ROOT, check=True, capture_output=True, timeout=600,
                   env={**os.environ, "WANDB_SILENT": "true", "HOME": str(runs.parent)})


def _expected(run: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl's numbers per step, as W&B should hold them (the final evaluation
    shares the last step's row)."""
    rows: dict[int, dict[str, float]] = {}
    steps = 0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record.get("step", steps)
        steps = max(steps, step)
        rows.setdefault(step, {}).update(dict(flatten_scalars(record)))
    return rows


def _logged(run: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for run_file in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        for step, scalars in read_history(run_file):
            assert step not in rows or not (set(rows[step]) & set(scalars)), (
                f"step {step} logged twice")
            rows.setdefault(step, {}).update(scalars)
    return rows


def _assert_same(logged: dict, expected: dict) -> None:
    assert sorted(logged) == sorted(expected)
    for step, scalars in expected.items():
        assert set(logged[step]) == set(scalars), f"step {step}"
        for key, value in scalars.items():
            assert math.isclose(logged[step][key], value, rel_tol=1e-9, abs_tol=1e-12), (
                f"step {step} {key}")


def test_an_offline_wandb_run_holds_the_figures_of_metrics_jsonl(tmp_path) -> None:
    runs = tmp_path / "runs"
    _train(runs, "--optim.steps", "3")
    run = runs / "w"
    expected = _expected(run)
    assert {0, 1, 2, 3} <= set(expected) and "eval/success_rate" in expected[3]
    _assert_same(_logged(run), expected)


def test_an_extended_run_continues_its_wandb_run_logging_each_step_once(tmp_path) -> None:
    runs = tmp_path / "runs"
    _train(runs, "--optim.steps", "2")
    first = json.loads((runs / "w" / "wandb.json").read_text())
    _train(runs, "--optim.steps", "3", "--extend")
    state = json.loads((runs / "w" / "wandb.json").read_text())
    assert state == {"id": first["id"], "logged": 3}
    assert len(list((runs / "w" / "wandb").glob(f"offline-run-*-{first['id']}"))) == 2
    logged = _logged(runs / "w")
    assert sorted(logged) == [0, 1, 2, 3]
    assert "loss" in logged[3] and "eval/success_rate" in logged[3]


def test_a_wandb_project_without_wandb_installed_is_refused_before_work(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(Exception, match=r"--wandb.project.*pip install 'treeroll\[wandb\]'"):
        check_config(TrainConfig(wandb=WandbConfig(project="p")))


def test_a_resumed_logger_skips_the_steps_an_interrupted_attempt_logged(tmp_path) -> None:
    from treeroll.training.wandb_log import WandbLog

    settings = WandbConfig(project="treeroll-test", mode="offline")
    first = WandbLog(tmp_path, settings, name="r", config={}, resume=False)
    for step in (1, 2, 3):  # the attempt logged steps 1-3, then died after checkpoint 2
        first.record(step, {"step": step, "loss": float(step)})
    first.close()
    again = WandbLog(tmp_path, settings, name="r", config={}, resume=True)
    assert again.run_id == first.run_id and again.skip_through == 3
    for step in (3, 4):  # the resumed run recomputes step 3, then goes on
        again.record(step, {"step": step, "loss": 10.0 + step})
    again.record(4, {"eval": {"success_rate": 0.5}})
    again.close()
    logged = _logged(tmp_path)
    assert logged == {1: {"loss": 1.0}, 2: {"loss": 2.0}, 3: {"loss": 3.0},
                      4: {"loss": 14.0, "eval/success_rate": 0.5}}
