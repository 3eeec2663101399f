"""Probe (issue #9): how much of the base's failure would one local rule remove?

The shipped base ends almost every failed held-out episode in a hole (``bench/base_policy.py``:
109 of 114). This probe evaluates it greedy on the same held-out rLLM tasks twice: as it is,
and with a *shield* on the environment side (a diagnostic, not a policy and not part of the
package): a reply whose move would end in a hole is replaced by the safe move that ends
nearest the goal in Manhattan distance (a move into the map's edge counts as staying; if
every move is a hole the reply stands). The policy's own reply stays in its context; the next
observation shows where the player really is. The difference is what a policy that has
learnt "never step into a hole next to you" (a rule one step deep, no planning) would gain
over the base: an upper bound of what RL must teach for that one skill, and whether the
issue's +20 points lie within it. Each episode's turn limit is unchanged.

    python bench/probe_shield.py            # 256 held-out tasks, under a minute on 2 cores

Last line: one JSON object with both successes and intervals, how many moves the shield
replaced, and the shielded run's failures (holes it could not avoid, turns run out).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from treeroll.backends.hf import HFBackend
from treeroll.base import StepResult
from treeroll.config import load_config
from treeroll.envs import make_env_factory
from treeroll.envs.frozenlake import FrozenLakeEnv
from treeroll.envs.frozenlake_maps import ACTION_NAMES, HOLE
from treeroll.policies import load_policy
from treeroll.training.evaluation import evaluate, task_pools

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "frozenlake_rllm.yaml"
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # Left, Down, Right, Up, as in frozenlake.py


class ShieldedFrozenLake(FrozenLakeEnv):
    """FrozenLake whose step replaces a move into a hole by the safe move nearest the goal."""

    replaced = 0
    """Moves replaced, over every instance (the probe reads it after each evaluation)."""

    def _after(self, index: int) -> tuple[int, int]:
        row, column = self.position[0] + _MOVES[index][0], self.position[1] + _MOVES[index][1]
        if 0 <= row < self.size and 0 <= column < self.size:
            return row, column
        return self.position

    def _is_hole(self, cell: tuple[int, int]) -> bool:
        return self.grid[cell[0]][cell[1]] == HOLE

    def step(self, action: str) -> StepResult:
        """Step, after swapping a move into a hole for the safe move nearest the goal."""
        names, _, format_error = self._parse(str(action))
        if names and not format_error:
            index = [n.lower() for n in ACTION_NAMES].index(names[0].lower())
            if self._is_hole(self._after(index)):
                safe = [i for i in range(4) if not self._is_hole(self._after(i))]
                if safe:
                    def distance(i: int) -> int:
                        cell = self._after(i)
                        return abs(cell[0] - self.goal[0]) + abs(cell[1] - self.goal[1])
                    best = min(safe, key=lambda i: (distance(i), self._after(i) == self.position))
                    ShieldedFrozenLake.replaced += 1
                    action = f"```{ACTION_NAMES[best]}```"
        return super().step(action)


def main() -> None:
    """Evaluate the base with and without the shield; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=256)
    parser.add_argument("--policy", default=None, help="a shipped name or a policy folder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(DEFAULT_CONFIG)
    config.eval = replace(config.eval, tasks=args.tasks, temperature=0.0)
    spec = args.policy or config.policy.init
    policy = load_policy(spec)
    make_env = make_env_factory(config.env)
    template = make_env()
    assert isinstance(template, FrozenLakeEnv), "the default config's env is FrozenLake"

    def make_shielded() -> ShieldedFrozenLake:
        return ShieldedFrozenLake(template.config)

    _, held_out = task_pools(config.env, config.eval)
    seeds = held_out[:args.tasks]
    backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
    tick = time.perf_counter()
    plain = evaluate(backend, policy.turn_format(), make_env, seeds, config.eval, config.rollout)
    shielded = evaluate(backend, policy.turn_format(), make_shielded, seeds, config.eval,
                        config.rollout)
    ends = _shielded_failures(template.config, seeds, shielded.successes)
    result: dict[str, Any] = {
        "policy": spec, "env": config.env.name, "tasks": args.tasks,
        "success": plain.success_rate, "ci": [round(plain.low, 4), round(plain.high, 4)],
        "shielded_success": shielded.success_rate,
        "shielded_ci": [round(shielded.low, 4), round(shielded.high, 4)],
        "gain": round(shielded.success_rate - plain.success_rate, 4),
        "moves_replaced": ShieldedFrozenLake.replaced, **ends,
        "seconds": round(time.perf_counter() - tick, 1)}
    print(json.dumps(result))


def _shielded_failures(env_config: Any, seeds: Any, successes: list[bool]) -> dict[str, int]:
    """How many failed shielded tasks have no safe first move at all (boxed in by holes)
    versus the rest (turns ran out, or the shield's one-step rule walked into a dead end)."""
    boxed = 0
    for seed, success in zip(seeds, successes, strict=True):
        if success:
            continue
        env = ShieldedFrozenLake(env_config)
        env.reset(int(seed))
        boxed += all(env._is_hole(env._after(i)) or env._after(i) == env.position
                     for i in range(4))
    return {"shielded_failed": sum(not s for s in successes), "failed_boxed_in_at_start": boxed}


if __name__ == "__main__":
    main()
