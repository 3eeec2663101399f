"""Rollout cost: Tree-GRPO vs independent chains at the same number of leaves.

Both run on FrozenLake (rLLM's convention) with the embedded default policy after a short
format warm start, through the same transformers backend with its KV-cache trie, on the same
tasks, alternating A/B repeats so machine noise hits both. Prints a table and, as its last
line, one JSON object:

* ``computed_over_unique`` -- tokens the backend computed for the trees (prefill + decode) /
  unique tokens of the trees (their token trie). 1.0 means every token computed once.
* ``tree_over_chain_wall_per_leaf`` -- rollout wall time per leaf, tree / chain (median of
  the repeats).
* the token figures behind them, per leaf, for both.

Usage: ``python bench/rollout_cost.py --quick`` (about a minute) or without ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.backends.local import ModelConfig, build_model, build_word_tokenizer
from treeroll.config import PolicyConfig
from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.policies import Policy
from treeroll.rollout import RolloutConfig, rollout
from treeroll.strategies import Chain, TreeGRPO
from treeroll.training.sft_run import format_warm_start
from treeroll.tree import TokenCounts, token_counts


class MatchedChain(Chain):
    """Independent chains with a per-task group size (matched to another strategy's leaves)."""

    def __init__(self, sizes: dict[int, int]) -> None:
        super().__init__(group_size=1)
        self.sizes = sizes

    def start(self, tree, ctx):  # type: ignore[no-untyped-def]
        """``sizes[task]`` copies of the root."""
        return [tree.root] * self.sizes[tree.task_seed]


def main() -> None:
    """Run the comparison and print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few tasks, two repeats")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tasks_per_batch, repeats, warm = (8, 2, 40) if args.quick else (32, 5, 60)

    make_env = lambda: make_frozenlake("rllm")
    tokenizer = build_word_tokenizer(make_env().vocabulary_texts())
    model = build_model(len(tokenizer), ModelConfig(), pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    turn_format = TurnFormat(tokenizer)
    rng = np.random.default_rng(0)
    seeds = rng.choice(1_000_000, size=400, replace=False)
    format_warm_start(Policy(model, tokenizer), make_env, seeds,
                      PolicyConfig(init=None, warm_start_steps=warm, warm_start_batch=16), rng)
    model.eval()
    settings = RolloutConfig(max_turn_tokens=12)
    tree = TreeGRPO(m=4, n=2, l=1)  # up to M(LN + 1) = 12 leaves per task

    def run(strategy: object, tasks: np.ndarray, seed: int
            ) -> tuple[float, TokenCounts, dict[int, int]]:
        backend = HFBackend(model)
        start = time.perf_counter()
        batch = rollout(tasks, make_env, backend, turn_format, strategy,  # type: ignore[arg-type]
                        config=settings, seed=seed)
        wall = time.perf_counter() - start
        sizes = {t.task_seed: token_counts(t).leaves for t in batch.trees}
        return wall, sum((token_counts(t) for t in batch.trees), TokenCounts()), sizes

    walls: dict[str, list[float]] = {"tree": [], "chain": []}
    totals = {"tree": TokenCounts(), "chain": TokenCounts()}
    for r in range(repeats):
        tasks = seeds[r * tasks_per_batch:(r + 1) * tasks_per_batch]
        # Same leaves per task: Tree-GRPO first (a task whose chains all end at once has
        # nothing to branch from, so it gets fewer leaves), then chains matched task by task.
        # Every other repeat runs a matched chain batch first, with the previous sizes.
        wall, counts, sizes = run(tree, tasks, seed=r)
        walls["tree"].append(wall / max(counts.leaves, 1))
        totals["tree"] = totals["tree"] + counts
        wall, counts, _ = run(MatchedChain(sizes), tasks, seed=r)
        walls["chain"].append(wall / max(counts.leaves, 1))
        totals["chain"] = totals["chain"] + counts

    t, c = totals["tree"], totals["chain"]
    result = {
        "computed_over_unique": round(t.computed / max(t.unique, 1), 4),
        "tree_over_chain_wall_per_leaf": round(statistics.median(walls["tree"])
                                               / statistics.median(walls["chain"]), 4),
        "chain_computed_over_unique": round(c.computed / max(c.unique, 1), 4),
        "tree_generated_per_leaf": round(t.generated / max(t.leaves, 1), 2),
        "chain_generated_per_leaf": round(c.generated / max(c.leaves, 1), 2),
        "tree_computed_per_leaf": round(t.computed / max(t.leaves, 1), 2),
        "chain_computed_per_leaf": round(c.computed / max(c.leaves, 1), 2),
        "tree_unique_over_chain_equivalent": round(t.unique / max(t.chain_unique, 1), 4),
        "tree_leaves": t.leaves,
        "chain_leaves": c.leaves,
        "tree_wall_per_leaf_ms": round(1000 * statistics.median(walls["tree"]), 2),
        "chain_wall_per_leaf_ms": round(1000 * statistics.median(walls["chain"]), 2),
        "tasks": tasks_per_batch * repeats,
        "repeats": repeats,
        "note": "chains get the same leaves per task as the tree; both share the prompt "
                "through the backend's prefix cache",
        "convention": "frozenlake rllm (non-slippery, sizes 2-9)",
    }
    print(f"{'':8}{'leaves':>8}{'gen/leaf':>10}{'computed/leaf':>15}{'ms/leaf':>10}")
    for name, counts in totals.items():
        print(f"{name:8}{counts.leaves:>8}{counts.generated / max(counts.leaves, 1):>10.1f}"
              f"{counts.computed / max(counts.leaves, 1):>15.1f}"
              f"{1000 * statistics.median(walls[name]):>10.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
