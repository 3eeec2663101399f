"""check_env passes on the shipped environments and names the invariant a broken one breaks."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from treeroll.base import StepResult
from treeroll.envs import EnvCheckError, GymTextEnv, check_env, make_frozenlake


class RandomWalk:
    """A correct toy env: "go" moves the walker by a random -1/0/+1; ten turns."""

    system_prompt = "Say go."

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.position = 0
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.rng = np.random.default_rng(seed)
        self.position, self.turn = 0, 0
        return "at 0"

    def step(self, action: str) -> StepResult:
        self.turn += 1
        valid = action.strip() == "go"
        if valid:
            self.position += int(self.rng.integers(-1, 2))
        done = self.turn >= 10
        return (f"at {self.position}", float(valid), False, done,
                {"success": done and self.position > 0, "format_error": not valid})

    def fork(self) -> RandomWalk:
        return copy.deepcopy(self)

    def example_reply(self, rng: np.random.Generator) -> str:
        return "go"


class SharedRngFork(RandomWalk):
    def fork(self) -> RandomWalk:
        return copy.copy(self)  # the copy's rng is the original's


class ForkIsSelf(RandomWalk):
    def fork(self) -> RandomWalk:
        return self


class RaisesOnJunk(RandomWalk):
    def step(self, action: str) -> StepResult:
        if action.strip() != "go":
            raise ValueError("cannot parse")
        return super().step(action)


class UnseededReset(RandomWalk):
    def reset(self, seed: int) -> str:
        super().reset(seed)
        self.position = int(np.random.default_rng().integers(1000))
        return f"at {self.position}"


class ForkLosesTheRng(RandomWalk):
    def fork(self) -> RandomWalk:
        other = copy.deepcopy(self)
        other.rng = np.random.default_rng(123)
        return other


class SuccessNotBool(RandomWalk):
    def step(self, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = super().step(action)
        info["success"] = 1 if truncated else False
        return observation, reward, terminated, truncated, info


class BadTypes(RandomWalk):
    def step(self, action: str) -> Any:
        observation, reward, terminated, truncated, info = super().step(action)
        return [observation], reward, terminated, truncated, info


def test_passes_on_shipped_envs() -> None:
    check_env(lambda: make_frozenlake("rllm"))
    check_env(lambda: make_frozenlake("ragen"), seeds=range(6))
    check_env(lambda: GymTextEnv("FrozenLake-v1", ["Left", "Down", "Right", "Up"],
                                 make_kwargs={"is_slippery": True}))
    check_env(lambda: GymTextEnv("Taxi-v4", make_kwargs={"is_rainy": True}))
    check_env(RandomWalk)


@pytest.mark.parametrize(("env_class", "message"), [
    (SharedRngFork, "stepping the fork changed the original"),
    (ForkIsSelf, "returned the environment itself"),
    (ForkLosesTheRng, "the fork does not continue as the original would"),
    (RaisesOnJunk, "must never raise"),
    (UnseededReset, "reset.* is not deterministic"),
    (SuccessNotBool, r"info\['success'\]"),
    (BadTypes, "observation must be a str"),
])
def test_fails_on_broken_envs(env_class: type[RandomWalk], message: str) -> None:
    with pytest.raises(EnvCheckError, match=message):
        check_env(env_class)


def test_env_check_error_is_an_assertion_error() -> None:
    assert issubclass(EnvCheckError, AssertionError)
