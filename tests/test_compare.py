"""`treeroll compare`: the t-intervals over seeds, the report built from the runs, and the
command end to end on a tiny budget (report table, plot, example trees)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import yaml

from treeroll.cli.compare import CompareConfig, _write_report, run_compare
from treeroll.config import config_to_dict, load_config
from treeroll.stats import t_interval, t_quantile

ROOT = Path(__file__).resolve().parent.parent

T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 6: 2.447, 8: 2.306, 10: 2.228, 30: 2.042, 120: 1.980}
"""Two-sided 95% Student-t quantiles by degrees of freedom (any statistics table)."""


def _clipped_t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval from the table above, clipped to [0, 1], written out."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T_TABLE[n - 1] * sd / math.sqrt(n)
    return mean, max(mean - half, 0.0), min(mean + half, 1.0)


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantile_matches_the_table(df: int) -> None:
    assert t_quantile(df) == pytest.approx(T_TABLE[df], abs=1e-3)


@pytest.mark.parametrize("values", [[0.1, 0.15, 0.3, 0.2, 0.25, 0.05, 0.12],
                                    [0.4, 0.42, 0.5, 0.38, 0.45, 0.41, 0.47, 0.39, 0.44]])
def test_t_interval_for_seven_and_nine_seeds(values: list[float]) -> None:
    """n = 7 and 9 seeds use t(6) = 2.447 and t(8) = 2.306, not the normal 1.96."""
    mean, low, high = t_interval(values)
    half = T_TABLE[len(values) - 1] * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    assert mean == pytest.approx(float(np.mean(values)))
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=1e-4)


def _run(final: float, start: float = 0.05, tokens: float = 1000.0) -> dict[str, Any]:
    return {"final_success": final, "start_success": start, "generated_tokens": tokens,
            "leaves": 40, "leaves_per_1k_tokens": 40.0, "signal_groups": 0.5,
            "scorer_seconds": 0.0, "rollout_seconds": 1.0, "wall_seconds": 2.0,
            "curve": [(0.0, start), (tokens, final)]}


def test_report_interval_is_the_clipped_t_interval(tmp_path) -> None:
    """The report's interval is the t-interval over the seeds' finals, clipped to [0, 1]:
    two far-apart seeds clip on both sides; nine close ones are not clipped."""
    wide = [0.9, 0.1]
    close = [0.4, 0.42, 0.5, 0.38, 0.45, 0.41, 0.47, 0.39, 0.44]
    config = CompareConfig(report_dir=str(tmp_path), strategies=("chain", "patr"),
                           seeds=tuple(range(9)))
    _write_report(config, {"chain": [_run(v) for v in wide],
                           "patr": [_run(v, tokens=500.0 + 10 * i) for i, v in enumerate(close)]})
    results = json.loads((tmp_path / "results.json").read_text())
    text = (tmp_path / "report.md").read_text()
    for strategy, finals in (("chain", wide), ("patr", close)):
        mean, low, high = _clipped_t_interval(finals)
        row = results[strategy]
        assert row["final_success"] == pytest.approx(mean)
        assert row["ci95"] == pytest.approx([low, high], abs=1e-3)
        assert f"| {strategy} | {mean:.3f} | [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}] |" in text
    assert results["chain"]["ci95"] == [0.0, 1.0]  # 0.5 +- 5.08, clipped on both sides
    assert 0.0 < results["patr"]["ci95"][0] < results["patr"]["ci95"][1] < 1.0
    assert results["patr"]["generated_tokens"] == pytest.approx(540.0)


def test_compare_writes_the_report(tmp_path) -> None:
    base = load_config("configs/tiny.yaml")
    base = replace(base, optim=replace(base.optim, steps=2),
                   eval=replace(base.eval, tasks=4, every=1, tasks_during=4),
                   strategy=replace(base.strategy,
                                    patr=replace(base.strategy.patr, k_turns=1)))
    config = CompareConfig(report_dir=str(tmp_path / "report"), strategies=("chain", "patr"),
                           seeds=(0, 1), token_budget=40, base=base)
    report = run_compare(config)
    text = (tmp_path / "report" / "report.md").read_text()
    assert report.endswith("report.md")
    for strategy in ("chain", "patr"):
        assert f"| {strategy} |" in text
        assert (tmp_path / "report" / f"tree_{strategy}.png").exists()
        assert (tmp_path / "report" / f"tree_{strategy}.html").exists()
    assert (tmp_path / "report" / "success_vs_tokens.png").stat().st_size > 1000
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    for strategy, row in results.items():
        assert len(row["runs"]) == 2
        # Each seed's final is its own run's held-out evaluation, read back from its folder.
        runs = [Path(tmp_path / "report" / "runs" / f"{strategy}_seed{seed}") for seed in (0, 1)]
        finals = [json.loads((run / "summary.json").read_text())["final_eval"]["success_rate"]
                  for run in runs]
        assert [run["final_success"] for run in row["runs"]] == finals
        mean, low, high = _clipped_t_interval(finals)
        assert row["final_success"] == pytest.approx(mean)
        assert row["ci95"] == pytest.approx([low, high], abs=1e-3)
        # The same per-task token budget binds every strategy: 2 steps x 2 tasks x 40 tokens.
        steps = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                 for run in runs]
        generated = [sum(r.get("generated_tokens", 0) for r in records) for records in steps]
        assert [run["generated_tokens"] for run in row["runs"]] == generated
        assert all(0 < g <= 2 * 2 * 40 for g in generated)
        assert 0.0 <= row["signal_groups"] <= 1.0
        per_seed = " / ".join(f"{final:.3f}" for final in finals)
        assert per_seed in text
    assert results["patr"]["scorer_seconds"] > 0
    # A second call reuses the finished runs instead of retraining them.
    stamp = (tmp_path / "report" / "runs" / "chain_seed0" / "summary.json").stat().st_mtime
    run_compare(config)
    assert (tmp_path / "report" / "runs" / "chain_seed0" / "summary.json").stat().st_mtime == stamp
    # An interrupted run continues from its checkpoint (its folder is kept, not redone):
    # simulate one killed after its last update, before its final evaluation.
    run = tmp_path / "report" / "runs" / "patr_seed1"
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({k: v for k, v in summary.items()
                                                  if k not in ("finished", "final_eval")}))
    (run / "kept.txt").write_text("a file the user left in the run folder")
    run_compare(config)
    assert (run / "kept.txt").exists()
    again = json.loads((run / "summary.json").read_text())
    assert again["finished"] and again["final_eval"] == summary["final_eval"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "leaves" in r] == [1, 2]  # not trained again
    assert sum(1 for r in records if r.get("final")) == 1
    # Runs made with other settings are refused before anything trains, not read back.
    with pytest.raises(ValueError, match=r"rollout\.max_generated_tokens: 40 -> 41"):
        run_compare(replace(config, token_budget=41))


def test_negative_seeds_are_refused_naming_the_option(tmp_path) -> None:
    config = CompareConfig(report_dir=str(tmp_path / "report"), seeds=(0, -3))
    with pytest.raises(ValueError, match=r"--seeds.*\[-3\].*>= 0"):
        run_compare(config)
    assert not (tmp_path / "report").exists()  # refused before any work


def test_a_strategy_under_an_allocator_is_one_arm_of_the_comparison(tmp_path) -> None:
    base = load_config("configs/tiny.yaml")
    base = replace(base, optim=replace(base.optim, steps=1),
                   eval=replace(base.eval, tasks=2, every=0),
                   strategy=replace(base.strategy, chain=replace(base.strategy.chain,
                                                                  group_size=2)),
                   allocator=replace(base.allocator,
                                     vigor=replace(base.allocator.vigor, group=2)))
    config = CompareConfig(report_dir=str(tmp_path / "report"),
                           strategies=("chain", "chain+vigor"), seeds=(0,), token_budget=40,
                           base=base)
    run_compare(config)
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert set(results) == {"chain", "chain+vigor"}
    saved = yaml.safe_load((tmp_path / "report" / "runs" / "chain+vigor_seed0" /
                            "config.yaml").read_text())
    assert saved["allocator"]["name"] == "vigor" and saved["strategy"]["name"] == "chain"
    plain = yaml.safe_load((tmp_path / "report" / "runs" / "chain_seed0" /
                            "config.yaml").read_text())
    assert plain["allocator"]["name"] == "uniform"
    assert "| chain+vigor |" in (tmp_path / "report" / "report.md").read_text()
    for arms, says in [(("chain+vigor+x",), r"STRATEGY\+ALLOCATOR"),
                       (("chain+nope",), "--allocator.name")]:
        with pytest.raises(ValueError, match=says):
            run_compare(replace(config, strategies=arms, report_dir=str(tmp_path / "other")))


def _tiny_compare(report: Path, threads: int = 2, **changes: Any) -> CompareConfig:
    base = load_config("configs/tiny.yaml")
    base = replace(base, threads=threads, optim=replace(base.optim, steps=2),
                   eval=replace(base.eval, tasks=4, every=0),
                   strategy=replace(base.strategy,
                                    patr=replace(base.strategy.patr, k_turns=1)))
    return CompareConfig(report_dir=str(report), strategies=("chain", "patr"), seeds=(0, 1),
                         token_budget=40, base=base, **changes)


def _computed(report: Path) -> dict[str, list[dict[str, Any]]]:
    """Every run's figures in results.json but its timings."""
    results = json.loads((report / "results.json").read_text())
    return {arm: [{k: v for k, v in run.items() if not k.endswith("_seconds")}
                  for run in row["runs"]] for arm, row in results.items()}


