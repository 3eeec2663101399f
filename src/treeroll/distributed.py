"""Tree rollouts spread over Ray actors.

A batch of tasks is split into contiguous shares, one per :class:`RolloutWorker` actor; each
actor owns a generation backend (the transformers backend on its own copy of the policy, by
default) and its environments, and grows its share's trees with the single-process engine.
A task's whole tree is grown in one actor, so a group is never split across workers; the
trees come back in task order with the tree ids the single-process run would give them.

Results are the trees :func:`treeroll.engine.batch.rollout` grows in one process for the same seed
(:func:`same_trees`: the same tokens, texts, rewards and shapes, logprobs equal within float
rounding) when the engine is unsynchronised (``RolloutConfig.synchronous = False``): there each
tree's request seeds and strategy seed come from ``(seed, tree id, ...)`` alone, and a seeded
request does not depend on the rest of its backend batch. In synchronous rounds request seeds
are drawn in call order over the whole batch, so a partitioned batch is reproducible (same
workers, same seed) but not equal to the one-process batch. A batch-wide allocator (VIGOR)
needs every tree in one place and is refused here.

Weights go to the workers with :meth:`RayRollout.load_weights` (one ``ray.put``, every actor
loads and forgets its cache before the next batch).

    ray.init(num_cpus=2)                      # or ray.init(address="auto") on a cluster
    pool = RayRollout(policy, make_env, strategy, config, workers=2)
    batch = pool.rollout(tasks, seed=0)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from treeroll.base import Allocator, Env, Strategy
from treeroll.engine import RolloutBatch, RolloutConfig, rollout
from treeroll.tree_json import tree_from_dict, tree_to_dict

if TYPE_CHECKING:
    from treeroll.policies import Policy

__all__ = ["RayRollout", "RolloutWorker", "same_trees", "shares"]

BATCH_FIELDS = ("meta", "counts")
"""What a tree records of its batch (backend calls, cache hits from other trees): not part of
what the tree is; nor is a node's ``info["cost"]`` (its prompt tokens computed or served from
a cache the other trees, or earlier batches, filled)."""


def _node_content(node: dict[str, Any]) -> dict[str, Any]:
    info = {k: v for k, v in (node.get("info") or {}).items() if k != "cost"}
    return {**{k: v for k, v in node.items() if k not in ("action_logprobs", "info")},
            "info": info}


def same_trees(a: Sequence[Any], b: Sequence[Any], logprob_atol: float = 1e-4) -> bool:
    """Whether two lists of trees (``RolloutTree`` or :func:`tree_to_dict` dicts) are the
    same trees: every node's tokens, texts, rewards, statuses and place equal, and its
    logprobs equal within ``logprob_atol`` (a batch of other sizes pads differently, which
    moves float32 logprobs by rounding, up to about 2e-5 seen on unlikely tokens, not the
    sampled ids)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        x = x if isinstance(x, dict) else tree_to_dict(x)
        y = y if isinstance(y, dict) else tree_to_dict(y)
        if {k: v for k, v in x.items() if k not in (*BATCH_FIELDS, "nodes")} != \
                {k: v for k, v in y.items() if k not in (*BATCH_FIELDS, "nodes")}:
            return False
        if len(x["nodes"]) != len(y["nodes"]):
            return False
        for m, n in zip(x["nodes"], y["nodes"], strict=True):
            if _node_content(m) != _node_content(n):
                return False
            if not np.allclose(m["action_logprobs"] or [], n["action_logprobs"] or [],
                               atol=logprob_atol, rtol=0):
                return False
    return True


