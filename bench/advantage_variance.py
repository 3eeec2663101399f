"""The seed texts' "better statistics" claim, measured on frozen trees (issue #39, H5).

A group-relative advantage is a leaf's reward minus an estimate of the task's value: the mean
reward of its group (GRPO's baseline; Tree-GRPO's inter-tree term). Its error is the error of
that estimate, the same for every leaf of the group. This measures, for chain, Tree-GRPO and
PATR with the settings and the per-task budget of ``configs/compare_hard.yaml`` (hard
FrozenLake, 512 generated tokens per task), on the frozen shipped base ``frozenlake-tiny``:

* ``truth``: each task's success probability ``p`` from ``--truth`` independent chains;
* per strategy, ``--repeats`` groups per task (different sampling seeds): the group's
  equal-weight leaf mean ``b``, its generated tokens, its leaves, whether its rewards differ;
* ``mse``: the mean over tasks and repeats of ``(b - p)^2``, less the part due to the
  truth's own sampling noise (``p(1-p)/truth``, the same for every strategy); split into the
  squared ``bias`` (``b`` averaged over repeats against ``p``, less that average's own
  spread: selective branching such as PATR's weights promising branches more) and the rest;
* ``effective_chains``: ``mean p(1-p) / mse``, the number of independent chains whose plain
  mean would estimate ``p`` as well, and ``effective_chains_per_1k_tokens``: the claim is
  that a tree buys more of them per generated token than chains do (``ratio_to_chain``).

Tasks: the first ``--tasks`` of the training pool drawn from seed 0 (never the held-out
ones). A one-sided reading: only the task-level baseline; the subtree baselines Tree-GRPO also
uses are not scored here.

    python bench/advantage_variance.py            # about 15 minutes here

Prints a table and one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from treeroll.assemble import assemble
from treeroll.cli.compare import CompareConfig, _run_config
from treeroll.config import load_config
from treeroll.engine import rollout
from treeroll.policies import load_policy
from treeroll.training.evaluation import task_pools
from treeroll.tree import leaves, trajectory_reward

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("chain", "tree_grpo", "patr")


def groups(config: object, tasks: list[int], policy: object, seed: int) -> list[dict]:
    """One group per task with ``config``'s strategy, budget and scorer: the leaf mean, the
    generated tokens, the leaves and whether the rewards differ."""
    parts = assemble(config)
    batch = rollout(tasks, parts.make_env, parts.backend(policy),
                    policy.turn_format(), parts.strategy,  # type: ignore[attr-defined]
                    config=config.rollout, scorer=parts.scorer,  # type: ignore[attr-defined]
                    allocator=parts.allocator(), seed=seed)
    out = []
    for tree in batch.trees:
        rewards = [trajectory_reward(leaf) for leaf in leaves(tree)]
        out.append({"mean": float(np.mean(rewards)) if rewards else 0.0,
                    "tokens": sum(len(n.action_ids) for n in tree.nodes),
                    "leaves": len(rewards), "signal": len(set(rewards)) > 1})
    return out


def main() -> None:
    """The truth, then each strategy's repeats; the table, then the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "compare_hard.yaml"))
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--truth", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for option, least in (("tasks", 2), ("repeats", 2), ("truth", 2), ("threads", 1)):
        if getattr(args, option) < least:
            parser.error(f"--{option} {getattr(args, option)}: needs at least {least}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    compare = load_config(args.config, CompareConfig)
    policy = load_policy(compare.base.policy.init or "frozenlake-tiny")
    runs = {arm: replace(_run_config(compare, arm, 0), threads=args.threads) for arm in ARMS}
    train, _ = task_pools(runs["chain"].env, runs["chain"].eval)
    tasks = [int(s) for s in train[:args.tasks]]
    chain = runs["chain"]
    truth_config = replace(chain, strategy=replace(  # type: ignore[call-arg]
        chain.strategy, chain=replace(chain.strategy.chain, group_size=args.truth)),
        rollout=replace(chain.rollout, max_generated_tokens=None))
    p = np.array([g["mean"] for g in groups(truth_config, tasks, policy, seed=10_000)])
    noise = float(np.mean(p * (1 - p))) / args.truth
    out: dict[str, object] = {"config": Path(args.config).name, "tasks": len(tasks),
                              "repeats": args.repeats, "truth_chains": args.truth,
                              "p_mean": round(float(p.mean()), 4),
                              "p_var_mean": round(float(np.mean(p * (1 - p))), 4)}
    found: dict[str, dict[str, float]] = {}
    for arm in ARMS:
        rows = [groups(runs[arm], tasks, policy, seed=r) for r in range(args.repeats)]
        means = np.array([[g["mean"] for g in row] for row in rows])  # repeats x tasks
        mse = max(float(np.mean((means - p) ** 2)) - noise, 1e-9)
        spread = float(np.mean(means.var(axis=0, ddof=1))) / args.repeats  # in a mean of R
        bias2 = max(float(np.mean((means.mean(axis=0) - p) ** 2)) - noise - spread, 0.0)
        tokens = float(np.mean([[g["tokens"] for g in row] for row in rows]))
        effective = float(np.mean(p * (1 - p))) / mse
        found[arm] = {"mse": round(mse, 5), "bias2": round(bias2, 5),
                    "leaves": round(float(np.mean([[g["leaves"] for g in r] for r in rows])), 2),
                    "tokens": round(tokens, 1),
                    "signal": round(float(np.mean([[g["signal"] for g in r] for r in rows])), 3),
                    "effective_chains": round(effective, 2),
                    "effective_chains_per_1k_tokens": round(1000 * effective / tokens, 3)}
        print(f"{arm}: mse {mse:.4f} (bias^2 {bias2:.4f}), {found[arm]['leaves']} leaves, "
              f"{tokens:.0f} tokens, worth {effective:.1f} chains "
              f"({found[arm]['effective_chains_per_1k_tokens']} per 1k tokens)", file=sys.stderr)
    per_1k = "effective_chains_per_1k_tokens"
    for arm in ARMS[1:]:
        found[arm]["ratio_to_chain"] = round(found[arm][per_1k] / found["chain"][per_1k], 3)
    out.update(found)
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
