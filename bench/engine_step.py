"""The default training's rollout on the new engine vs the released code's batched rounds.

Rolls out the default training's batches (``configs/frozenlake_rllm.yaml``: the shipped base,
rLLM FrozenLake, Tree-GRPO M=4 N=2 L=1, 16 tasks a step, 2 threads) step after step, each
step's tasks twice: with ``rollout.synchronous`` (every backend call waits for every
environment step of the last one and all M chains of a task end before any is expanded:
token for token the lockstep loop treeroll had before its engine) and without (each of a
task's M trees expanded as soon as its own chain ends), and with ``rollout.continuous`` (each
branch's request joins the backend's running decode batch as soon as it is ready), each mode
first in turn. The update is the same code every way, so the rollout is the part of a step
the engine changes.

Last line: one JSON object with the summed seconds of each mode, ``unsync_over_sync`` (< 1:
the new default is faster), ``continuous_over_sync``, backend calls per step, leaves and
generated tokens per step.

    python bench/engine_step.py            # 8 steps (about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from treeroll.backends import make_backend
from treeroll.cli.one_tree import starting_policy
from treeroll.config import load_config
from treeroll.engine.batch import rollout
from treeroll.envs import make_env_factory
from treeroll.strategies import make_strategy
from treeroll.training.evaluation import task_pools
from treeroll.tree import TokenCounts, token_counts

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    """Time both modes on the same tasks and print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--config", default=str(ROOT / "configs" / "frozenlake_rllm.yaml"))
    args = parser.parse_args()
    config = load_config(args.config)
    torch.set_num_threads(config.threads or torch.get_num_threads())
    make_env = make_env_factory(config.env)
    strategy = make_strategy(config.strategy)
    train_seeds, _ = task_pools(config.env, config.eval)
    rng = np.random.default_rng(config.seed)
    policy = starting_policy(config)
    backend = make_backend(config.backend, policy)
    modes = {"sync": replace(config.rollout, synchronous=True),
             "unsync": replace(config.rollout, synchronous=False),
             "continuous": replace(config.rollout, synchronous=False, continuous=True)}
    seconds = {name: 0.0 for name in modes}
    calls = {name: 0 for name in modes}
    totals = {name: TokenCounts() for name in modes}
    for step in range(args.steps):
        tasks = rng.choice(train_seeds, size=config.optim.tasks_per_step, replace=False)
        order = list(modes)[step % 3:] + list(modes)[:step % 3]  # each mode first in turn
        for name in order:
            backend.reset_cache()
            tick = time.perf_counter()
            batch = rollout(tasks, make_env, backend, policy.turn_format(), strategy,
                            config=modes[name], seed=step)
            seconds[name] += time.perf_counter() - tick
            calls[name] += batch.trees[0].meta["turns"]
            totals[name] = totals[name] + sum((token_counts(t) for t in batch.trees),
                                              TokenCounts())
        print(f"step {step + 1}: " + ", ".join(f"{n} {seconds[n]:.2f}s" for n in modes),
              flush=True)
    result = {
        "sync_s": round(seconds["sync"], 3),
        "unsync_s": round(seconds["unsync"], 3),
        "continuous_s": round(seconds["continuous"], 3),
        "unsync_over_sync": round(seconds["unsync"] / seconds["sync"], 4),
        "continuous_over_sync": round(seconds["continuous"] / seconds["sync"], 4),
        "sync_backend_calls_per_step": round(calls["sync"] / args.steps, 2),
        "unsync_backend_calls_per_step": round(calls["unsync"] / args.steps, 2),
        "sync_leaves_per_step": round(totals["sync"].leaves / args.steps, 2),
        "unsync_leaves_per_step": round(totals["unsync"].leaves / args.steps, 2),
        "sync_generated_per_step": round(totals["sync"].generated / args.steps, 1),
        "unsync_generated_per_step": round(totals["unsync"].generated / args.steps, 1),
        "continuous_generated_per_step": round(totals["continuous"].generated / args.steps, 1),
        "steps": args.steps,
        "tasks_per_step": config.optim.tasks_per_step,
        "config": Path(args.config).name,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
