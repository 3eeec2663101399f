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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from treeroll.base import ExpertReply, StepResult

__all__ = [
    "ACTION_NAMES",
    "WORD_PATTERN",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "distance_to_goal",
    "frozenlake_corpus",
    "make_frozenlake",
    "shortest_path_length",
    "start_distance",
]

Convention = Literal["rllm", "ragen"]
Cell = tuple[int, int]

ACTION_NAMES: tuple[str, ...] = ("Left", "Down", "Right", "Up")
"""Action names in Gymnasium's FrozenLake order (index 0..3)."""

WORD_PATTERN = r"[A-Z][a-z]+|[a-z]+|[A-Z]|\d|\S"
"""A word split under which :func:`frozenlake_corpus` covers every emitted text: words, single
capitals (so a RAGEN grid row such as ``G_PO`` splits into cells), single digits and symbols."""

_MOVES: tuple[Cell, ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (row, col) step per action index
_ACTION_INDEX = {name.lower(): index for index, name in enumerate(ACTION_NAMES)}

FROZEN, HOLE, GOAL = "_", "O", "G"
PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "X", "\u221a"

_BACKTICK_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class FrozenLakeConfig:
    """Everything that defines a FrozenLake convention. Build one with :meth:`rllm` or
    :meth:`ragen` (keyword overrides allowed) rather than field by field."""

    convention: Convention = "rllm"
    """Text and parsing format: ``rllm`` (triple backticks) or ``ragen`` (think/answer tags)."""
    size_min: int = 2
    """Smallest map side; the side is drawn uniformly from ``size_min..size_max`` per seed."""
    size_max: int = 9
    """Largest map side (inclusive)."""
    frozen_prob_min: float = 0.6
    """Lower end of the per-seed probability that a tile is frozen (else a hole)."""
    frozen_prob_max: float = 0.85
    """Upper end of that probability (drawn uniformly between min and max per seed)."""
    slippery: bool = False
    """Gymnasium dynamics: the intended move w.p. 1/3, else one of the two perpendicular moves."""
    max_turns: int = 18
    """Hard cap on model turns per episode (a turn with an invalid reply counts)."""
    max_actions: int | None = None
    """Cap on executed moves per episode (``None``: no cap besides the turn limit)."""
    actions_per_turn: int = 1
    """Moves executed per turn at most; further valid actions in the same reply are ignored."""
    format_penalty: float = 0.0
    """Subtracted once from a turn's reward when its reply held an invalid or no valid action."""
    turn_limit_per_size: int | None = 2
    """If set, a map of side ``n`` allows ``min(max_turns, turn_limit_per_size * n)`` turns."""

    def __post_init__(self) -> None:
        if self.convention not in ("rllm", "ragen"):
            raise ValueError(f"convention must be 'rllm' or 'ragen', got {self.convention!r}")
        if not 2 <= self.size_min <= self.size_max <= 32:
            raise ValueError("size_min and size_max must satisfy 2 <= size_min <= size_max <= 32, "
                             f"got size_min={self.size_min}, size_max={self.size_max}")
        if not 0.0 < self.frozen_prob_min <= self.frozen_prob_max <= 1.0:
            raise ValueError("frozen_prob_min and frozen_prob_max must satisfy "
                             "0 < frozen_prob_min <= frozen_prob_max <= 1, got "
                             f"{self.frozen_prob_min} and {self.frozen_prob_max}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_actions is not None and self.max_actions < 1:
            raise ValueError(f"max_actions must be >= 1 or None, got {self.max_actions}")
        if self.actions_per_turn < 1:
            raise ValueError(f"actions_per_turn must be >= 1, got {self.actions_per_turn}")
        if self.format_penalty < 0:
            raise ValueError("format_penalty is the amount subtracted, so it must be >= 0, "
                             f"got {self.format_penalty}")
        if self.turn_limit_per_size is not None and self.turn_limit_per_size < 1:
            raise ValueError("turn_limit_per_size must be >= 1 or None, "
                             f"got {self.turn_limit_per_size}")
        if self.convention == "rllm" and self.actions_per_turn != 1:
            raise ValueError("the rllm convention executes one action per turn; "
                             f"set actions_per_turn=1, got {self.actions_per_turn}")

    @classmethod
    def rllm(cls, **overrides: Any) -> FrozenLakeConfig:
        """rLLM's convention (PATR's benchmark): size ~ U{2..9}, frozen p ~ U(0.6, 0.85), not
        slippery, ``2 * size`` turns, one action per turn in triple backticks, no penalty."""
        fields: dict[str, Any] = dict(
            convention="rllm", size_min=2, size_max=9, frozen_prob_min=0.6,
            frozen_prob_max=0.85, slippery=False, max_actions=None, actions_per_turn=1,
            format_penalty=0.0, turn_limit_per_size=2,
        )
        fields.update(overrides)
        if "max_turns" not in fields:
            per_size = fields["turn_limit_per_size"]
            fields["max_turns"] = per_size * fields["size_max"] if per_size else 18
        return cls(**fields)

    @classmethod
    def ragen(cls, **overrides: Any) -> FrozenLakeConfig:
        """RAGEN's convention: slippery 4x4 with p = 0.8, up to 5 actions per turn, 5 turns and
        10 actions in all, -0.1 for a turn with an invalid action."""
        fields: dict[str, Any] = dict(
            convention="ragen", size_min=4, size_max=4, frozen_prob_min=0.8,
            frozen_prob_max=0.8, slippery=True, max_turns=5, max_actions=10,
            actions_per_turn=5, format_penalty=0.1, turn_limit_per_size=None,
        )
        fields.update(overrides)
        return cls(**fields)

    def turn_limit(self, size: int) -> int:
        """Turns an episode on a map of side ``size`` may last."""
        if self.turn_limit_per_size is None:
            return self.max_turns
        return min(self.max_turns, self.turn_limit_per_size * size)


def make_frozenlake(convention: str = "rllm", **overrides: Any) -> FrozenLakeEnv:
    """A :class:`FrozenLakeEnv` in the named convention (``rllm`` or ``ragen``), with keyword
    overrides of :class:`FrozenLakeConfig` fields."""
    constructors = {"rllm": FrozenLakeConfig.rllm, "ragen": FrozenLakeConfig.ragen}
    if convention not in constructors:
        raise ValueError(f"unknown FrozenLake convention {convention!r}; "
                         f"valid: {sorted(constructors)}")
    return FrozenLakeEnv(constructors[convention](**overrides))


# --------------------------------------------------------------------------------------------
# Maps
# --------------------------------------------------------------------------------------------


def _neighbour(cell: Cell, action_index: int, size: int) -> Cell:
    """The cell one deterministic move away (moves into the edge leave the player in place)."""
    d_row, d_col = _MOVES[action_index]
    return (min(max(cell[0] + d_row, 0), size - 1), min(max(cell[1] + d_col, 0), size - 1))


def shortest_path_length(grid: Sequence[str], source: Cell, target: Cell) -> int | None:
    """Fewest 4-neighbour moves from ``source`` to ``target`` avoiding holes (BFS); ``None`` if
    no such path exists or ``source`` is a hole. ``grid`` rows hold ``_``, ``O`` and ``G``."""
    size = len(grid)
    if grid[source[0]][source[1]] == HOLE:
        return None
    distance = {source: 0}
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        if cell == target:
            return distance[cell]
        for d_row, d_col in _MOVES:
            row, col = cell[0] + d_row, cell[1] + d_col
            if 0 <= row < size and 0 <= col < size and grid[row][col] != HOLE \
                    and (row, col) not in distance:
                distance[(row, col)] = distance[cell] + 1
                queue.append((row, col))
    return None


def _generate_map(config: FrozenLakeConfig, rng: np.random.Generator
                  ) -> tuple[tuple[str, ...], Cell, Cell]:
    """Draw the side and frozen probability, then maps until a hole-free path joins start and
    goal (start and goal are forced frozen, as in RAGEN's and rLLM's generators)."""
    size = int(rng.integers(config.size_min, config.size_max + 1))
    frozen_prob = float(rng.uniform(config.frozen_prob_min, config.frozen_prob_max))
    while True:
        frozen = rng.random((size, size)) < frozen_prob  # [size, size]
        start_index, goal_index = rng.choice(size * size, size=2, replace=False)
        start = (int(start_index) // size, int(start_index) % size)
        goal = (int(goal_index) // size, int(goal_index) % size)
        rows = [[FROZEN if frozen[r, c] else HOLE for c in range(size)] for r in range(size)]
        rows[start[0]][start[1]] = FROZEN
        rows[goal[0]][goal[1]] = GOAL
        grid = tuple("".join(row) for row in rows)
        if shortest_path_length(grid, start, goal) is not None:
            return grid, start, goal


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
    ``actions_used``.
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
        self.grid, self.start, self.goal = _generate_map(self.config, self._rng)
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
            position = _neighbour(position, index, self.size)
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
        row, column = _neighbour(position, index, self.size)
        return (row, column) != position and self.grid[row][column] in (FROZEN, GOAL)

    def planner_actions(self, position: Cell) -> list[int]:
        """Indices (into ``ACTION_NAMES``) of the moves from ``position`` that end nearest the
        goal by shortest path, avoiding holes (deterministic moves; empty if none can)."""
        scored = []
        for index in range(len(_MOVES)):
            # None for a hole (or a cell cut off from the goal), 0 on the goal itself
            distance = shortest_path_length(self.grid, _neighbour(position, index, self.size),
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
        self.position = _neighbour(self.position, action_index, self.size)


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

