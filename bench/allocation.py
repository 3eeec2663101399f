"""Generated tokens each method needs to reach a fixed held-out success, relative to chain.

Trains chain, Tree-GRPO, PATR, VIGOR (over chains: ``chain+vigor``), IGRPO and ARPO with
``treeroll compare`` (``configs/allocation.yaml``: the shipped base ``frozenlake-tiny``, rLLM
convention, the same generated-token budget per task per step and the same updates), with
held-out success measured every few updates on one fixed task set (the same tasks at the
start, during and at the end). The target is the start's success plus ``--gain`` (stated in
the output); ``tokens_to_target`` is the cumulative generated tokens at the first evaluation
whose seed-mean success reaches it (null if none did), and ``over_chain`` divides it by
chain's. Anchors from the papers: VIGOR reports 2.3x fewer rollouts, Tree-GRPO a quarter of
the budget.

    python bench/allocation.py --quick     # one seed (about 15 minutes here)
    python bench/allocation.py             # the config's seeds

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from treeroll.cli.compare import CompareConfig, run_compare
from treeroll.config import load_config
from treeroll.training.runfolder import move_aside

ROOT = Path(__file__).resolve().parent.parent


def tokens_to_target(runs: list[dict], target: float) -> float | None:
    """Cumulative generated tokens at the first evaluation whose mean over the seeds reaches
    ``target`` (evaluations are matched by position: every run evaluates at the same steps)."""
    points = min(len(r["curve"]) for r in runs)
    for i in range(points):
        if float(np.mean([r["curve"][i][1] for r in runs])) >= target - 1e-12:
            return float(np.mean([r["curve"][i][0] for r in runs]))
    return None


def summarise(results: dict, gain: float) -> dict:
    """The JSON line: target, per method its tokens to it and the ratio to chain's."""
    starts = [r["curve"][0][1] for row in results.values() for r in row["runs"]]
    target = round(float(np.mean(starts)) + gain, 4)  # every method starts from the same base
    out: dict = {"target_success": target, "gain": gain, "start_success": round(
        float(np.mean(starts)), 4)}
    chain = tokens_to_target(results["chain"]["runs"], target) if "chain" in results else None
    for arm, row in results.items():
        tokens = tokens_to_target(row["runs"], target)
        out[arm] = {"tokens_to_target": None if tokens is None else round(tokens),
                    "over_chain": None if tokens is None or not chain else round(tokens / chain,
                                                                                  3),
                    "final_success": round(row["final_success"], 4),
                    "generated_tokens": round(row["generated_tokens"])}
    out["seeds"] = len(next(iter(results.values()))["runs"])
    return out


def main() -> None:
    """Run (or resume) the training runs; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "allocation.yaml"))
    parser.add_argument("--quick", action="store_true", help="the first seed only")
    parser.add_argument("--gain", type=float, default=0.03,
                        help="target = start success + this (default 0.03)")
    parser.add_argument("--fresh", action="store_true", help="move the report aside first")
    args = parser.parse_args()
    config = load_config(args.config, CompareConfig)
    if args.quick:
        config = replace(config, seeds=config.seeds[:1],
                         report_dir=str(Path(config.report_dir).with_name(
                             Path(config.report_dir).name + "_quick")))
    if config.base.eval.tasks != config.base.eval.tasks_during:
        raise SystemExit("allocation.py needs eval.tasks == eval.tasks_during (one task set)")
    if args.fresh:
        move_aside(Path(config.report_dir))
    run_compare(config)
    results = json.loads((Path(config.report_dir) / "results.json").read_text())
    print(json.dumps(summarise(results, args.gain)))


if __name__ == "__main__":
    main()
