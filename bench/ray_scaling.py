"""Tree rollouts over Ray: rollouts per second with 1 and 2 workers, and whether the trees are
the single-process engine's.

FrozenLake (rLLM's convention), the shipped base policy ``frozenlake-tiny``, Tree-GRPO
(m=4, n=2, l=1), the unsynchronised engine. One local Ray cluster (``ray.init(num_cpus=W)``
for the largest worker count); each worker is an actor with one CPU and one torch thread, its
own copy of the policy and its own transformers backend. The single-process reference runs
with one torch thread too, so the comparison is per core. Each setting first runs a warm-up
batch (actor start, first forward), then ``--repeats`` timed batches; a rollout is one leaf
(trajectory). ``identical_to_local`` is :func:`treeroll.distributed.same_trees` of every
worker count's trees against the single-process trees of the same tasks and seed.

On this 2-core machine 2 workers can at best double the rate; the driver and Ray's own
processes share those cores.

Usage: ``python bench/ray_scaling.py --quick``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import ray
import torch

from treeroll.backends.hf import HFBackend
from treeroll.distributed import RayRollout, same_trees
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.policies import load_policy
from treeroll.strategies import TreeGRPO
from treeroll.tree import token_counts


def make_env():  # type: ignore[no-untyped-def]
    """FrozenLake, rLLM's convention."""
    return make_frozenlake("rllm")


def main() -> None:
    """Time 1 and 2 workers against one process; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 tasks a batch, 2 repeats")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    tasks_per_batch, repeats = (16, 2) if args.quick else (64, 3)
    torch.set_num_threads(1)
    policy = load_policy("frozenlake-tiny")
    policy.model.eval()
    strategy, config = TreeGRPO(m=4, n=2, l=1), RolloutConfig(synchronous=False,
                                                              max_turn_tokens=16)
    seeds = np.random.default_rng(0).choice(1_000_000, size=tasks_per_batch * (repeats + 1),
                                            replace=False)
    batches = [seeds[i * tasks_per_batch:(i + 1) * tasks_per_batch] for i in range(repeats + 1)]

    def local(tasks: np.ndarray, seed: int):  # type: ignore[no-untyped-def]
        backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
        return rollout(tasks, make_env, backend, policy.turn_format(), strategy,
                       config=config, seed=seed).trees

    def rate(run) -> tuple[float, list]:  # type: ignore[no-untyped-def]
        run(batches[0], 0)  # warm-up
        rates, trees = [], []
        for r in range(1, repeats + 1):
            tick = time.perf_counter()
            grown = run(batches[r], r)
            seconds = time.perf_counter() - tick
            rates.append(sum(token_counts(t).leaves for t in grown) / seconds)
            trees += grown
        return statistics.median(rates), trees

    local_rate, reference = rate(local)
    ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    per_workers, identical = {}, True
    try:
        for w in args.workers:
            pool = RayRollout(policy, make_env, strategy, config, workers=w, num_cpus=1)
            value, trees = rate(lambda tasks, seed, pool=pool: pool.rollout(tasks,
                                                                            seed=seed).trees)
            pool.shutdown()
            per_workers[w] = round(value, 2)
            identical = identical and same_trees(trees, reference)
    finally:
        ray.shutdown()
    print(f"{'':14}{'rollouts/s':>12}")
    print(f"{'one process':14}{local_rate:>12.2f}")
    for w, value in per_workers.items():
        print(f"{f'ray x{w}':14}{value:>12.2f}")
    print(json.dumps({
        "rollouts_per_second": {f"ray_{w}": v for w, v in per_workers.items()},
        "local_rollouts_per_second": round(local_rate, 2),
        "speedup_2_over_1": round(per_workers[2] / per_workers[1], 3)
        if 1 in per_workers and 2 in per_workers else None,
        "identical_to_local": identical,
        "tasks_per_batch": tasks_per_batch, "repeats": repeats,
        "strategy": "tree_grpo m=4 n=2 l=1", "policy": "frozenlake-tiny (shipped base)",
        "convention": "frozenlake rllm (non-slippery, sizes 2-9)",
        "note": "one CPU and one torch thread per worker; the driver shares the 2 cores",
    }))


if __name__ == "__main__":
    main()
