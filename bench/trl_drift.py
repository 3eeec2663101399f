"""Does the 20-step TRL run's tree drift (issue #39, H6)? The G = 4 runs of
``bench/trl_adapter.py`` (chain, and EarlyForks' exact-G tree) repeated over rollout seeds.

``bench/trl_adapter.py`` runs each arm once, with rollout seed 0; over its 20 steps the tree
run's rows grew to 2.7x a chain row's and its generated tokens per completion to 2.0x the
chains'. This asks whether that is the shape (a group that over-represents episodes that go
on, through EarlyForks' fork from the last turn before an end) or one run: the same G = 4
runs (TRL's ``GRPOTrainer``, the shipped base ``frozenlake-tiny``, the same 40 training tasks,
20 steps, two tasks a step), with a third arm, ``tree_repeat`` (EarlyForks with
``on_end="repeat"``: an ended branch's owed rows repeat it, so every row is a sample of the
policy's episodes), at rollout seeds 0, 1 and 2 (the model's initial weights and the
tasks are the same in every run; the seed changes the sampled episodes and so the updates).

Per run: generated tokens per completion over the whole run and over its last 10 steps, and
the mean environment reward of its rows over its first and last 10 steps. Prints one line per
run and, as its last line, one JSON object: ``tree_over_chain_tokens_per_completion`` (the
ratio of the seeds' means), the same per seed (``per_seed_tree_over_chain``), the last-10-step
ratio (``..._late``), the same three for ``tree_repeat`` (``tree_repeat_over_chain_...``,
``per_seed_tree_repeat_over_chain``), and each arm's per-seed summaries under its name.

Usage: ``python bench/trl_drift.py`` (about 5 minutes here) or ``--seeds 0 1 2 3``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import torch

from treeroll.config import EvalConfig
from treeroll.envs import EnvConfig
from treeroll.strategies import EarlyForks
from treeroll.training.evaluation import task_pools
from trl_adapter import run_tree

STEPS = 20


def summary(run: dict[str, Any]) -> dict[str, float]:
    """Tokens per completion (whole run, last half) and mean row reward (first, last half)."""
    steps = run["per_step"]
    half = len(steps) // 2

    def tokens(part: list[dict[str, float]]) -> float:
        return sum(s["generated"] for s in part) / sum(s["rows"] for s in part)

    return {"tokens_per_completion": round(tokens(steps), 2),
            "tokens_per_completion_late": round(tokens(steps[half:]), 2),
            "reward_early": round(float(np.mean([s["reward"] for s in steps[:half]])), 4),
            "reward_late": round(float(np.mean([s["reward"] for s in steps[half:]])), 4)}


def main(argv: list[str] | None = None) -> None:
    """Run chain, tree and tree_repeat at G = 4 per seed; a line per run, then the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train, _ = task_pools(EnvConfig(name="frozenlake_rllm"), EvalConfig())
    tasks = [int(s) for s in train[:2 * STEPS]]
    shapes = {"chain": None, "tree": EarlyForks(group_size=4),
              "tree_repeat": EarlyForks(group_size=4, on_end="repeat")}
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in shapes}
    for seed in args.seeds:
        for arm, shape in shapes.items():
            result = summary(run_tree("chain", tasks, STEPS, early_forks=shape,
                                      rollout_seed=seed))
            runs[arm].append(result)
            print(f"seed {seed} {arm:11s} {json.dumps(result)}", file=sys.stderr, flush=True)

    def mean(arm: str, key: str) -> float:
        return float(np.mean([r[key] for r in runs[arm]]))

    def over_chain(arm: str) -> dict[str, Any]:
        return {
            "tokens_per_completion": round(mean(arm, "tokens_per_completion")
                                           / mean("chain", "tokens_per_completion"), 4),
            "tokens_per_completion_late": round(mean(arm, "tokens_per_completion_late")
                                                / mean("chain", "tokens_per_completion_late"), 4),
            "per_seed": [round(t["tokens_per_completion"] / c["tokens_per_completion"], 4)
                         for t, c in zip(runs[arm], runs["chain"], strict=True)]}

    tree, repeat = over_chain("tree"), over_chain("tree_repeat")
    print(json.dumps({
        "tree_over_chain_tokens_per_completion": tree["tokens_per_completion"],
        "tree_over_chain_tokens_per_completion_late": tree["tokens_per_completion_late"],
        "per_seed_tree_over_chain": tree["per_seed"],
        "tree_repeat_over_chain_tokens_per_completion": repeat["tokens_per_completion"],
        "tree_repeat_over_chain_tokens_per_completion_late":
            repeat["tokens_per_completion_late"],
        "per_seed_tree_repeat_over_chain": repeat["per_seed"],
        **runs,
        "seeds": args.seeds, "steps": STEPS, "num_generations": 4, "tasks_per_step": 2,
    }))


if __name__ == "__main__":
    main()
