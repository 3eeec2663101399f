"""How good is the shipped base policy? Greedy held-out success on FrozenLake (rLLM convention).

Loads the shipped ``frozenlake-tiny`` policy by name (or ``--policy PATH``) and evaluates it,
greedy, on the held-out task seeds of the default training (``configs/frozenlake_rllm.yaml``:
drawn from seed 42, disjoint from the 10,000-task training pool of seed 0), with a 95% Wilson
interval and the share of well-formed replies.

    python bench/base_policy.py --quick     # 128 tasks, well under a minute on 2 cores
    python bench/base_policy.py             # 256 tasks

Last line: one JSON object with ``success``, ``ci_low``, ``ci_high``, ``format_ok``,
``params``, ``tasks``, ``seconds``, the policy's name, and where it fails: success by map
side (``by_size``) and on the maps whose shortest path is longer than the Manhattan distance
from start to goal, i.e. must detour around holes (``needs_detour``), versus the rest
(``direct``), each as ``[success, tasks]``; and the headroom RL has: ``sampled_success`` (one
sample per task at the training temperature, averaged over ``k`` samples) and ``pass_at_k``
(tasks solved by at least one of the ``k`` samples); and how the greedy episodes fail
(``failed_in_hole``, ``failed_out_of_turns``, and the turns whose explanation misreads the
player's or the goal's cell: ``misread_player``, ``misread_goal`` out of ``turns``).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.config import load_config
from treeroll.envs import make_env_factory
from treeroll.envs.frozenlake import start_distance
from treeroll.envs.frozenlake_maps import HOLE
from treeroll.policies import load_policy
from treeroll.training.evaluation import evaluate, task_pools
from treeroll.tree import leaves, path_to

EXPLANATION = re.compile(r"P@(\d+),(\d+) G@(\d+),(\d+)")
"""The explanation line the shipped base writes before each action (``P@r,c G@r,c``)."""
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "frozenlake_rllm.yaml"


def main() -> None:
    """Evaluate the base policy; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 held-out tasks")
    parser.add_argument("--tasks", type=int, default=None, help="held-out tasks (default 256)")
    parser.add_argument("--policy", default=None, help="a shipped name or a policy folder "
                        "(default: the config's policy.init)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8, help="samples per task at the "
                        "training temperature for sampled_success and pass_at_k (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(DEFAULT_CONFIG)
    tasks = args.tasks or (128 if args.quick else 256)
    config.eval = replace(config.eval, tasks=tasks, temperature=0.0)
    spec = args.policy or config.policy.init
    assert spec, "the config names no policy.init"
    tick = time.perf_counter()
    policy = load_policy(spec)
    load_seconds = time.perf_counter() - tick
    make_env = make_env_factory(config.env)
    _, held_out = task_pools(config.env, config.eval)
    backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
    tick = time.perf_counter()
    result = evaluate(backend, policy.turn_format(), make_env, held_out[:tasks], config.eval,
                      config.rollout)
    seconds = time.perf_counter() - tick
    breakdown = failure_breakdown(make_env, held_out[:tasks], result.successes)
    breakdown.update(how_episodes_end(result.trees, make_env, held_out[:tasks]))
    sampled = sample_successes(backend, policy, make_env, held_out[:tasks], config,
                               args.samples)
    print(json.dumps({"policy": spec, "env": config.env.name, "success": result.success_rate,
                      "ci_low": round(result.low, 4), "ci_high": round(result.high, 4),
                      "format_ok": round(result.format_ok, 4), "params": policy.parameters,
                      "tasks": tasks, "load_seconds": round(load_seconds, 2),
                      "seconds": round(seconds, 1), "threads": args.threads, **breakdown,
                      **sampled}))


def sample_successes(backend: Any, policy: Any, make_env: Any, seeds: Any, config: Any,
                     samples: int) -> dict[str, Any]:
    """How much RL could sharpen: success of single samples at the training temperature
    (``sampled_success``), and the share of tasks that at least one of ``samples`` samples
    solves (``pass_at_k``, k = ``samples``), the ceiling that sharpening the sampled policy
    into the greedy one can reach."""
    if samples < 1:
        return {}
    eval_config = replace(config.eval, temperature=config.rollout.temperature)
    runs = np.array([evaluate(backend, policy.turn_format(), make_env, seeds, eval_config,
                              config.rollout, seed=seed).successes for seed in range(samples)])
    return {"sample_temperature": config.rollout.temperature,
            "sampled_success": round(float(runs.mean()), 4),
            "pass_at_k": round(float(runs.any(axis=0).mean()), 4), "k": samples}


def failure_breakdown(make_env: Any, seeds: Any, successes: list[bool]) -> dict[str, Any]:
    """Greedy success by map side and by whether the map needs a detour around holes, from
    the evaluation's per-task successes."""
    by_size: dict[int, list[bool]] = {}
    detour: dict[bool, list[bool]] = {True: [], False: []}
    for seed, success in zip(seeds, successes, strict=True):
        env = make_env()
        env.reset(int(seed))
        by_size.setdefault(env.size, []).append(success)
        manhattan = abs(env.start[0] - env.goal[0]) + abs(env.start[1] - env.goal[1])
        detour[(start_distance(env) or 0) > manhattan].append(success)

    def share(values: list[bool]) -> list[float]:
        return [round(sum(values) / max(len(values), 1), 3), len(values)]
    return {"by_size": {str(k): share(v) for k, v in sorted(by_size.items())},
            "needs_detour": share(detour[True]), "direct": share(detour[False])}


def how_episodes_end(trees: list[Any], make_env: Any, seeds: Any) -> dict[str, Any]:
    """Why the greedy episodes fail, from the evaluation's own episodes (``trees``, one per
    seed) replayed in the environment: ``failed_in_hole`` and ``failed_out_of_turns`` count
    the failed episodes by how they ended; and, over every turn, ``misread_player`` /
    ``misread_goal`` count the explanations (``P@r,c G@r,c``) whose player or goal cell is not
    the true one (null for a policy that does not explain)."""
    ends = {"hole": 0, "turns": 0}
    misread = {"player": 0, "goal": 0, "explained": 0, "turns": 0}
    for seed, tree in zip(seeds, trees, strict=True):
        leaf = leaves(tree)[0]
        env = make_env()
        env.reset(int(seed))
        for node in path_to(leaf)[1:]:
            said = EXPLANATION.search(node.action_text)
            misread["turns"] += 1
            if said:
                misread["explained"] += 1
                misread["player"] += (int(said[1]), int(said[2])) != tuple(env.position)
                misread["goal"] += (int(said[3]), int(said[4])) != tuple(env.goal)
            env.step(node.action_text)
        if not leaf.info.get("success"):
            in_hole = env.grid[env.position[0]][env.position[1]] == HOLE
            ends["hole" if in_hole else "turns"] += 1
    explained = misread["explained"] > 0
    return {"failed_in_hole": ends["hole"], "failed_out_of_turns": ends["turns"],
            "turns": misread["turns"],
            "misread_player": misread["player"] if explained else None,
            "misread_goal": misread["goal"] if explained else None}


if __name__ == "__main__":
    main()
