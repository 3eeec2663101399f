"""Any Gymnasium environment with a discrete action space and a text rendering, as a treeroll
environment.

The observation text is the environment's ``render_mode="ansi"`` rendering (or what a user's
``render_fn`` returns); the model's reply is parsed for the *last* word that names an action
(case-insensitive) or is an action index. A reply with neither is an invalid action: the
wrapped environment is not stepped, the turn counts, and ``invalid_penalty`` is subtracted.
:meth:`GymTextEnv.fork` deep-copies the wrapped environment, its ``np_random`` included, so a
fork of a slippery environment slips exactly as the original would.

Gymnasium's ANSI renderings mark the agent with colour escape codes; pass a ``render_fn`` for
plain text.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from treeroll.base import StepResult

__all__ = ["GymTextEnv", "SuccessFn"]

SuccessFn = Callable[[float, bool, dict[str, Any]], bool]
"""``(step reward, terminated, gymnasium info) -> success`` of the step that ends an episode."""

_WORD = re.compile(r"(-?\d+)|([^\W\d]\w*)")  # (integer, name) alternatives


def _default_success(reward: float, terminated: bool, info: dict[str, Any]) -> bool:
    return terminated and reward > 0


class GymTextEnv:
    """A Gymnasium environment (discrete actions) driven by model text (implements
    :class:`treeroll.base.Env`).

    ``info`` on every step: the wrapped environment's info (when it was stepped), plus
    ``success`` (bool), ``format_error`` (bool), ``action_index`` (``None`` when invalid),
    ``action_names`` and ``invalid_actions`` (lists), ``turn``, and for a ``Discrete``
    observation space ``anchor_state`` (the state's index, as text: what GiGPO's
    ``advantage.gigpo.anchor env_state`` compares).
    """

    def __init__(
        self,
        env: str | gym.Env[Any, Any],
        action_names: Sequence[str] | None = None,
        render_fn: Callable[[gym.Env[Any, Any], Any], str] | None = None,
        system_prompt: str = "",
        max_turns: int = 100,
        *,
        invalid_penalty: float = 0.0,
        success_fn: SuccessFn | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """``env``: a registered id (made with ``render_mode="ansi"`` unless ``render_fn`` is
        given, plus ``make_kwargs``) or an environment instance. ``action_names``: one name per
        action index (default: indices only). ``render_fn(env, observation) -> text`` replaces
        ``env.render()``. ``invalid_penalty`` (>= 0) is subtracted for an invalid reply.
        ``success_fn`` decides ``info["success"]`` (default: terminated with positive reward)."""
        if isinstance(env, str):
            kwargs = dict(make_kwargs or {})
            if render_fn is None:
                kwargs.setdefault("render_mode", "ansi")
            env = gym.make(env, **kwargs)
        elif make_kwargs:
            raise ValueError("make_kwargs applies only when env is an id; got an env instance")
        if not isinstance(env.action_space, spaces.Discrete):
            raise ValueError("GymTextEnv needs a Discrete action space, got "
                             f"{env.action_space}; wrap the environment to discretise it")
        if render_fn is None and env.render_mode != "ansi":
            raise ValueError("the environment does not render text (render_mode="
                             f"{env.render_mode!r}); make it with render_mode='ansi' or pass "
                             "render_fn")
        num_actions = int(env.action_space.n)
        if action_names is not None and len(action_names) != num_actions:
            raise ValueError(f"action_names has {len(action_names)} names but the action space "
                             f"has {num_actions} actions")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if invalid_penalty < 0:
            raise ValueError(f"invalid_penalty is subtracted, so it must be >= 0, "
                             f"got {invalid_penalty}")
        self.env = env
        self.system_prompt = system_prompt
        self.action_names: tuple[str, ...] | None = (tuple(action_names) if action_names
                                                     is not None else None)
        self.render_fn = render_fn
        self.max_turns = max_turns
        self.invalid_penalty = invalid_penalty
        self.success_fn: SuccessFn = success_fn or _default_success
        self._action_start = int(env.action_space.start)
        self._num_actions = num_actions
        self._name_index = ({name.lower(): i for i, name in enumerate(self.action_names)}
                            if self.action_names else {})
        self._last_observation: Any = None
        self.turn = 0
        self.done = True
        self._started = False

    def reset(self, seed: int) -> str:
        """Reset the wrapped environment with ``seed``; return its rendering."""
        self._last_observation, _ = self.env.reset(seed=seed)
        self.turn = 0
        self.done = False
        self._started = True
        return self._render()

    def step(self, action: str) -> StepResult:
        """Parse the reply's last action word; step the wrapped environment if it is valid."""
        if not self._started:
            raise RuntimeError("call reset(seed) before step()")
        if self.done:
            raise RuntimeError("the episode has ended; call reset(seed) or step a fork taken "
                               "before the end")
        index = self.parse_action(action if isinstance(action, str) else str(action))
        self.turn += 1
        if index is None:
            reward, terminated, truncated = -self.invalid_penalty, False, False
            info: dict[str, Any] = {"action_names": [], "invalid_actions": [action[-100:]]}
            prefix = f"Invalid action. Valid actions: {self._valid_text()}.\n"
        else:
            self._last_observation, env_reward, terminated, truncated, env_info = self.env.step(
                index + self._action_start)
            reward = float(env_reward)
            terminated, truncated = bool(terminated), bool(truncated)
            info = dict(env_info)
            info["action_names"] = [self._name(index)]
            info["invalid_actions"] = []
            prefix = ""
        truncated = truncated or (not terminated and self.turn >= self.max_turns)
        self.done = terminated or truncated
        info.update(
            success=bool(self.success_fn(reward, terminated, info)) if self.done else False,
            format_error=index is None,
            action_index=index,
            turn=self.turn,
        )
        if isinstance(self.env.observation_space, spaces.Discrete):
            info["anchor_state"] = str(int(self._last_observation))
        return prefix + self._render(), reward, terminated, truncated, info

    def fork(self) -> GymTextEnv:
        """An independent copy, the wrapped environment's ``np_random`` included."""
        return copy.deepcopy(self)

    def parse_action(self, text: str) -> int | None:
        """The action index named by the reply's last action word or index, else ``None``."""
        for integer, name in reversed(_WORD.findall(text)):
            if name.lower() in self._name_index:
                return self._name_index[name.lower()]
            if integer and len(integer) <= 18:  # int() refuses very long digit strings
                value = int(integer) - self._action_start
                if 0 <= value < self._num_actions:
                    return value
        return None

    @property
    def turn_limit(self) -> int:
        """The most turns an episode takes (``max_turns``)."""
        return int(self.max_turns)

    def example_reply(self, rng: np.random.Generator) -> str:
        """A well-formed reply naming a uniformly random action."""
        return f"Action: {self._name(int(rng.integers(self._num_actions)))}"

    def _name(self, index: int) -> str:
        if self.action_names is not None:
            return self.action_names[index]
        return str(index + self._action_start)

    def _valid_text(self) -> str:
        return ", ".join(self._name(i) for i in range(self._num_actions))

    def _render(self) -> str:
        if self.render_fn is not None:
            return self.render_fn(self.env, self._last_observation)
        text = self.env.render()
        return text if isinstance(text, str) else str(text)
