"""What does PATR's process scoring cost, and how many leaves does its tree buy per token?

On FrozenLake (rLLM convention, PATR's benchmark) with the shipped base policy
``frozenlake-tiny`` (``--policy none``: the embedded default, a small Llama over the
environment's word vocabulary after a short *format* warm start), the same tasks are rolled
out with chains (GRPO's group), PATR with a process scorer, and (not with ``--quick``)
PATR's random-tree counterpart (same schedule, random scores, no score pruning).
Prints a few readable lines, then, as its last line, one JSON object:

* ``scorer_time_fraction`` -- share of PATR's rollout wall time spent in the scorer (target
  < 0.10);
* ``leaves_per_1k_tokens_over_chain`` -- PATR's leaves per 1,000 generated tokens divided by
  the chains' (target > 1.5);
* per strategy: leaves, generated / computed tokens, wall seconds, leaf success rate, task
  solve rate (any leaf succeeded), leaves per 1k generated and per 1k computed tokens;
* ``k_turns`` and why: PATR's paper uses K = 5 on FrozenLake, but rLLM maps allow
  ``2 * size`` turns and a from-scratch policy falls into a hole or reaches the goal in a few
  turns, so K = 5 would score after most episodes have ended and PATR would degenerate into
  B0 chains. The bench measures the chains' median episode length L and uses
  ``K = max(1, min(5, L // 3))`` (about three scoring rounds per typical episode) unless
  ``--k`` is given. Both strategies get the same leaf budget per task (``--max-leaves``).

``--quick`` (8 tasks, 20 warm-start steps, no random tree) takes a few minutes on 2 CPU cores.

    python bench/patr_cost.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.config import PolicyConfig
from treeroll.engine import RolloutBatch, RolloutConfig, rollout
from treeroll.envs.frozenlake import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.policies import Policy, load_policy
from treeroll.policies.model import ModelConfig, build_model, build_word_tokenizer
from treeroll.scorers import ScorerConfig, make_scorer
from treeroll.strategies import PATR, Chain, RandomTree
from treeroll.training.sft_run import format_warm_start
from treeroll.tree import leaves, token_counts


def summarise(batch: RolloutBatch) -> dict[str, float]:
    """Leaves, tokens, time and success of one strategy's batch."""
    counts = token_counts(batch.trees[0])
    for tree in batch.trees[1:]:
        counts = counts + token_counts(tree)
    group = [leaf for tree in batch.trees for leaf in leaves(tree)]
    solved = sum(any(leaf.info.get("success") for leaf in leaves(tree)) for tree in batch.trees)
    depths = [leaf.depth for leaf in group]
    return {
        "leaves": counts.leaves,
        "generated_tokens": counts.generated,
        "computed_tokens": counts.computed,
        "wall_s": round(batch.timing["total"], 3),
        "score_s": round(batch.timing.get("score", 0.0), 4),
        "leaf_success_rate": round(sum(bool(n.info.get("success")) for n in group)
                                   / max(len(group), 1), 4),
        "task_solve_rate": round(solved / max(len(batch.trees), 1), 4),
        "pruned_leaves": sum(n.status == "pruned" for n in group),
        "median_leaf_depth": float(statistics.median(depths)) if depths else 0.0,
        "leaves_per_1k_generated": round(1000 * counts.leaves / max(counts.generated, 1), 3),
        "leaves_per_1k_computed": round(1000 * counts.leaves / max(counts.computed, 1), 3),
    }


