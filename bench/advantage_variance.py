"""The seed texts' "better statistics" claim, measured on frozen trees (issue #39, H5).

A group-relative advantage is a leaf's reward minus an estimate of the task's value: the mean
reward of its group (GRPO's baseline; Tree-GRPO's inter-tree term). Its error is the error of
that estimate, the same for every leaf of the group. This measures, for chain, Tree-GRPO and
PATR with the settings and the per-task budget of ``configs/compare_hard.yaml`` (hard
FrozenLake, 512 generated tokens per task), on the frozen shipped base ``frozenlake-tiny``:

* ``truth``: each task's success probability ``p`` from ``--truth`` independent chains;
* per strategy, ``--repeats`` groups per task (different sampling seeds): the group's
  equal-weight leaf mean ``b``, its generated tokens, its leaves, whether its rewards differ,
  and the share of its leaves the token cap ended (``cut_by_budget``: unrewarded);
* ``variance``: the variance of ``b`` over the repeats, averaged over tasks: the noise the
  baseline puts into every advantage of the group;
* ``effective_chains``: ``mean p(1-p) / variance``, the number of independent chains whose
  plain mean would be as steady, and ``effective_chains_per_1k_tokens``: the claim is that a
  tree buys more of them per generated token than chains do (``ratio_to_chain``, with a
  bootstrap 95% interval over tasks, ``ratio_ci95``);
* ``mse``: the mean over tasks and repeats of ``(b - p)^2``, less the part due to the
  truth's own sampling noise (``p(1-p)/truth``); ``bias2`` its squared bias (``b`` averaged
  over repeats against ``p``, less that average's own spread). The truth is measured without
  the token cap and the groups with it, so the bias holds both what the cap cuts short (a
  branch out of tokens ends unrewarded) and what selective branching weights (PATR's
  promising branches count more in an equal-weight leaf mean); the variance holds neither.

Tasks: the first ``--tasks`` of the training pool drawn from seed 0 (never the held-out
ones). A one-sided reading: only the task-level baseline; the subtree baselines Tree-GRPO also
uses are not scored here.

    python bench/advantage_variance.py            # about 20 minutes here

Prints a table and one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from treeroll.assemble import assemble
from treeroll.cli.compare import CompareConfig, arm_config
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
        ends = leaves(tree)
        rewards = [trajectory_reward(leaf) for leaf in ends]
        out.append({"mean": float(np.mean(rewards)) if rewards else 0.0,
                    "cut": float(np.mean([leaf.status == "budget" for leaf in ends]))
                    if ends else 0.0,
                    "tokens": sum(len(n.action_ids) for n in tree.nodes),
                    "leaves": len(rewards), "signal": len(set(rewards)) > 1})
    return out


def _shown(x: float, digits: int) -> float | None:
    return round(x, digits) if math.isfinite(x) else None


def worth(p: np.ndarray, spread: np.ndarray, tokens: np.ndarray) -> tuple[float, float]:
    """How many independent chains a group's leaf mean is worth (``mean p(1-p)`` over its
    variance over repeats, both averaged over tasks), and that per 1k generated tokens; inf
    where the variance is 0."""
    variance = float(spread.mean())
    chains = float(np.mean(p * (1 - p))) / variance if variance > 0 else math.inf
    return chains, 1000 * chains / float(tokens.mean())


def ratio_to_chain(p: np.ndarray, spread: np.ndarray, tokens: np.ndarray,
                   chain_spread: np.ndarray, chain_tokens: np.ndarray,
                   resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Effective chains per 1k tokens over chain's, with a bootstrap 95% interval over tasks
    (the same tasks resampled on both sides: the groups are paired by task); nan where
    chain's is not finite."""
    def ratio(pick: np.ndarray) -> float:
        mine, theirs = worth(p[pick], spread[pick], tokens[pick])[1], worth(
            p[pick], chain_spread[pick], chain_tokens[pick])[1]
        return mine / theirs if math.isfinite(theirs) and theirs > 0 else math.nan
    rng = np.random.default_rng(seed)
    samples = np.array([ratio(rng.integers(0, len(p), len(p))) for _ in range(resamples)])
    samples = samples[np.isfinite(samples)]
    point = ratio(np.arange(len(p)))
    if not len(samples):
        return point, math.nan, math.nan
    return point, float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))


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
    runs = {arm: replace(arm_config(compare, arm, 0), threads=args.threads) for arm in ARMS}
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
    found: dict[str, dict[str, float | list[float | None] | None]] = {}
    spread_of, tokens_of = {}, {}
    for arm in ARMS:
        rows = [groups(runs[arm], tasks, policy, seed=r) for r in range(args.repeats)]
        means = np.array([[g["mean"] for g in row] for row in rows])  # repeats x tasks
        spread_of[arm] = means.var(axis=0, ddof=1)  # per task, over the repeats
        tokens_of[arm] = np.array([[g["tokens"] for g in row] for row in rows]).mean(axis=0)
        mse = float(np.mean((means - p) ** 2)) - noise
        bias2 = max(float(np.mean((means.mean(axis=0) - p) ** 2)) - noise
                    - float(spread_of[arm].mean()) / args.repeats, 0.0)
        effective = worth(p, spread_of[arm], tokens_of[arm])
        found[arm] = {"mse": round(mse, 5), "bias2": round(bias2, 5),
                      "variance": round(float(spread_of[arm].mean()), 5),
                      "leaves": round(float(np.mean([[g["leaves"] for g in r] for r in rows])), 2),
                      "tokens": round(float(tokens_of[arm].mean()), 1),
                      "signal": round(float(np.mean([[g["signal"] for g in r] for r in rows])), 3),
                      "cut_by_budget": round(float(np.mean([[g["cut"] for g in r] for r in rows])),
                                             3),
                      "effective_chains": _shown(effective[0], 2),
                      "effective_chains_per_1k_tokens": _shown(effective[1], 3)}
        print(f"{arm}: variance {found[arm]['variance']}, squared error {mse:.4f} (bias^2 "
              f"{bias2:.4f}), {found[arm]['leaves']} leaves, {found[arm]['tokens']} tokens, "
              f"worth {found[arm]['effective_chains']} chains "
              f"({found[arm]['effective_chains_per_1k_tokens']} per 1k tokens)", file=sys.stderr)
    for arm in ARMS[1:]:
        ratio, low, high = ratio_to_chain(p, spread_of[arm], tokens_of[arm],
                                          spread_of["chain"], tokens_of["chain"])
        found[arm]["ratio_to_chain"] = _shown(ratio, 3)
        found[arm]["ratio_ci95"] = [_shown(low, 3), _shown(high, 3)]
    out.update(found)
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
