"""Does RL raise the shipped base policy? The default training, measured start to end.

Trains from the shipped base (``configs/frozenlake_rllm.yaml``: FrozenLake in rLLM's
convention, the default strategy and optimiser) and evaluates the policy before and after on
the same held-out tasks, greedy, with 95% Wilson intervals. ``--quick`` shortens the run to
fit about six minutes on 2 CPU cores (fewer steps, 128 held-out tasks, no evaluations in
between); without it, this is exactly the README's first command.

    python bench/learning.py --quick
    python bench/learning.py            # the default training (the README's figures)
    python bench/learning.py --seeds 0 1 2   # ... and the same training at seeds 1 and 2
    python bench/learning.py --pool validation --set optim.lr=2e-4   # choosing a setting

Last line: one JSON object with ``start_success``, ``final_success``, their intervals,
``gain``, ``separated`` (the intervals do not overlap), ``steps``, ``tasks``, ``format_ok``,
``evals`` (``[step, success, tasks]`` of every held-out evaluation), ``train_seconds`` (the
whole run, evaluations included), ``step_seconds`` (the RL steps alone: rollouts and
updates, the issue's "minutes of training") and the run folder. ``--keep DIR`` copies the run's
metrics, summary and plot there (the README's default training: ``docs/default_training``).

``--seeds`` repeats the training at other seeds (``seed`` changes the training tasks drawn,
the sampling and nothing else; the start and the evaluation tasks are the same): the line's
top-level figures stay those of the first seed's run, and ``per_seed`` / ``over_seeds`` add
each run's final success, gain and ``format_ok`` and their mean, standard deviation and 95%
t-interval. A single run's figure depends on the CPU's float rounding (the same seed on an
Intel Xeon and an AMD EPYC parts after some tens of steps), so the spread over seeds is what a
user can expect; ``--pool validation`` evaluates on the validation tasks (for choosing a
setting), never the held-out ones.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from treeroll.config import load_config, merged_config
from treeroll.stats import t_interval
from treeroll.training.trainer import train

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "frozenlake_rllm.yaml"
QUICK_STEPS = 24
"""RL steps of ``--quick`` (under 6 minutes with its two 128-task evaluations)."""


def dotted(settings: list[str]) -> dict:
    """``["optim.lr=2e-4", "env.frozenlake.format_penalty=0.1"]`` as a nested config mapping
    (values read as YAML)."""
    out: dict = {}
    for item in settings:
        key, _, value = item.partition("=")
        if not key or not _:
            raise SystemExit(f"--set {item!r}: write KEY=VALUE, e.g. optim.lr=2e-4")
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return out


def run_once(config, runs_dir: str, keep: str | None) -> dict:
    """Train one run; its figures (the JSON line's fields)."""
    config.runs_dir = runs_dir
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
    if keep:
        target = Path(keep)
        target.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "summary.json", "metrics.png"):
            if (run / name).exists():
                shutil.copy(run / name, target / name)
    return {
        "policy": config.policy.init, "strategy": config.strategy.name, "seed": config.seed,
        "pool": final.get("pool", "held_out"),
        "start_success": start["success_rate"], "start_ci": [round(start["ci95_low"], 4),
                                                             round(start["ci95_high"], 4)],
        "final_success": final["success_rate"], "final_ci": [round(final["ci95_low"], 4),
                                                             round(final["ci95_high"], 4)],
        "gain": round(final["success_rate"] - start["success_rate"], 4),
        "separated": final["ci95_low"] > start["ci95_high"],
        "steps": summary["steps"], "tasks": final["tasks"],
        "format_ok": final["format_ok"], "evals": evals,
        "generated_tokens": summary["generated_tokens"], "train_seconds": round(seconds, 1),
        "step_seconds": round(step_seconds, 1), "run": str(run)}


def over_seeds(runs: list[dict]) -> dict:
    """Mean, sample standard deviation and 95% t-interval of the runs' final success and
    gain; the lowest ``format_ok``."""
    out: dict = {"seeds": [r["seed"] for r in runs],
                 "min_format_ok": round(min(r["format_ok"] for r in runs), 4)}
    for key in ("final_success", "gain"):
        values = [float(r[key]) for r in runs]
        mean, low, high = t_interval(values)
        out[key] = {"mean": round(mean, 4),
                    "sd": round(float(np.std(values, ddof=1)), 4) if len(values) > 1 else 0.0,
                    "t95": [round(low, 4), round(high, 4)] if len(values) > 1 else None}
    return out


def main() -> None:
    """Train (once per seed), print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps, 128 tasks")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--runs-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--keep", default=None, help="copy the (first) run's metrics.jsonl, "
                        "summary.json and metrics.png into this folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="train once per seed (default: the config's seed)")
    parser.add_argument("--pool", choices=("held_out", "validation"), default=None,
                        help="evaluation pool (default: the config's, held_out)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config settings on top of --config (optim.lr=2e-4 ...)")
    args = parser.parse_args()
    config = merged_config(load_config(args.config), dotted(args.set))
    if args.quick:
        config.optim = replace(config.optim, steps=QUICK_STEPS)
        config.eval = replace(config.eval, tasks=128, every=0)
    if args.pool:
        config.eval = replace(config.eval, pool=args.pool)
    runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="treeroll-learning-")
    name = "learning_quick" if args.quick else config.name
    seeds = args.seeds or [config.seed]
    runs = []
    for index, seed in enumerate(seeds):
        run_config = replace(config, seed=seed,
                             name=name if len(seeds) == 1 else f"{name}_seed{seed}")
        runs.append(run_once(run_config, runs_dir, args.keep if index == 0 else None))
    line = dict(runs[0])
    if len(runs) > 1:
        line["per_seed"] = [{k: r[k] for k in ("seed", "final_success", "final_ci", "gain",
                                                "format_ok", "generated_tokens",
                                                "step_seconds")} for r in runs]
        line["over_seeds"] = over_seeds(runs)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