def test_runs_trained_side_by_side_compute_what_they_compute_one_after_another(
        tmp_path) -> None:
    run_compare(_tiny_compare(tmp_path / "one"))  # one at a time, 2 threads each
    run_compare(_tiny_compare(tmp_path / "two", jobs=2))  # 2 threads // 2 jobs: 1 each
    assert _computed(tmp_path / "two") == _computed(tmp_path / "one")
    text = (tmp_path / "two" / "report.md").read_text()
    assert "up to 2 runs trained at a time (1 thread(s) each)" in text
    saved = yaml.safe_load((tmp_path / "two" / "runs" / "patr_seed1" / "config.yaml")
                           .read_text())
    assert saved["threads"] == 1
    # The finished runs are read back, whatever jobs: nothing is trained again.
    stamp = (tmp_path / "two" / "runs" / "chain_seed1" / "summary.json").stat().st_mtime
    run_compare(_tiny_compare(tmp_path / "two", jobs=1))
    assert (tmp_path / "two" / "runs" / "chain_seed1" / "summary.json").stat().st_mtime == stamp


def _damage(config: CompareConfig, arm: str, seed: int) -> None:
    """Make ``arm``'s run for ``seed`` an interrupted one whose checkpoint is damaged."""
    run_compare(replace(config, strategies=(arm,), seeds=(seed,), jobs=1))
    run = Path(config.report_dir) / "runs" / f"{arm}_seed{seed}"
    (run / "summary.json").unlink()
    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")


