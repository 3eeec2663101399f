"""GymTextEnv: Gymnasium toy-text environments driven by model text, and their forks."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from treeroll.base import Env
from treeroll.envs import GymTextEnv

FROZEN_NAMES = ["Left", "Down", "Right", "Up"]


def frozen_lake(slippery: bool = True, **kwargs: Any) -> GymTextEnv:
    return GymTextEnv("FrozenLake-v1", FROZEN_NAMES, make_kwargs={"is_slippery": slippery},
                      **kwargs)


def outcomes(env: GymTextEnv, replies: list[str]) -> list[tuple[Any, ...]]:
    out = []
    for reply in replies:
        if env.done:
            break
        observation, reward, terminated, truncated, info = env.step(reply)
        out.append((observation, reward, terminated, truncated, info["success"],
                    info["action_index"]))
    return out


@pytest.mark.parametrize("make", [
    lambda: frozen_lake(),
    lambda: GymTextEnv("CliffWalkingSlippery-v1", ["Up", "Right", "Down", "Left"]),
    lambda: GymTextEnv("Taxi-v4", make_kwargs={"is_rainy": True, "fickle_passenger": True}),
])
def test_fork_continues_identically_with_slips(make: Any) -> None:
    rng = np.random.default_rng(0)
    differs_with_other_rng = 0
    for seed in range(25):
        env = make()
        assert isinstance(env, Env)
        env.reset(seed)
        replies = [env.example_reply(rng) for _ in range(30)]
        outcomes(env, replies[:3])
        fork, reseeded = env.fork(), env.fork()
        reseeded.env.unwrapped.np_random = np.random.default_rng(10**6 + seed)
        from_fork = outcomes(fork, replies[3:])
        assert from_fork == outcomes(env, replies[3:])
        differs_with_other_rng += from_fork != outcomes(reseeded, replies[3:])
    assert differs_with_other_rng > 10  # the dynamics are random, so the equality is a real test


def test_stepping_a_fork_leaves_the_original_unchanged() -> None:
    env = frozen_lake()
    env.reset(3)
    state = (env.turn, env.env.unwrapped.s, env.env.unwrapped.np_random.bit_generator.state)
    fork = env.fork()
    outcomes(fork, ["Down", "Right", "Down", "Right"])
    assert state == (env.turn, env.env.unwrapped.s,
                     env.env.unwrapped.np_random.bit_generator.state)


def test_reset_is_deterministic() -> None:
    assert frozen_lake().reset(5) == frozen_lake().reset(5)
    taxi = GymTextEnv("Taxi-v4")
    assert len({taxi.reset(seed) for seed in range(10)}) > 1


@pytest.mark.parametrize(("reply", "index"), [
    ("Down", 1),
    ("I would go left, no: RIGHT.", 2),  # the last action word counts
    ("action 3", 3),
    ("Up then 0", 0),
    ("7", None),  # out of range
    ("jump", None),
    ("", None),
    ("9" * 5000, None),
    ("\u00b2 \u2603", None),
])
def test_parsing(reply: str, index: int | None) -> None:
    assert frozen_lake().parse_action(reply) == index


def test_invalid_reply_does_not_step_the_env() -> None:
    env = frozen_lake(slippery=False, invalid_penalty=0.5)
    first = env.reset(0)
    rng_state = env.env.unwrapped.np_random.bit_generator.state
    observation, reward, terminated, truncated, info = env.step("hop")
    assert observation == "Invalid action. Valid actions: Left, Down, Right, Up.\n" + first
    assert (reward, terminated, truncated) == (-0.5, False, False)
    assert info["format_error"] and info["action_index"] is None and info["success"] is False
    assert env.env.unwrapped.np_random.bit_generator.state == rng_state


def test_a_discrete_state_is_reported_as_the_anchor_state_an_invalid_reply_keeps() -> None:
    """FrozenLake-v1's state is the cell index: Down from 0 is 4; an invalid reply prefixes
    the observation but leaves the state, so the anchor state is the same text."""
    env = frozen_lake(slippery=False)
    env.reset(0)
    down, _, _, _, info = env.step("Down")
    assert info["anchor_state"] == "4"
    invalid, _, _, _, again = env.step("hop")
    assert again["anchor_state"] == "4" and invalid != down


def test_goal_success_and_max_turns() -> None:
    env = frozen_lake(slippery=False)
    env.reset(0)  # the default 4x4 map: SFFF / FHFH / FFFH / HFFG
    results = [env.step(reply) for reply in ["Down", "Down", "Right", "Right", "Down", "Right"]]
    assert [r[1] for r in results] == [0, 0, 0, 0, 0, 1.0]
    assert results[-1][2] and results[-1][4]["success"] is True
    assert all(r[4]["success"] is False for r in results[:-1])
    with pytest.raises(RuntimeError, match="ended"):
        env.step("Down")
    env = frozen_lake(slippery=False, max_turns=3)
    env.reset(0)
    flags = [env.step("Up")[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_render_fn_and_validation() -> None:
    env = GymTextEnv("FrozenLake-v1", FROZEN_NAMES, render_fn=lambda e, obs: f"cell {obs}")
    assert env.reset(0) == "cell 0"
    with pytest.raises(ValueError, match="Discrete"):
        GymTextEnv("Pendulum-v1", render_fn=lambda e, obs: "")
    with pytest.raises(ValueError, match="action_names"):
        GymTextEnv("FrozenLake-v1", ["Left"])
    with pytest.raises(ValueError, match="render"):
        GymTextEnv(gym.make("FrozenLake-v1"))
