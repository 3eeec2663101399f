"""`treeroll compare` end to end on a tiny budget: report table, plot, example trees."""

from __future__ import annotations

import json
from dataclasses import replace

from treeroll.compare import CompareConfig, run_compare
from treeroll.config import load_config


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
    for row in results.values():
        assert len(row["runs"]) == 2
        low, high = row["ci95"]
        assert low <= row["final_success"] <= high
        # The same per-task token budget binds every strategy: 2 steps x 2 tasks x 40 tokens.
        assert all(run["generated_tokens"] <= 2 * 2 * 40 for run in row["runs"])
        assert 0.0 <= row["signal_groups"] <= 1.0
        per_seed = " / ".join(f"{run['final_success']:.3f}" for run in row["runs"])
        assert per_seed in text
    assert results["patr"]["scorer_seconds"] > 0
    # A second call reuses the finished runs instead of retraining them.
    stamp = (tmp_path / "report" / "runs" / "chain_seed0" / "summary.json").stat().st_mtime
    run_compare(config)
    assert (tmp_path / "report" / "runs" / "chain_seed0" / "summary.json").stat().st_mtime == stamp