def test_a_run_failing_beside_another_is_named_and_the_run_beside_it_finishes(
        tmp_path) -> None:
    config = _tiny_compare(tmp_path / "r", jobs=2)
    _damage(config, "chain", 0)  # the first run to start fails at once
    with pytest.raises(ValueError, match=r"run .*chain_seed0: checkpoint .*last.pt cannot be read"):
        run_compare(config)
    runs = tmp_path / "r" / "runs"
    # seed-major order: the run beside chain's first seed is patr's first seed
    assert json.loads((runs / "patr_seed0" / "summary.json").read_text())["finished"]


def test_once_a_run_has_failed_no_further_run_starts(tmp_path) -> None:
    # Both runs that fill the two slots fail, so whichever fails first, no slot frees up
    # before a failure is known: the seed-1 runs must never start. (With one run failing
    # beside a healthy one, the healthy one may finish first on a loaded machine and free
    # its slot before the failure arrives, which rightly starts the next run.)
    config = _tiny_compare(tmp_path / "r", jobs=2)
    _damage(config, "chain", 0)
    _damage(config, "patr", 0)
    with pytest.raises(ValueError, match=r"run .*(chain|patr)_seed0: checkpoint .*cannot be read"):
        run_compare(config)
    runs = tmp_path / "r" / "runs"
    assert not (runs / "chain_seed1").exists() and not (runs / "patr_seed1").exists()


