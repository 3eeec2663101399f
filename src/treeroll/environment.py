"""The environment contract: a text environment that can be forked.

Declared below the rollout tree (:mod:`treeroll.tree` keeps each node's environment) and
re-exported by :mod:`treeroll.base` with every other extension point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Env", "ExampleEnv", "ExpertEnv", "ExpertReply", "StepResult", "TurnLimitedEnv"]


StepResult = tuple[str, float, bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)`` as in Gymnasium, observation as text."""


@runtime_checkable
class Env(Protocol):
    """A multi-turn text environment whose state can be copied.

    Invariants every implementation keeps (``treeroll.envs.check_env`` tests them):

    * ``reset(seed)`` is deterministic in ``seed`` and returns the first observation text;
    * ``step(action_text)`` never raises on malformed model text: an unparsable reply is an
      invalid action with the environment's penalty, reported in ``info["format_error"]``;
    * ``fork()`` returns an independent copy that continues exactly as the original would
      (random number generators included): stepping the copy never changes the original;
    * ``info["success"]`` (bool) is set on the step that ends an episode.
    """

    system_prompt: str
    """Instructions shown once before the first observation (may be empty)."""

    def reset(self, seed: int) -> str:
        """Start the task identified by ``seed``; return the first observation text."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply one model reply; return ``(observation, reward, terminated, truncated, info)``."""
        ...

    def fork(self) -> Env:
        """Return an independent copy that continues exactly as this environment would."""
        ...


@dataclass(frozen=True)
class ExpertReply:
    """One reply of an environment's expert, for supervised fine-tuning."""

    text: str
    """The reply, exactly as a policy would write it (it is parsed like a model's reply)."""
    is_expert: bool = True
    """False when the expert's noise chose this reply instead of its own choice (a noisy
    expert visits states off its own path; SFT may keep such replies in the context and
    leave them out of the loss)."""


@runtime_checkable
class ExpertEnv(Env, Protocol):
    """An :class:`Env` that can also demonstrate: an optional protocol (FrozenLake's
    shortest-path planner and the SWE tasks' scripted agent implement it). ``treeroll sft``
    generates its data from it on the fly."""

    def expert_reply(self, rng: np.random.Generator, skill: float = 1.0, *,
                     explain: bool | str = False, safe_moves: bool = False) -> ExpertReply:
        """The expert's reply in the current state. With probability ``1 - skill`` per
        decision the expert acts at random instead (``is_expert=False`` then); ``skill = 1``
        is the clean expert. ``explain`` asks for a short statement of what the expert
        reads in the state before the action (the environment documents its form, and the
        styles a string may name; the parse of the reply ignores it); ``safe_moves`` asks
        that statement to list the moves that avoid an immediate loss (FrozenLake's holes);
        an expert that cannot raises ``ValueError`` naming what it can do. Draws only from
        ``rng`` (never from the environment's own RNG, so demonstrating does not change the
        episode)."""
        ...


@runtime_checkable
class TurnLimitedEnv(Env, Protocol):
    """An :class:`Env` that says how many turns an episode takes at most (optional: the
    context check sizes the longest context with it, and says nothing without it)."""

    @property
    def turn_limit(self) -> int:
        """The most turns the current episode may take."""
        ...


@runtime_checkable
class ExampleEnv(Env, Protocol):
    """An :class:`Env` that can write a plausible reply (optional: ``check_env`` steps with
    them; without, it steps with malformed replies only)."""

    def example_reply(self, rng: np.random.Generator) -> str:
        """A well-formed reply drawn from ``rng``."""
        ...
