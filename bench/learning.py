"""Does RL raise the shipped base policy? The default training, measured start to end.

Trains from the shipped base (``configs/frozenlake_rllm.yaml``: FrozenLake in rLLM's
convention, the default strategy and optimiser) and evaluates the policy before and after on
the same held-out tasks, greedy, with 95% Wilson intervals. ``--quick`` shortens the run to
fit about six minutes on 2 CPU cores (fewer steps, 128 held-out tasks, no evaluations in
between); without it, this is exactly the README's first command.

    python bench/learning.py --quick
    python bench/learning.py            # the default training (the README's figures)

Last line: one JSON object with ``start_success``, ``final_success``, their intervals,
``gain``, ``separated`` (the intervals do not overlap), ``steps``, ``tasks``, ``format_ok``,
``evals`` (``[step, success, tasks]`` of every held-out evaluation), ``train_seconds`` (the
whole run, evaluations included), ``step_seconds`` (the RL steps alone: rollouts and
updates, the issue's "minutes of training") and the run folder. ``--keep DIR`` copies the run's
metrics, summary and plot there (the README's default training: ``docs/default_training``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from treeroll.config import load_config
from treeroll.training.trainer import train

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "frozenlake_rllm.yaml"
QUICK_STEPS = 24
"""RL steps of ``--quick`` (under 6 minutes with its two 128-task evaluations)."""


def main() -> None:
    """Train, print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps, 128 tasks")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--runs-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--keep", default=None, help="copy the run's metrics.jsonl, "
                        "summary.json and metrics.png into this folder")
    args = parser.parse_args()
    config = load_config(args.config)
    if args.quick:
        config.optim = replace(config.optim, steps=QUICK_STEPS)
        config.eval = replace(config.eval, tasks=128, every=0)
    runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="treeroll-learning-")
    config.runs_dir = runs_dir
    config.name = "learning_quick" if args.quick else config.name
    tick = time.perf_counter()
    summary = train(config)
    seconds = time.perf_counter() - tick
    start, final = summary["start_eval"], summary["final_eval"]
    run = Path(runs_dir) / config.name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [[r["step"], r["eval"]["success_rate"], r["eval"]["tasks"]]
             for r in rows if "eval" in r]
    steps = [r for r in rows if "leaves" in r]  # RL step rows (evaluation rows have none)
    step_seconds = sum(r["rollout_seconds"] + r["update_seconds"] for r in steps)
    if args.keep:
        keep = Path(args.keep)
        keep.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "summary.json", "metrics.png"):
            if (run / name).exists():
                shutil.copy(run / name, keep / name)
    print(json.dumps({
        "policy": config.policy.init, "strategy": config.strategy.name,
        "start_success": start["success_rate"], "start_ci": [round(start["ci95_low"], 4),
                                                             round(start["ci95_high"], 4)],
        "final_success": final["success_rate"], "final_ci": [round(final["ci95_low"], 4),
                                                             round(final["ci95_high"], 4)],
        "gain": round(final["success_rate"] - start["success_rate"], 4),
        "separated": final["ci95_low"] > start["ci95_high"],
        "steps": summary["steps"], "tasks": final["tasks"],
        "format_ok": final["format_ok"], "evals": evals,
        "generated_tokens": summary["generated_tokens"], "train_seconds": round(seconds, 1),
        "step_seconds": round(step_seconds, 1), "run": str(run)}))


if __name__ == "__main__":
    main()
