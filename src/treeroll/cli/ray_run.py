"""``treeroll ray-rollout``: a batch of rollout trees over Ray workers
(:class:`treeroll.distributed.RayRollout`), saved one JSON file a tree.

    treeroll ray-rollout --workers 2 --tasks 16                  # a local cluster
    treeroll ray-rollout --address auto --workers 16 --tasks 256 # after `ray start`
    treeroll ray-rollout --help

``python -m treeroll.cli.ray_run`` runs the same command (kept for scripts written before it was
a subcommand)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treeroll.config import TrainConfig
from treeroll.envs import env_spec

__all__ = ["RayRolloutCommand", "main", "run_ray_rollout"]


@dataclass
class RayRolloutCommand:
    """Grow a batch of rollout trees on Ray workers and save them (one JSON file a tree).

    Each worker is a Ray actor with its own copy of the policy, its backend and its
    environments; a task's whole tree is grown in one worker. With the unsynchronised engine
    (the default here) the trees are those one process would grow for the same seed."""

    address: str | None = None
    """A Ray cluster to join (``auto``: the one `ray start` made on this machine, or
    ``HOST:PORT``); None starts a local one with ``workers x cpus_per_worker`` CPUs."""
    workers: int = 2
    """Rollout actors."""
    cpus_per_worker: float = 1.0
    """CPUs Ray reserves for each actor (and the torch threads it uses)."""
    tasks: int = 16
    """How many tasks: the first ones of the training pool (``--train.env.*``)."""
    synchronous: bool = False
    """Synchronous rounds instead (reproducible, but not the one-process trees)."""
    out: str = "runs/ray_rollouts"
    """Folder for the trees (``tree-<task>.json``; render one with `treeroll show`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Policy, environment, strategy and rollout settings (as in `treeroll train`)."""


def run_ray_rollout(command: RayRolloutCommand, console: Any) -> int:
    """Grow and save the trees ``command`` asks for; checks its numbers before any work."""
    bad = [f"{name} is {value}, must be > 0" for name, value in
           (("--workers", command.workers), ("--tasks", command.tasks),
            ("--cpus-per-worker", command.cpus_per_worker)) if value <= 0]
    if bad:
        raise ValueError("; ".join(bad))
    name = command.train.env.name
    spec = env_spec(name)
    if spec is not None and spec.actor is not None:
        raise ValueError(f"--train.env.name {name}: ray-rollout grows trees with the shipped "
                         f"starting policy, which does not read {name}'s tasks; its "
                         f"{spec.actor} backend runs in one process (`treeroll rollout --env "
                         f"{name}`)")
    import functools

    import ray

    from treeroll.backends import make_backend
    from treeroll.cli.one_tree import starting_policy
    from treeroll.distributed import RayRollout
    from treeroll.envs import make_env_factory
    from treeroll.strategies import make_strategy
    from treeroll.training.evaluation import task_pools
    from treeroll.tree import leaves
    from treeroll.tree_json import save_tree

    config = command.train
    rollout_config = dataclasses.replace(config.rollout, synchronous=command.synchronous)
    tasks = task_pools(config.env, config.eval)[0][:command.tasks]
    out = Path(command.out)
    started = not ray.is_initialized()  # in a program that has a cluster already, use it
    if started and command.address is None:
        ray.init(num_cpus=max(1, int(command.workers * command.cpus_per_worker)),
                 include_dashboard=False)
    elif started:
        ray.init(address=command.address)
    try:
        # the environment, the strategy and the configured backend (no scorer: the workers
        # grow trees without one, as before)
        pool = RayRollout(starting_policy(config), make_env_factory(config.env),
                          make_strategy(config.strategy), rollout_config,
                          make_backend=functools.partial(make_backend, config.backend),
                          workers=command.workers, num_cpus=command.cpus_per_worker)
        batch = pool.rollout(tasks, seed=config.seed)
        pool.shutdown()
    finally:
        if started:
            ray.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    for tree in batch.trees:
        save_tree(tree, out / f"tree-{tree.task_seed}.json")
    n_leaves = sum(len(leaves(t)) for t in batch.trees)
    console.print(f"{len(batch.trees)} trees, {n_leaves} leaves on {command.workers} workers in "
                  f"{batch.timing['total']:.1f} s; saved to {out}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the options (``--help`` lists them) and run; a bad value is an error naming it
    (exit status 2) before any work."""
    import tyro
    from rich.console import Console

    console = Console(stderr=True)
    command = tyro.cli(RayRolloutCommand, prog="python -m treeroll.cli.ray_run",
                       args=sys.argv[1:] if argv is None else argv,
                       description=RayRolloutCommand.__doc__)
    try:
        return run_ray_rollout(command, console)
    except (ValueError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {err}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