def shares(n_tasks: int, workers: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each worker's contiguous share of ``n_tasks`` (sizes differ by at
    most one; a worker with nothing to do gets an empty share)."""
    base, extra = divmod(n_tasks, workers)
    out, start = [], 0
    for w in range(workers):
        end = start + base + (1 if w < extra else 0)
        out.append((start, end))
        start = end
    return out


class RolloutWorker:
    """One rollout process: a policy copy, its backend, and the environments it steps.

    Made as a Ray actor by :class:`RayRollout`; usable directly (in process) too, which is
    how its logic is tested without a cluster."""

    def __init__(self, policy: Policy, make_env: Callable[[], Env], strategy: Strategy,
                 config: RolloutConfig, threads: int = 1,
                 make_backend: Callable[[Any], Any] | None = None) -> None:
        import torch

        torch.set_num_threads(threads)
        self.policy, self.make_env, self.strategy, self.config = (policy, make_env, strategy,
                                                                  config)
        self.turns = policy.turn_format()
        if make_backend is None:  # the default backend, through its registry
            from treeroll.backends import BackendConfig
            from treeroll.backends import make_backend as build

            self.backend = build(BackendConfig(), policy)
        else:
            self.backend = make_backend(policy)

    def rollout(self, tasks: Sequence[int], seed: int, first_group_id: int
                ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Grow the trees of ``tasks`` (tree ids from ``first_group_id``); the trees as
        plain dicts (cheap to ship) and the timing."""
        if not len(tasks):
            return [], {}
        batch = rollout(np.asarray(tasks), self.make_env, self.backend, self.turns,
                        self.strategy, config=self.config, seed=seed,
                        first_group_id=first_group_id)
        return [tree_to_dict(t) for t in batch.trees], batch.timing

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Take new weights; nothing cached under the old ones is used again."""
        from treeroll.backends import sync_weights

        self.policy.model.load_state_dict(state_dict)
        sync_weights(self.backend, self.policy.model)


class RayRollout:
    """A pool of ``workers`` :class:`RolloutWorker` Ray actors (``ray.init`` first).

    ``num_cpus`` per actor is what Ray reserves for it (and the torch threads it uses);
    ``make_backend(policy)`` builds each actor's backend (default: the transformers
    backend)."""

    def __init__(self, policy: Policy, make_env: Callable[[], Env], strategy: Strategy,
                 config: RolloutConfig, *, workers: int = 2, num_cpus: float = 1,
                 make_backend: Callable[[Any], Any] | None = None) -> None:
        import ray

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not ray.is_initialized():
            raise RuntimeError("RayRollout needs a Ray cluster: call ray.init() first "
                               "(ray.init(num_cpus=N) locally, ray.init(address='auto') on a "
                               "cluster started with `ray start`)")
        actor: Any = ray.remote(num_cpus=num_cpus)(RolloutWorker)
        threads = max(1, int(num_cpus))
        self.workers: list[Any] = [actor.remote(policy, make_env, strategy, config, threads,
                                                make_backend) for _ in range(workers)]

    def rollout(self, tasks: Sequence[int] | np.ndarray, *, seed: int = 0,
                first_group_id: int = 0, allocator: Allocator | None = None) -> RolloutBatch:
        """The trees of ``tasks``, grown by the workers, in task order."""
        import ray

        if allocator is not None:
            raise ValueError("RayRollout grows each worker's share on its own: a batch-wide "
                             "allocator (VIGOR) needs every tree in one process; use "
                             "treeroll.engine.batch.rollout")
        start = time.perf_counter()
        tasks = [int(t) for t in tasks]
        parts = shares(len(tasks), len(self.workers))
        futures = [w.rollout.remote(tasks[a:b], seed, first_group_id + a)
                   for w, (a, b) in zip(self.workers, parts, strict=True)]
        trees, timing = [], {"generate": 0.0, "env": 0.0, "score": 0.0}
        for dicts, part_timing in ray.get(futures):
            trees += [tree_from_dict(d) for d in dicts]
            for key in timing:
                timing[key] += part_timing.get(key, 0.0)  # summed over workers
        timing["total"] = time.perf_counter() - start
        return RolloutBatch(trees=trees, timing=timing)

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Send new weights to every worker (one object in Ray's store) and wait."""
        import ray

        ref = ray.put({k: v.detach().cpu() for k, v in state_dict.items()})
        ray.get([w.load_weights.remote(ref) for w in self.workers])

    def shutdown(self) -> None:
        """Stop the actors."""
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
