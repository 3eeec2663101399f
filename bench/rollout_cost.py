"""Rollout cost: Tree-GRPO vs independent chains at the same number of leaves, on one engine.

Two settings, each through the transformers backend with its KV-cache trie (and kept
branch-point logits), the same tasks for both strategies, chains matched task by task to the
leaves the tree made:

* FrozenLake (rLLM's convention) with the shipped base policy ``frozenlake-tiny``;
* SWE tasks (the built-in ones, mini-swe-agent's convention, ``--swe-steps`` turns) with a
  from-config Llama over bytes: its replies are noise, so every turn is an invalid command
  answered with the environment's format message, but the observations are long (the task
  statement is ~1,500 bytes), which is the regime SWE rollouts live in.

Each repeat first rolls the tree out once untimed (to learn each task's leaf count; the engine
is deterministic for a fixed seed), then times the tree and the matched chains, in alternating
order (tree first on even repeats, chains first on odd ones), so machine noise and cache
warmth hit both. Prints a table and, as its last line, one JSON object:

* ``computed_over_unique`` -- tokens the backend computed for the FrozenLake trees (prefill +
  decode, less the shared and the reused ones) / unique tokens of the trees (their token trie,
  identical sibling turns merged). It stays above 1.0 by its definition: its excess is
  ``boundary_tokens`` = computed - forwarded, one a turn: a turn's last sampled token counts
  as computed when sampled and is fed once, in the next turn's prefill (or never, at a leaf,
  where the trie counts it unique but not fed).
* ``forwarded_over_unique`` -- tokens fed through the model / the trie's tokens that must be
  fed (all but those nothing follows): the engine's redundancy against the merged trie, 1.0
  when every position the trees' contexts hold is fed once (below 1.0 when trees of one
  batch share a prompt prefix the cache serves across tasks: the trie is per tree).
  ``replayed_turn_tokens``: sampled tokens repeating, token for token, a turn an earlier
  request had sampled in the same context; within one call the HF backend decodes them in one
  row (``shared_tokens``), across calls it samples them from kept logits (``reused_tokens``)
  without a forward.
* ``forwarded_over_needed`` -- tokens fed through the model / tokens the trees' nodes hold
  that must be fed (``treeroll.tree.TokenCounts``): the engine's own redundancy (below 1 when
  the cache also merged identical siblings); ``branch_points_refed`` -- requests whose whole
  prompt was cached but whose last token was fed again for its logits (0 with kept logits).
* ``tree_over_chain_wall_per_leaf`` -- FrozenLake rollout wall time per leaf, tree / chain
  (median of the repeats); ``swe_tree_over_chain_wall_per_leaf`` -- the same on SWE tasks.
* the token figures behind them, per leaf, for both.

Both run on the unsynchronised engine (each of a task's M trees expanded as soon as its chain
ends); ``--synchronous`` runs the released code's batched rounds instead (the trainer's
default; ``bench/engine_step.py`` times the two on the default training's batches). Then
both settings run again with continuous batching (``RolloutConfig.continuous``: a request
joins the running decode batch when its observation is ready, and each reply's environment
step starts when that reply ends): the ``continuous_*`` figures.

Usage: ``python bench/rollout_cost.py --quick`` (a few minutes) or without ``--quick``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.envs.swe import builtin_tasks, make_swe_env
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.policies import load_policy
from treeroll.policies.model import ModelConfig, build_model
from treeroll.strategies import Chain, TreeGRPO
from treeroll.tree import TokenCounts, token_counts


class MatchedChain(Chain):
    """Independent chains with a per-task group size (matched to another strategy's leaves)."""

    def __init__(self, sizes: dict[int, int]) -> None:
        super().__init__(group_size=1)
        self.sizes = sizes

    def start(self, tree, ctx):  # type: ignore[no-untyped-def]
        """``sizes[task]`` copies of the root."""
        return [tree.root] * self.sizes[tree.task_seed]


def compare(fresh_backend: Callable[[], Any], turn_format: TurnFormat,
            make_env: Callable[[], Any], seeds: np.ndarray, settings: RolloutConfig,
            repeats: int, per_batch: int, tree: object | None = None
            ) -> tuple[dict[str, list[float]], dict[str, TokenCounts], dict[str, int]]:
    """Wall seconds per leaf (one entry per repeat), token totals and the backend's count of
    refed branch points, tree and chain; every run on ``fresh_backend()`` (an empty cache).
    ``tree``: the tree strategy (default Tree-GRPO M = 4, N = 2, L = 1: up to M(LN + 1) = 12
    leaves per task). ``bench/server_backend.py`` and ``bench/real_model.py`` run this on
    their backends too."""
    tree = tree if tree is not None else TreeGRPO(m=4, n=2, l=1)

    def run(strategy: object, tasks: np.ndarray, seed: int
            ) -> tuple[float, TokenCounts, dict[int, int], int]:
        backend = fresh_backend()
        start = time.perf_counter()
        batch = rollout(tasks, make_env, backend, turn_format, strategy,  # type: ignore[arg-type]
                        config=settings, seed=seed)
        wall = time.perf_counter() - start
        sizes = {t.task_seed: token_counts(t).leaves for t in batch.trees}
        counts = sum((token_counts(t) for t in batch.trees), TokenCounts())
        return wall, counts, sizes, int(backend.stats.get("refed", 0))

    walls: dict[str, list[float]] = {"tree": [], "chain": []}
    totals = {"tree": TokenCounts(), "chain": TokenCounts()}
    refed = {"tree": 0, "chain": 0}
    for r in range(repeats):
        tasks = seeds[r * per_batch:(r + 1) * per_batch]
        _, _, sizes, _ = run(tree, tasks, seed=r)  # untimed: each task's leaves
        order = [("tree", tree), ("chain", MatchedChain(sizes))]
        for name, strategy in (order if r % 2 == 0 else order[::-1]):
            wall, counts, _, again = run(strategy, tasks, seed=r)
            walls[name].append(wall / max(counts.leaves, 1))
            totals[name] = totals[name] + counts
            refed[name] += again
    return walls, totals, refed


def main() -> None:
    """Run both settings and print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few tasks, two repeats")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--synchronous", action="store_true",
                        help="the released code's batched rounds (the trainer's default) "
                        "instead of the unsynchronised engine")
    parser.add_argument("--swe-steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    per_batch, repeats = (8, 2) if args.quick else (32, 5)
    swe_batch, swe_repeats = (4, 2) if args.quick else (8, 3)

    policy = load_policy("frozenlake-tiny")
    policy.model.eval()
    lake = lambda: make_frozenlake("rllm")
    seeds = np.random.default_rng(0).choice(1_000_000, size=400, replace=False)
    settings = RolloutConfig(max_turn_tokens=16, synchronous=args.synchronous)
    pad = policy.tokenizer.pad_token_id or 0
    walls, totals, refed = compare(lambda: HFBackend(policy.model, pad_token_id=pad),
                                   policy.turn_format(), lake, seeds, settings, repeats,
                                   per_batch)

    swe_tasks = builtin_tasks()
    byte_model = build_model(ByteTokenizer.vocab_size, ModelConfig(seed=0),
                             pad_token_id=0,
                             eos_token_id=ByteTokenizer.eos_token_id).eval()
    swe = lambda: make_swe_env("mini", swe_tasks, step_limit=args.swe_steps)
    swe_seeds = np.arange(len(swe_tasks))
    swe_seeds = np.resize(swe_seeds, swe_batch * swe_repeats)
    swe_settings = RolloutConfig(max_turn_tokens=16, synchronous=args.synchronous,
                                 env_workers=4)
    swe_walls, swe_totals, _ = compare(lambda: HFBackend(byte_model, pad_token_id=0),
                                       TurnFormat(ByteTokenizer()), swe, swe_seeds,
                                       swe_settings, swe_repeats, swe_batch)

    # The same comparisons with continuous batching (requests join the running decode batch;
    # each reply's environment step starts when that reply ends).
    streaming = dataclasses.replace(settings, synchronous=False, continuous=True)
    c_walls, c_totals, _ = compare(lambda: HFBackend(policy.model, pad_token_id=pad),
                                   policy.turn_format(), lake, seeds, streaming, repeats,
                                   per_batch)
    swe_streaming = dataclasses.replace(swe_settings, synchronous=False, continuous=True)
    c_swe_walls, _, _ = compare(lambda: HFBackend(byte_model, pad_token_id=0),
                                TurnFormat(ByteTokenizer()), swe, swe_seeds, swe_streaming,
                                swe_repeats, swe_batch)

    t, c = totals["tree"], totals["chain"]
    st, sc = swe_totals["tree"], swe_totals["chain"]

    def ratio(w: dict[str, list[float]]) -> float:
        return round(statistics.median(w["tree"]) / statistics.median(w["chain"]), 4)

    result = {
        "computed_over_unique": round(t.computed / max(t.unique, 1), 4),
        "forwarded_over_unique": round(t.forwarded_over_unique, 4),
        "boundary_tokens": t.computed - t.forwarded,
        "replayed_turn_tokens": t.replayed,
        "shared_tokens": t.shared,
        "reused_tokens": t.reused,
        "forwarded_over_needed": round(t.forwarded_over_needed, 4),
        "branch_points_refed": refed["tree"],
        "tree_over_chain_wall_per_leaf": ratio(walls),
        "swe_tree_over_chain_wall_per_leaf": ratio(swe_walls),
        "chain_computed_over_unique": round(c.computed / max(c.unique, 1), 4),
        "chain_forwarded_over_unique": round(c.forwarded_over_unique, 4),
        "continuous_tree_over_chain_wall_per_leaf": ratio(c_walls),
        "continuous_swe_tree_over_chain_wall_per_leaf": ratio(c_swe_walls),
        "continuous_tree_wall_per_leaf_ms": round(1000 * statistics.median(c_walls["tree"]), 2),
        "continuous_chain_wall_per_leaf_ms": round(1000 * statistics.median(c_walls["chain"]),
                                                   2),
        "continuous_forwarded_over_unique": round(c_totals["tree"].forwarded_over_unique, 4),
        "tree_generated_per_leaf": round(t.generated / max(t.leaves, 1), 2),
        "chain_generated_per_leaf": round(c.generated / max(c.leaves, 1), 2),
        "tree_computed_per_leaf": round(t.computed / max(t.leaves, 1), 2),
        "chain_computed_per_leaf": round(c.computed / max(c.leaves, 1), 2),
        "swe_tree_computed_per_leaf": round(st.computed / max(st.leaves, 1), 2),
        "swe_chain_computed_per_leaf": round(sc.computed / max(sc.leaves, 1), 2),
        "tree_leaves": t.leaves,
        "chain_leaves": c.leaves,
        "swe_tree_leaves": st.leaves,
        "tree_wall_per_leaf_ms": round(1000 * statistics.median(walls["tree"]), 2),
        "chain_wall_per_leaf_ms": round(1000 * statistics.median(walls["chain"]), 2),
        "swe_tree_wall_per_leaf_ms": round(1000 * statistics.median(swe_walls["tree"]), 2),
        "swe_chain_wall_per_leaf_ms": round(1000 * statistics.median(swe_walls["chain"]), 2),
        "tasks": per_batch * repeats,
        "swe_tasks": swe_batch * swe_repeats,
        "repeats": repeats,
        "synchronous": args.synchronous,
        "policy": "frozenlake-tiny (shipped base); SWE: from-config byte Llama",
        "note": "chains get the same leaves per task as the tree; both share the prompt "
                "through the backend's prefix cache",
        "convention": "frozenlake rllm (non-slippery, sizes 2-9); swe mini",
    }
    print(f"{'':10}{'leaves':>8}{'gen/leaf':>10}{'computed/leaf':>15}{'ms/leaf':>10}")
    for label, tots, w in (("tree", totals, walls), ("chain", totals, walls),
                           ("swe tree", swe_totals, swe_walls),
                           ("swe chain", swe_totals, swe_walls)):
        key = label.split()[-1]
        counts = tots[key]
        print(f"{label:10}{counts.leaves:>8}{counts.generated / max(counts.leaves, 1):>10.1f}"
              f"{counts.computed / max(counts.leaves, 1):>15.1f}"
              f"{1000 * statistics.median(w[key]):>10.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