def main() -> None:
    """Warm-start the default policy, roll out chain / PATR / random tree, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (CI)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks (default 8 / 64)")
    parser.add_argument("--max-leaves", type=int, default=16, help="leaf budget per task")
    parser.add_argument("--scorer", default="frozenlake_progress",
                        help="PATR's scorer: frozenlake_progress, degeneracy, blend (progress "
                        "and degeneracy, lambda 0.7), ...")
    parser.add_argument("--k", type=int, default=None, help="PATR's K (default: see docstring)")
    parser.add_argument("--m", type=int, default=2, help="PATR's children per expansion (M)")
    parser.add_argument("--alpha", type=float, default=0.5,
                        help="PATR's prune margin below the median score")
    parser.add_argument("--group-size", type=int, default=8, help="chains per task")
    parser.add_argument("--warm-start-steps", type=int, default=None,
                        help="format warm-start steps (default 20 / 60)")
    parser.add_argument("--policy", default="frozenlake-tiny",
                        help="a shipped policy or a policy folder; 'none' builds the embedded "
                        "default from scratch with a format warm start")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n_tasks = args.tasks or (8 if args.quick else 64)
    steps = args.warm_start_steps if args.warm_start_steps is not None else (
        20 if args.quick else 60)

    def make_env() -> Any:
        return make_frozenlake("rllm")

    rng = np.random.default_rng(args.seed)
    tick = time.perf_counter()
    loss = float("nan")
    if args.policy != "none":
        policy = load_policy(args.policy)
        model, tokenizer, turn_format = policy.model, policy.tokenizer, policy.turn_format()
        steps = 0
    else:
        tokenizer = build_word_tokenizer(make_env().vocabulary_texts())
        model = build_model(len(tokenizer), ModelConfig(seed=args.seed),
                            pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
        turn_format = TurnFormat(tokenizer)
    if steps:
        loss = format_warm_start(Policy(model, tokenizer), make_env,
                                 np.arange(100_000, 110_000),
                                 PolicyConfig(init=None, warm_start_steps=steps), rng)
    warm_seconds = time.perf_counter() - tick
    model.eval()
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id or 0)
    tasks = [int(s) for s in rng.integers(1_000_000, size=n_tasks)]
    config = RolloutConfig(max_leaves=args.max_leaves)

    def run(strategy: Any, scorer: Any = None) -> RolloutBatch:
        backend.reset_cache()  # every strategy starts from a cold prefix cache
        return rollout(tasks, make_env, backend, turn_format, strategy, config=config,
                       scorer=scorer, seed=args.seed)

    print(f"[patr_cost] chains: {n_tasks} tasks x {args.group_size}", flush=True)
    chain = summarise(run(Chain(group_size=args.group_size)))
    median_turns = chain["median_leaf_depth"]
    k_turns = args.k or max(1, min(5, int(median_turns) // 3))
    k_reason = ("given with --k" if args.k else
                f"median chain episode is {median_turns:g} turns; K = max(1, min(5, L // 3)) "
                "gives about three scoring rounds inside a typical episode "
                "(the paper's K = 5 would mostly score after episodes ended)")
    scorer = make_scorer(ScorerConfig(name=args.scorer))
    schedule = dict(b0=4, k_turns=k_turns, top_k=2, m=args.m, alpha=args.alpha, theta=6)
    print(f"[patr_cost] PATR (K={k_turns}, scorer {args.scorer})", flush=True)
    patr_batch = run(PATR(**schedule), scorer)  # type: ignore[arg-type]
    patr = summarise(patr_batch)
    rows = {"chain": chain, "patr": patr}
    if not args.quick:
        print("[patr_cost] random tree (same schedule)", flush=True)
        rows["random_tree"] = summarise(run(RandomTree(**schedule)))  # type: ignore[arg-type]
    for name, row in rows.items():
        print(f"[patr_cost] {name:12s} " + " ".join(f"{k}={v}" for k, v in row.items()),
              flush=True)
    result = {
        "scorer_time_fraction": round(patr_batch.timing.get("score", 0.0)
                                      / max(patr_batch.timing["total"], 1e-9), 5),
        "leaves_per_1k_tokens_over_chain": round(patr["leaves_per_1k_generated"]
                                                 / max(chain["leaves_per_1k_generated"], 1e-9),
                                                 3),
        "leaves_per_1k_computed_over_chain": round(patr["leaves_per_1k_computed"]
                                                   / max(chain["leaves_per_1k_computed"], 1e-9),
                                                   3),
        "scorer": args.scorer,
        "scorer_ms_per_node": round(1000 * patr_batch.timing.get("score", 0.0)
                                    / max(patr_batch.trees[0].meta.get("scored_nodes_batch", 0),
                                          1), 4),
        "k_turns": k_turns,
        "k_turns_reason": k_reason,
        "patr_schedule": schedule,
        "tasks": n_tasks,
        "chain_group_size": args.group_size,
        "max_leaves_per_task": args.max_leaves,
        "policy": args.policy,
        "warm_start_steps": steps,
        "warm_start_loss": round(loss, 4),
        "warm_start_s": round(warm_seconds, 2),
        "quick": args.quick,
        **rows,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
