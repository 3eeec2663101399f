"""FrozenLake as a forkable text environment, in the two conventions agent-RL papers use.

* ``rllm`` -- rLLM's cookbook, on which PATR reports: a seed-derived map of size 2..9, not
  slippery, one action per turn inside triple backticks, ``2 * size`` turns.
* ``ragen`` -- RAGEN's text FrozenLake: a slippery 4x4 map, ``<think>..</think><answer>..</answer>``
  replies holding up to 5 actions separated by ``||``, 5 turns and 10 actions in all, -0.1 for a
  turn whose answer held an invalid action.

The design notes (ENVIRONMENTS.md) list the facts each convention follows; a success rate is only
comparable with a paper's when it was measured on the same convention.

Every text the environment emits is built from a small fixed set of words, punctuation and
digits (see :func:`frozenlake_corpus`), so a word-level tokenizer can cover it.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np

from treeroll.base import ExpertReply, StepResult
from treeroll.envs.frozenlake_maps import (
    ACTION_NAMES,
    FROZEN,
    GOAL,
    HOLE,
    MOVES,
    Cell,
    FrozenLakeConfig,
    generate_map,
    neighbour,
    shortest_path_length,
)

__all__ = [
    "WORD_PATTERN",
    "FrozenLakeEnv",
    "distance_to_goal",
    "frozenlake_corpus",
    "make_frozenlake",
    "start_distance",
]

WORD_PATTERN = r"[A-Z][a-z]+|[a-z]+|[A-Z]|\d|\S"
"""A word split under which :func:`frozenlake_corpus` covers every emitted text: words, single
capitals (so a RAGEN grid row such as ``G_PO`` splits into cells), single digits and symbols."""

_ACTION_INDEX = {name.lower(): index for index, name in enumerate(ACTION_NAMES)}

PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "X", "\u221a"

_BACKTICK_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def make_frozenlake(convention: str = "rllm", **overrides: Any) -> FrozenLakeEnv:
    """A :class:`FrozenLakeEnv` in the named convention (``rllm`` or ``ragen``), with keyword
    overrides of :class:`FrozenLakeConfig` fields."""
    constructors = {"rllm": FrozenLakeConfig.rllm, "ragen": FrozenLakeConfig.ragen}
    if convention not in constructors:
        raise ValueError(f"unknown FrozenLake convention {convention!r}; "
                         f"valid: {sorted(constructors)}")
    return FrozenLakeEnv(constructors[convention](**overrides))


# --------------------------------------------------------------------------------------------
# Texts (a small fixed vocabulary: keep new wording inside frozenlake_corpus's coverage)
# --------------------------------------------------------------------------------------------

_RLLM_SYSTEM = (
    "You are walking on a frozen lake. Reach the goal G without falling into a hole O.\n"
    "Symbols: P is you, _ is frozen ice (the start is frozen too), O is a hole, G is the goal.\n"
    "Valid actions: Up | Down | Left | Right. Each action moves you one cell.\n"
    "Briefly explain your reasoning, then output the chosen action inside triple backticks "
    "on its own line, for example:\n```Up```\n"
    "Only the last triple backtick block counts."
)
_RLLM_REMINDER = ("Invalid action. Reply with one of Up, Down, Left, Right inside triple "
                  "backticks, for example ```Up```.")
_RAGEN_FORMAT = ("Always output: <think> [Your thoughts] </think> <answer> [your answer] "
                 "</answer> with no extra text. Strictly follow this format. "
                 "Max response length: 100 words.")
_GOAL_TEXT = "You reached the goal."
_HOLE_TEXT = "You fell into a hole."
_NO_TURNS_TEXT = "You ran out of turns."
_NO_ACTIONS_TEXT = "You ran out of actions."


def _ragen_system(config: FrozenLakeConfig) -> str:
    total = config.max_actions if config.max_actions is not None else config.actions_per_turn
    return (
        "You are solving the FrozenLake puzzle. Avoid the holes and reach the goal. "
        "The ice is slippery: a move may go in a perpendicular direction instead.\n"
        "Symbols: P is you, _ is frozen ice, O is a hole, G is the goal, X is you in a hole, "
        f"{PLAYER_ON_GOAL} is you on the goal.\n"
        "Valid actions: Left, Down, Right, Up.\n"
        f"You can take up to {total} actions, separated by ' || '."
    )


def _format_reward(reward: float) -> str:
    return f"{reward:g}"


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


class FrozenLakeEnv:
    """A FrozenLake task as a multi-turn text environment (implements :class:`treeroll.base.Env`).

    The map, and for slippery maps every slip, come from one numpy Generator seeded by
    ``reset(seed)``; :meth:`fork` deep-copies it, so a fork continues exactly as the original.
    Model text never raises: a reply without a valid action is an invalid action (it costs the
    turn, with ``config.format_penalty``) and ``info["format_error"]`` is True.

    ``info`` on every step: ``success`` (bool, True once the goal is reached), ``format_error``,
    ``position`` (row, col), ``action_names`` (moves executed this turn, as intended),
    ``invalid_actions`` (the reply pieces that were not valid actions), ``turn``,
    ``actions_used``, ``anchor_state`` (the cell as ``"row,col"``: the state GiGPO's
    ``advantage.gigpo.anchor env_state`` compares, without the observation's turn counter).
    """

    def __init__(self, config: FrozenLakeConfig | None = None) -> None:
        self.config = config if config is not None else FrozenLakeConfig.rllm()
        self.system_prompt: str = (_RLLM_SYSTEM if self.config.convention == "rllm"
                                   else _ragen_system(self.config))
        self._rng: np.random.Generator | None = None
        self.grid: tuple[str, ...] = ()
        """Map rows without the player: ``_`` frozen, ``O`` hole, ``G`` goal."""
        self.start: Cell = (0, 0)
        self.goal: Cell = (0, 0)
        self.position: Cell = (0, 0)
        self.turn = 0
        self.actions_used = 0
        self.done = True
        self.success = False
        self.seed: int | None = None

    @property
    def size(self) -> int:
        """Side of the current map."""
        return len(self.grid)

    @property
    def largest_side(self) -> int:
        """The side of the largest map this environment draws (``size_max``)."""
        return int(self.config.size_max)

    @property
    def turn_limit(self) -> int:
        """Turns this episode may last."""
        return self.config.turn_limit(self.size)

    def reset(self, seed: int) -> str:
        """Generate the map of ``seed`` (deterministically) and return the first observation."""
        self._rng = np.random.default_rng(seed)
        self.grid, self.start, self.goal = generate_map(self.config, self._rng)
        self.position = self.start
        self.turn = 0
        self.actions_used = 0
        self.done = False
        self.success = False
        self.seed = seed
        if self.config.convention == "rllm":
            return (f"Current observation (turn 0):\n{self.render()}\n"
                    f"You have {self.turn_limit} turns to reach the goal.")
        return self._ragen_turn_block()

    def step(self, action: str) -> StepResult:
        """Apply one model reply; see the class docstring for ``info``."""
        if self._rng is None:
            raise RuntimeError("call reset(seed) before step()")
        if self.done:
            raise RuntimeError("the episode has ended; call reset(seed) or step a fork taken "
                               "before the end")
        if not isinstance(action, str):
            action = str(action)
        names, invalid, format_error = self._parse(action)
        budget = self.config.actions_per_turn
        if self.config.max_actions is not None:
            budget = min(budget, self.config.max_actions - self.actions_used)
        executed: list[str] = []
        reward = 0.0
        fell = False
        for name in names[:budget]:
            executed.append(name)
            self.actions_used += 1
            self._move(_ACTION_INDEX[name.lower()])
            if self.position == self.goal:
                self.success = True
                reward += 1.0
                break
            if self.grid[self.position[0]][self.position[1]] == HOLE:
                fell = True
                break
        if format_error:
            reward -= self.config.format_penalty
        self.turn += 1
        terminated = self.success or fell
        out_of_actions = (self.config.max_actions is not None
                          and self.actions_used >= self.config.max_actions)
        truncated = not terminated and (self.turn >= self.turn_limit or out_of_actions)
        self.done = terminated or truncated
        info: dict[str, Any] = {
            "success": self.success,
            "format_error": format_error,
            "position": self.position,
            "action_names": executed,
            "invalid_actions": invalid,
            "turn": self.turn,
            "actions_used": self.actions_used,
            "anchor_state": f"{self.position[0]},{self.position[1]}",
        }
        if self.success:
            ending = _GOAL_TEXT
        elif fell:
            ending = _HOLE_TEXT
        elif truncated:
            ending = _NO_ACTIONS_TEXT if out_of_actions else _NO_TURNS_TEXT
        else:
            ending = ""
        return self._observation(reward, format_error, ending), reward, terminated, truncated, info

    def fork(self) -> FrozenLakeEnv:
        """An independent copy, random number generator state included."""
        return copy.deepcopy(self)

    # ---------------------------------------------------------------------------- text

    def render(self) -> str:
        """The grid as text in this convention (``rllm``: cells joined by two spaces)."""
        rows = []
        for r, row in enumerate(self.grid):
            cells = list(row)
            if r == self.position[0]:
                cell = cells[self.position[1]]
                if self.config.convention == "ragen" and cell == HOLE:
                    cells[self.position[1]] = PLAYER_IN_HOLE
                elif self.config.convention == "ragen" and cell == GOAL:
                    cells[self.position[1]] = PLAYER_ON_GOAL
                else:
                    cells[self.position[1]] = PLAYER
            rows.append(("  " if self.config.convention == "rllm" else "").join(cells))
        return "\n".join(rows)

    def example_reply(self, rng: np.random.Generator) -> str:
        """A well-formed reply with uniformly random actions (a *format* example for a
        supervised warm start; it deliberately encodes no policy)."""
        if self.config.convention == "rllm":
            action = ACTION_NAMES[int(rng.integers(len(ACTION_NAMES)))]
            # No reasoning text: a from-scratch model that learns an optional free-text line
            # tends to repeat it until the turn's token cap (a wasted, malformed turn).
            return f"```{action}```"
        count = int(rng.integers(1, self.config.actions_per_turn + 1))
        actions = [ACTION_NAMES[int(i)] for i in rng.integers(len(ACTION_NAMES), size=count)]
        return f"<think>Moving on.</think><answer>{' || '.join(actions)}</answer>"

    def expert_reply(self, rng: np.random.Generator, skill: float = 1.0, *,
                     explain: bool | str = False, safe_moves: bool = False) -> ExpertReply:
        """The noisy shortest-path planner's reply (implements :class:`treeroll.base.ExpertEnv`):
        each action follows a shortest path to the goal with probability ``skill`` (ties
        broken at random) and is uniformly random otherwise.

        ``is_expert`` is True when every action of the reply is one of the planner's best
        moves where it is taken (a random action that happens to be optimal counts), so SFT
        can train on optimal actions only while the context visits the states the noise led
        to. Slippery maps plan as if the moves were deterministic.

        ``explain`` (rLLM convention) puts one line before the action naming the player's
        cell and the goal's in the ``symbol@row,column`` words of the ``cell_coordinates``
        view (``P@2,3 G@4,5``), the brief reasoning rLLM's prompt asks for. With
        ``safe_moves`` that line goes on with ``safe`` and the actions that land on ice or the
        goal, in the order Up, Down, Left, Right (``P@2,3 G@4,5 safe Up Left``), as the
        ``cell_coordinates_safe`` view's header line writes them. ``explain="words"``
        says the same in a sentence for a model that reads the ``plain`` view (rows and
        columns counted from 1, top left): ``I am at row 3, column 4; the goal is at row 5,
        column 6. Safe moves: Up, Left.``
        """
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"expert_reply: skill must be in [0, 1], got {skill}")
        if safe_moves and self.config.convention != "rllm":
            raise ValueError(f"expert_reply: safe_moves goes on the explanation line of the "
                             f"rllm convention; this environment uses "
                             f"{self.config.convention!r}")
        count = (1 if self.config.convention == "rllm"
                 else int(rng.integers(1, self.config.actions_per_turn + 1)))
        position, actions, optimal = self.position, [], True
        for _ in range(count):
            best = self.planner_actions(position)
            if best and rng.random() < skill:
                index = best[int(rng.integers(len(best)))]
            else:
                index = int(rng.integers(len(ACTION_NAMES)))
            optimal = optimal and index in best
            actions.append(ACTION_NAMES[index])
            position = neighbour(position, index, self.size)
        if self.config.convention == "rllm":
            reasoning = self._explanation(explain, safe_moves) if explain else ""
            return ExpertReply(f"{reasoning}```{actions[0]}```", optimal)
        return ExpertReply(f"<think>Moving on.</think><answer>{' || '.join(actions)}</answer>",
                           optimal)

    def _explanation(self, style: bool | str, safe_moves: bool) -> str:
        """The line before the action (:meth:`expert_reply`): cell words, or ``words``."""
        if style not in (True, "cells", "words"):
            raise ValueError(f"expert_reply: explain is {style!r}; valid: True, 'cells', "
                             "'words'")
        safe = [name for name in ("Up", "Down", "Left", "Right")
                if self._lands_safely(self.position, _ACTION_INDEX[name.lower()])]
        (row, column), (goal_row, goal_column) = self.position, self.goal
        if style == "words":
            line = (f"I am at row {row + 1}, column {column + 1}; the goal is at row "
                    f"{goal_row + 1}, column {goal_column + 1}.")
            return line + (f" Safe moves: {', '.join(safe) or 'none'}." if safe_moves
                           else "") + "\n"
        line = f"P@{row},{column} G@{goal_row},{goal_column}"
        return line + (" safe" + "".join(f" {name}" for name in safe) if safe_moves
                       else "") + "\n"

    def _lands_safely(self, position: Cell, index: int) -> bool:
        """Whether move ``index`` from ``position`` lands on ice or the goal (not a hole, and
        not off the map, where the player would stay put)."""
        row, column = neighbour(position, index, self.size)
        return (row, column) != position and self.grid[row][column] in (FROZEN, GOAL)

    def planner_actions(self, position: Cell) -> list[int]:
        """Indices (into ``ACTION_NAMES``) of the moves from ``position`` that end nearest the
        goal by shortest path, avoiding holes (deterministic moves; empty if none can)."""
        scored = []
        for index in range(len(MOVES)):
            # None for a hole (or a cell cut off from the goal), 0 on the goal itself
            distance = shortest_path_length(self.grid, neighbour(position, index, self.size),
                                            self.goal)
            if distance is not None:
                scored.append((distance, index))
        if not scored:
            return []
        lowest = min(d for d, _ in scored)
        return [i for d, i in scored if d == lowest]

    def vocabulary_texts(self, n_seeds: int = 20) -> list[str]:
        """Sample texts covering every word this environment can emit
        (see :func:`frozenlake_corpus`)."""
        return frozenlake_corpus(self.config, n_seeds)

    def _observation(self, reward: float, format_error: bool, ending: str) -> str:
        if self.config.convention == "rllm":
            lines = []
            if format_error:
                lines.append(_RLLM_REMINDER)
            if ending:
                lines.append(ending)
            lines.append(f"Current observation (turn {self.turn}):\n{self.render()}")
            if not ending:
                lines.append(f"You have {self.turn_limit - self.turn} turns left.")
            return "\n".join(lines)
        head = f"Reward:\n{_format_reward(reward)}\n"
        if ending:
            return f"{head}State:\n{self.render()}\n{ending}"
        return head + self._ragen_turn_block()

    def _ragen_turn_block(self) -> str:
        left = (self.config.max_actions - self.actions_used if self.config.max_actions
                is not None else self.config.actions_per_turn)
        return (f"Turn {self.turn + 1}:\nState:\n{self.render()}\n"
                f"You have {left} actions left. {_RAGEN_FORMAT}")

    # ---------------------------------------------------------------------------- dynamics

    def _parse(self, text: str) -> tuple[list[str], list[str], bool]:
        """``(valid action names, invalid pieces, format_error)`` of one reply."""
        if self.config.convention == "rllm":
            blocks = _BACKTICK_BLOCK.findall(text)
            if not blocks:
                return [], [], True
            last = blocks[-1].strip()
            if last.lower() in _ACTION_INDEX:
                return [ACTION_NAMES[_ACTION_INDEX[last.lower()]]], [], False
            return [], [last[:100]], True
        match = _THINK_ANSWER.search(text)
        if match is None:
            return [], [], True
        valid: list[str] = []
        invalid: list[str] = []
        for piece in match.group(2).split("||"):
            piece = piece.strip()
            if not piece:
                continue
            if piece.lower() in _ACTION_INDEX:
                valid.append(ACTION_NAMES[_ACTION_INDEX[piece.lower()]])
            else:
                invalid.append(piece[:100])
        return valid, invalid, bool(invalid) or not valid

    def _move(self, action_index: int) -> None:
        assert self._rng is not None
        if self.config.slippery:
            # Gymnasium's FrozenLake: (a - 1) % 4, a, (a + 1) % 4, each with probability 1/3.
            action_index = (action_index - 1 + int(self._rng.integers(3))) % 4
        self.position = neighbour(self.position, action_index, self.size)


# --------------------------------------------------------------------------------------------
# Helpers for scorers and tokenizers
# --------------------------------------------------------------------------------------------


def distance_to_goal(env: FrozenLakeEnv) -> int | None:
    """Fewest moves from the player's cell to the goal avoiding holes (BFS, 4-neighbour);
    ``None`` if the goal is unreachable or the player is in a hole. For process scorers."""
    return shortest_path_length(env.grid, env.position, env.goal)


def start_distance(env: FrozenLakeEnv) -> int | None:
    """Like :func:`distance_to_goal`, from the start cell (the task's initial distance)."""
    return shortest_path_length(env.grid, env.start, env.goal)


def frozenlake_corpus(config: FrozenLakeConfig, n_seeds: int = 20) -> list[str]:
    """Sample texts for building a word-level vocabulary: the system prompt, observations of
    random-policy episodes (with invalid replies, reminders, every ending), example replies in
    every action name, and the digits. Deterministic in ``(config, n_seeds)``. Every word of
    every text the environment emits, split by :data:`WORD_PATTERN`, occurs in these texts."""
    rng = np.random.default_rng(0)
    env = FrozenLakeEnv(config)
    texts = [env.system_prompt, _RLLM_REMINDER, _GOAL_TEXT, _HOLE_TEXT, _NO_TURNS_TEXT,
             _NO_ACTIONS_TEXT, _RAGEN_FORMAT, " ".join(str(d) for d in range(10)),
             " ".join(ACTION_NAMES), "-0.1 0.9 1 0 " + " ".join([PLAYER_IN_HOLE, PLAYER_ON_GOAL])]
    texts += [f"```{name}```" for name in ACTION_NAMES]
    texts.append(f"<think>Moving on.</think><answer>{' || '.join(ACTION_NAMES)}</answer>")
    for seed in range(n_seeds):
        texts.append(env.reset(seed))
        while not env.done:
            reply = env.example_reply(rng) if rng.random() < 0.8 else "asdf"
            texts.append(reply)
            texts.append(env.step(reply)[0])
    return texts