def test_ctrl_c_during_side_by_side_runs_checkpoints_each_at_a_whole_step(tmp_path) -> None:
    report = tmp_path / "r"
    config = _tiny_compare(report, jobs=2)
    config = replace(config, strategies=("chain",),
                     base=replace(config.base, checkpoint_every=1000,
                                  optim=replace(config.base.optim, steps=400)))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    command = subprocess.Popen([sys.executable, "-m", "treeroll.cli", "compare", "--config",
                                str(tmp_path / "c.yaml")], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               # as from a terminal: a background job of a script (CI) starts
                               # with SIGINT ignored, and Python keeps it so
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = [report / "runs" / f"chain_seed{seed}" / "metrics.jsonl" for seed in (0, 1)]
    deadline = time.monotonic() + 300
    while not all(m.exists() and m.read_text().count("\n") >= 3 for m in metrics):
        assert command.poll() is None and time.monotonic() < deadline, command.stdout.read()
        time.sleep(0.2)
    os.kill(command.pid, signal.SIGINT)  # the comparison alone, as a terminal's Ctrl-C is
    assert command.wait(timeout=120) == 130, command.stdout.read()
    for seed in (0, 1):  # each run checkpointed its last whole step on the Ctrl-C passed on
        run = report / "runs" / f"chain_seed{seed}"  # (checkpoint_every alone: step 1000)
        stopped = json.loads((run / "summary.json").read_text())["interrupted_at_step"]
        saved = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["step"]
        assert 2 <= saved == stopped - 1 < 400, (seed, saved, stopped)


def test_jobs_below_one_are_refused_naming_the_option(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"--jobs.*0.*>= 1"):
        run_compare(_tiny_compare(tmp_path / "r", jobs=0))
    assert not (tmp_path / "r").exists()


def test_a_one_seed_report_claims_no_interval(tmp_path) -> None:
    config = CompareConfig(report_dir=str(tmp_path), strategies=("chain",), seeds=(0,))
    _write_report(config, {"chain": [_run(0.4)]})
    text = (tmp_path / "report.md").read_text()
    assert "| chain | 0.400 | n/a (one seed) |" in text
    assert json.loads((tmp_path / "results.json").read_text())["chain"]["ci95"] is None


def test_runs_start_seed_major_so_a_stopped_comparison_holds_the_same_seeds_per_strategy(
        tmp_path) -> None:
    config = replace(_tiny_compare(tmp_path / "r"), more_seeds=(5,), more_seeds_for=("chain",))
    started: list[str] = []
    with mock.patch("treeroll.cli.compare._train_run",
                    side_effect=lambda run, reporter: started.append(run.name)), \
            mock.patch("treeroll.cli.compare._collect", return_value={}), \
            mock.patch("treeroll.cli.compare._write_report"):
        run_compare(config)
    assert started == ["chain_seed0", "patr_seed0", "chain_seed1", "patr_seed1", "chain_seed5"]
