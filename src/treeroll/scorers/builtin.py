"""Process scorers: PATR's feedback on partial trajectories (ALGORITHMS.md section 3).

Every scorer implements :class:`treeroll.base.ProcessScorer`: called with a tree and the nodes
to score (batched), it returns one :class:`~treeroll.base.Score` per node, a value in ``[0, 1]``
(higher = more promising) and a short reason. A node's state is ``node.env`` (the environment
after the node's step; PATR scores active nodes while it is still there) and its path,
``path_to(node)`` (action texts, ``info``, observation texts).

* :class:`FrozenLakeProgress` (``frozenlake_progress``) -- shortest-path distance to the goal
  relative to the start's, 0 in a hole, 1 on the goal, lowered for format errors.
* :class:`Degeneracy` (``degeneracy``) -- any environment: repeated actions, revisited states,
  a trailing run of format errors.
* :class:`ValueScorer` (``value``) -- a small MLP on hand-made features of the partial
  trajectory, trained online (:meth:`ValueScorer.observe`) on this run's finished leaves.
* :class:`JudgeScorer` (``judge``) -- a language model on any generation backend rates progress
  0-10; :func:`parse_rating` reads its reply.
* :class:`Blend` (``blend``, :func:`blend`) -- ``lam * a + (1 - lam) * b``.

Scoring cost: the rollout engine wraps the scorer in :class:`treeroll.engine.rollout.TimedScorer`
(wall time, calls, nodes); the judge also counts the tokens it made its backend compute.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treeroll.base import GenerationBackend, GenerationRequest, ProcessScorer, SamplingParams, Score
from treeroll.envs.frozenlake import (
    FrozenLakeEnv,
    distance_to_goal,
    shortest_path_length,
    start_distance,
)
from treeroll.formatting import TurnFormat
from treeroll.strategies import action_key
from treeroll.tree import Node, RolloutTree, leaves, path_to, trajectory_reward

__all__ = [
    "JUDGE_PROMPT",
    "Blend",
    "Degeneracy",
    "FrozenLakeProgress",
    "JudgeScorer",
    "ValueScorer",
    "blend",
    "parse_rating",
    "trajectory_features",
]


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


# --------------------------------------------------------------------------------------------
# Path statistics shared by the heuristics and the value features
# --------------------------------------------------------------------------------------------


def _state_key(node: Node) -> str | None:
    """A state identity for revisit counting: the reported position, if any."""
    position = node.info.get("position")
    return None if position is None else str(tuple(position))


@dataclass(frozen=True)
class _TurnFlags:
    """Per-turn flags of a path (root excluded), in path order."""

    repeat: list[bool]
    """The turn's action equals the previous turn's."""
    revisit: list[bool] | None
    """The turn ended in a state already visited on the path (start included); None when the
    environment reports no state."""
    format_error: list[bool]

    @property
    def trailing_format_errors(self) -> int:
        """Length of the run of format errors that ends the path."""
        run = 0
        for error in reversed(self.format_error):
            if not error:
                break
            run += 1
        return run


def _turn_flags(path: Sequence[Node], start_state: str | None = None) -> _TurnFlags:
    turns = path[1:]
    keys = [action_key(n) for n in turns]
    repeat = [i > 0 and keys[i] == keys[i - 1] for i in range(len(keys))]
    states = [_state_key(n) for n in turns]
    revisit: list[bool] | None = None
    if states and all(s is not None for s in states):
        seen: set[str | None] = {start_state} if start_state is not None else set()
        revisit = []
        for state in states:
            revisit.append(state in seen)
            seen.add(state)
    errors = [bool(n.info.get("format_error", False)) for n in turns]
    return _TurnFlags(repeat, revisit, errors)


# --------------------------------------------------------------------------------------------
# FrozenLake progress
# --------------------------------------------------------------------------------------------


@dataclass
class FrozenLakeProgress:
    """PATR's FrozenLake heuristic: how much closer to the goal than at the start.

    With ``d`` the shortest hole-free path from the player's cell to the goal and ``d0`` the
    start's, the base score is ``0.5 + 0.5 * (d0 - d) / d0`` clipped to ``[0, 1]``: 0.5 at the
    start (or anywhere as far as it), 1.0 on the goal, 0 at twice the start's distance or in a
    hole. Each format error on the path subtracts ``format_penalty``; if the goal is farther
    than the turns left, the score is multiplied by ``out_of_reach_factor``.
    """

    format_penalty: float = 0.1
    """Subtracted per format error (invalid reply) on the path."""
    out_of_reach_factor: float = 0.5
    """Multiplier when the goal needs more moves than the episode has turns left."""

    def __post_init__(self) -> None:
        if self.format_penalty < 0 or not 0 <= self.out_of_reach_factor <= 1:
            raise ValueError("frozenlake_progress needs format_penalty >= 0 and "
                             "0 <= out_of_reach_factor <= 1")

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """One score per node, from ``node.env`` (a :class:`FrozenLakeEnv`)."""
        return [self.score_node(node) for node in nodes]

    def score_node(self, node: Node) -> Score:
        """The score of one node (ended nodes without a snapshot: 1 on success, 0 otherwise)."""
        env = node.env
        if env is None:
            if node.info.get("success"):
                return Score(1.0, "reached the goal")
            if node.terminated:
                return Score(0.0, "fell into a hole")
            return Score(0.5, "no environment snapshot at this node")
        if not isinstance(env, FrozenLakeEnv):
            raise TypeError(f"frozenlake_progress scores FrozenLake states, got "
                            f"{type(env).__name__}; use degeneracy, value or judge instead")
        if env.success:
            return Score(1.0, "reached the goal")
        distance = distance_to_goal(env)
        if distance is None:
            return Score(0.0, "fell into a hole")
        initial = max(start_distance(env) or 1, 1)
        value = 0.5 + 0.5 * (initial - distance) / initial
        reason = f"distance {distance} (start {initial})"
        errors = sum(bool(n.info.get("format_error", False)) for n in path_to(node)[1:])
        if errors:
            value -= self.format_penalty * errors
            reason += f", {errors} format error{'s' if errors > 1 else ''}"
        turns_left = env.turn_limit - env.turn
        if distance > turns_left:
            value *= self.out_of_reach_factor
            reason += f", goal out of reach in {turns_left} turns"
        return Score(_clamp(value), reason)


# --------------------------------------------------------------------------------------------
# Degeneracy
# --------------------------------------------------------------------------------------------


@dataclass
class Degeneracy:
    """Penalises degenerate behaviour; needs no environment snapshot (reads the path only).

    Three rates in ``[0, 1]``: ``repeat`` (share of the last ``window`` turns repeating the
    previous action), ``revisit`` (share of the last ``window`` turns ending in a state seen
    before on the path, when ``info["position"]`` is reported) and ``format`` (the trailing run
    of format errors over ``max_format_run``, capped at 1). The score is one minus their
    weighted mean, so 1.0 means nothing degenerate and 0.0 every signal at its worst.
    """

    window: int = 6
    """Turns looked at for repeats and revisits (PATR's Theta is 6)."""
    max_format_run: int = 3
    """A trailing run of this many format errors gives the full format penalty."""
    repeat_weight: float = 1.0
    revisit_weight: float = 1.0
    format_weight: float = 1.0

    def __post_init__(self) -> None:
        weights = (self.repeat_weight, self.revisit_weight, self.format_weight)
        if self.window < 2 or self.max_format_run < 1:
            raise ValueError("degeneracy needs window >= 2 and max_format_run >= 1")
        if min(weights) < 0 or sum(weights) <= 0:
            raise ValueError("degeneracy weights must be >= 0 with a positive sum")

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """One score per node, from its path."""
        start = _root_start_state(tree)
        return [self.score_path(path_to(node), start) for node in nodes]

    def score_path(self, path: Sequence[Node], start_state: str | None = None) -> Score:
        """The score of the partial trajectory ``path`` (root first)."""
        if len(path) < 2:
            return Score(1.0, "no action yet")
        flags = _turn_flags(path, start_state)
        recent = flags.repeat[-self.window:]
        repeat = sum(recent) / len(recent)
        revisit = 0.0
        if flags.revisit is not None:
            visits = flags.revisit[-self.window:]
            revisit = sum(visits) / len(visits)
        errors = flags.trailing_format_errors
        fmt = min(1.0, errors / self.max_format_run)
        total = self.repeat_weight + self.revisit_weight + self.format_weight
        bad = (self.repeat_weight * repeat + self.revisit_weight * revisit
               + self.format_weight * fmt) / total
        reason = f"repeats {repeat:.2f}, revisits {revisit:.2f}, format-error run {errors}"
        return Score(_clamp(1.0 - bad), reason)


def _root_start_state(tree: RolloutTree) -> str | None:
    grid = _parse_grid(tree.root.observation_text)
    return None if grid is None else str(grid.start)


# --------------------------------------------------------------------------------------------
# Features of a partial trajectory (for the value scorer), read from text and info only
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grid:
    rows: tuple[str, ...]
    start: tuple[int, int]
    goal: tuple[int, int]


_CELLS = "_OGPX\u221a"
_RLLM_ROW = re.compile(rf"^[{_CELLS}](?: +[{_CELLS}])+$")
_RAGEN_ROW = re.compile(rf"^[{_CELLS}]{{2,}}$")
_TURNS_LEFT = re.compile(r"You have (\d+) (?:turns left|turns to reach)")


def _parse_grid(text: str) -> _Grid | None:
    """The FrozenLake map in an observation text (the last block of grid rows), or None."""
    block: list[str] = []
    last: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if _RLLM_ROW.match(line):
            block.append(line.replace(" ", ""))
        elif _RAGEN_ROW.match(line):
            block.append(line)
        else:
            if block:
                last = block
            block = []
    if block:
        last = block
    if not last or any(len(row) != len(last) for row in last):
        return None
    start = goal = None
    rows = []
    for r, row in enumerate(last):
        for c, cell in enumerate(row):
            if cell in "PX\u221a":
                start = (r, c)
            if cell in "G\u221a":
                goal = (r, c)
        rows.append("".join("_" if cell == "P" else "O" if cell == "X" else
                            "G" if cell == "\u221a" else cell for cell in row))
    if start is None or goal is None:
        return None
    return _Grid(tuple(rows), start, goal)


FEATURES = 11
"""Length of :func:`trajectory_features` vectors."""


def trajectory_features(node: Node, grid: Any = None) -> np.ndarray:
    """Hand-made features of the partial trajectory ending at ``node``, shape ``[FEATURES]``.

    Read from the path's texts and ``info`` only (finished trees keep no environment), so
    features of a node being scored and of a finished leaf's ancestors are computed the same
    way. FrozenLake maps are parsed from the root observation (``grid`` may pass a parsed one);
    on other environments the map features are zero and ``grid_known`` is 0.
    """
    path = path_to(node)
    if grid is None:
        grid = _parse_grid(path[0].observation_text)
    start_state = None if grid is None else str(grid.start)
    flags = _turn_flags(path, start_state)
    turns = max(len(flags.repeat), 1)
    features = np.zeros(FEATURES, dtype=np.float32)
    features[0] = len(flags.repeat) / 16.0
    features[1] = sum(flags.format_error) / turns
    features[2] = min(flags.trailing_format_errors, 6) / 6.0
    features[3] = sum(flags.repeat) / turns
    features[4] = sum(flags.revisit) / turns if flags.revisit is not None else 0.0
    features[5] = float(bool(node.info.get("success", False)))
    if grid is not None:
        features[6] = 1.0
        position = node.info.get("position")
        position = grid.start if position is None else tuple(int(v) for v in position)
        initial = max(shortest_path_length(grid.rows, grid.start, grid.goal) or 1, 1)
        distance = shortest_path_length(grid.rows, position, grid.goal)
        features[7] = float(distance is None)  # in a hole
        features[8] = 2.0 if distance is None else min(distance / initial, 2.0)
        features[9] = len(grid.rows) / 9.0
        left = _TURNS_LEFT.findall(node.observation_text)
        if left and distance is not None:
            features[10] = float(np.clip((int(left[-1]) - distance) / 9.0, -1.0, 1.0))
    return features


# --------------------------------------------------------------------------------------------
# The learned value scorer
# --------------------------------------------------------------------------------------------


def _outcome(leaf: Node) -> float:
    return _clamp(trajectory_reward(leaf))


class ValueScorer:
    """A tiny value model trained online on this run's finished leaves.

    Every node on a finished leaf's path (root excluded) is one example: its
    :func:`trajectory_features` labelled with the leaf's outcome (reward clipped to ``[0, 1]``),
    so a node shared by several leaves is a Monte-Carlo estimate of its value. The model is a
    2-layer MLP (``FEATURES -> hidden -> 1``, sigmoid) fitted with Adam on a replay buffer of
    the latest ``buffer_size`` examples after each :meth:`observe`. It answers 0.5 ("untrained")
    until it has seen ``min_examples`` examples.

    Only leaves the environment ended (``terminal`` / ``truncated``) are used by default:
    a pruned branch's outcome is a consequence of the pruning, and learning from it would
    teach the scorer its own past opinions.
    """

    def __init__(self, *, min_examples: int = 64, hidden: int = 16, steps_per_observe: int = 60,
                 lr: float = 0.02, buffer_size: int = 4096, natural_endings_only: bool = True,
                 seed: int = 0,
                 features: Callable[[Node], np.ndarray] = trajectory_features) -> None:
        if min_examples < 1 or hidden < 1 or steps_per_observe < 0 or buffer_size < 1:
            raise ValueError("value scorer needs min_examples, hidden, buffer_size >= 1 and "
                             "steps_per_observe >= 0")
        import torch

        self.min_examples = min_examples
        self.steps_per_observe = steps_per_observe
        self.buffer_size = buffer_size
        self.natural_endings_only = natural_endings_only
        self.features = features
        self.examples_seen = 0
        """Examples observed so far (all time, not just those in the buffer)."""
        self.last_loss = float("nan")
        generator = torch.Generator().manual_seed(seed)
        width = len(features(Node(id=0, parent=None, depth=0)))
        self._model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.Tanh(),
                                          torch.nn.Linear(hidden, 1))
        with torch.no_grad():
            for parameter in self._model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
        self._optimizer = torch.optim.Adam(self._model.parameters(), lr=lr)
        self._x = np.zeros((0, width), dtype=np.float32)  # [examples, features]
        self._y = np.zeros(0, dtype=np.float32)  # [examples]

    @property
    def trained(self) -> bool:
        """True once enough examples were observed for the scores to mean something."""
        return self.examples_seen >= self.min_examples

    def observe(self, trees: Sequence[RolloutTree]) -> float:
        """Add every finished leaf's path of ``trees`` to the buffer and fit; returns the loss."""
        from treeroll.tree import NodeStatus

        rows: list[np.ndarray] = []
        labels: list[float] = []
        for tree in trees:
            grid = _parse_grid(tree.root.observation_text)
            for leaf in leaves(tree):
                if self.natural_endings_only and leaf.status not in (NodeStatus.TERMINAL,
                                                                     NodeStatus.TRUNCATED):
                    continue
                outcome = _outcome(leaf)
                for node in path_to(leaf)[1:]:
                    rows.append(self._features(node, grid))
                    labels.append(outcome)
        if rows:
            self._x = np.concatenate([self._x, np.stack(rows)])[-self.buffer_size:]
            self._y = np.concatenate([self._y, np.array(labels, np.float32)])[-self.buffer_size:]
            self.examples_seen += len(rows)
        if len(self._y) and self.steps_per_observe:
            self.last_loss = self.fit(self.steps_per_observe)
        return self.last_loss

    def fit(self, steps: int) -> float:
        """``steps`` full-batch Adam steps of binary cross-entropy on the buffer."""
        import torch

        x = torch.from_numpy(self._x)
        y = torch.from_numpy(self._y)
        loss = torch.tensor(float("nan"))
        self._model.train()
        for _ in range(steps):
            logits = self._model(x).squeeze(-1)  # [examples]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
            self._optimizer.zero_grad()
            loss.backward()
            self._optimizer.step()
        self._model.eval()
        return float(loss.detach())

    def predict(self, nodes: Sequence[Node]) -> np.ndarray:
        """Predicted outcome of each node's partial trajectory, shape ``[len(nodes)]``."""
        import torch

        if not nodes:
            return np.zeros(0, dtype=np.float32)
        x = torch.from_numpy(np.stack([self._features(n) for n in nodes]))
        with torch.no_grad():
            return torch.sigmoid(self._model(x).squeeze(-1)).numpy()

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """One predicted outcome per node; 0.5 ("untrained") before ``min_examples``."""
        if not self.trained:
            return [Score(0.5, "untrained") for _ in nodes]
        return [Score(_clamp(v), f"value {v:.2f} ({self.examples_seen} examples)")
                for v in self.predict(nodes).tolist()]

    def _features(self, node: Node, grid: Any = None) -> np.ndarray:
        if self.features is trajectory_features:
            return trajectory_features(node, grid)
        return np.asarray(self.features(node), dtype=np.float32)


# --------------------------------------------------------------------------------------------
# LLM judge
# --------------------------------------------------------------------------------------------

JUDGE_PROMPT = (
    "You are judging an agent that is part-way through a task.\n"
    "Task:\n{task}\n\n"
    "Most recent turns:\n{history}\n\n"
    "How likely is the agent to succeed from here? Rate its progress from 0 (hopeless) to "
    "10 (certain success). Answer with one line: Rating: N/10"
)
"""The judge's default prompt; ``{task}`` is the root observation, ``{history}`` recent turns."""

_NUMBER = r"(-?\d+(?:\.\d+)?)"
_FRACTION = re.compile(_NUMBER + r"\s*(?:/|out of)\s*" + _NUMBER, re.IGNORECASE)
_PERCENT = re.compile(_NUMBER + r"\s*%")
_KEYWORD = re.compile(r"(?:rating|score|grade)\s*(?:is|of|=|:)?\s*" + _NUMBER, re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
          "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_WORD = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)


def parse_rating(reply: str, scale: float = 10.0) -> float | None:
    """A judge's reply as a score in ``[0, 1]``, or ``None`` if no rating can be read.

    Tried in order: a fraction ``a/b`` or ``a out of b`` with ``0 <= a <= b`` ("7/10",
    "3 out of 5"); a percentage ("70%"); a number after ``rating`` / ``score`` / ``grade``
    ("Rating: 8"); the first number in ``[0, scale]``; the first number word zero..ten.
    Numbers inside an out-of-range fraction or percentage ("12/10") are not read again.
    """
    for match in _FRACTION.finditer(reply):
        value, whole = float(match.group(1)), float(match.group(2))
        if whole > 0 and 0 <= value <= whole:
            return value / whole
    for match in _PERCENT.finditer(reply):
        if 0 <= float(match.group(1)) <= 100:
            return float(match.group(1)) / 100
    rest = _PERCENT.sub(" ", _FRACTION.sub(" ", reply))  # numbers of out-of-range fractions
    for pattern in (_KEYWORD, _ANY_NUMBER):
        for match in pattern.finditer(rest):
            if 0 <= float(match.group(1)) <= scale:
                return float(match.group(1)) / scale
    word = _WORD.search(reply)
    if word is not None:
        return _WORDS[word.group(1).lower()] / scale
    return None


@dataclass
class JudgeScorer:
    """A language model asked to rate each partial trajectory's progress 0-10.

    One request per node, all sent to ``backend`` in one batch; the prompt is
    ``prompt_template`` filled with the task (root observation) and the last ``last_turns``
    turns (PATR's PRM looks at the last 10 steps), wrapped by ``turn_format`` as a first turn.
    A reply :func:`parse_rating` cannot read scores 0.5 ("unparsable judge reply").
    The tokens the judge made its backend generate and prefill are counted in ``cost``.
    """

    backend: GenerationBackend
    turn_format: TurnFormat
    prompt_template: str = JUDGE_PROMPT
    system_prompt: str = ""
    last_turns: int = 10
    """Turns of history shown (the most recent)."""
    max_new_tokens: int = 16
    """Tokens the judge may write per rating."""
    temperature: float = 0.0
    """0 = greedy (the judge's rating is then deterministic)."""
    max_chars: int = 4000
    """Task and history texts are cut (keeping their ends) to this many characters each."""
    seed: int = 0
    cost: dict[str, int] = field(default_factory=lambda: {
        "requests": 0, "generated": 0, "prefill": 0, "cached": 0, "unparsable": 0})
    """Running totals: requests, generated / prefilled / cached tokens, unparsable replies."""

    def __post_init__(self) -> None:
        if "{history}" not in self.prompt_template:
            raise ValueError("judge prompt_template must contain {history} (and may use {task})")
        if self.last_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("judge needs last_turns >= 1 and max_new_tokens >= 1")

    def prompt_text(self, node: Node) -> str:
        """The judge's prompt for one node."""
        path = path_to(node)
        turns = []
        for i, step in enumerate(path[1:][-self.last_turns:]):
            number = len(path) - 1 - min(self.last_turns, len(path) - 1) + i + 1
            turns.append(f"Turn {number} action:\n{step.action_text.strip()}\n"
                         f"Turn {number} result:\n{step.observation_text.strip()}")
        history = "\n".join(turns) if turns else "(no action yet)"
        return self.prompt_template.format(task=path[0].observation_text.strip()[-self.max_chars:],
                                           history=history[-self.max_chars:])

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """Ask the judge once per node (one batched backend call) and parse the replies."""
        if not nodes:
            return []
        requests = [GenerationRequest(prompt_ids=tuple(self.turn_format.prompt(
            self.system_prompt, self.prompt_text(node))[0]), seed=self.seed + node.id)
            for node in nodes]
        params = SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                                stop_token_ids=self.turn_format.stop_token_ids)
        completions = self.backend.generate(requests, params)
        scores = []
        for completion in completions:
            self.cost["requests"] += 1
            self.cost["generated"] += len(completion.token_ids)
            self.cost["prefill"] += completion.prefill_tokens
            self.cost["cached"] += completion.cached_tokens
            reply = self.turn_format.decode_action(completion.token_ids).strip()
            value = parse_rating(reply)
            if value is None:
                self.cost["unparsable"] += 1
                scores.append(Score(0.5, "unparsable judge reply"))
            else:
                scores.append(Score(_clamp(value), f"judge: {reply[:40]}"))
        return scores


# --------------------------------------------------------------------------------------------
# Blend
# --------------------------------------------------------------------------------------------


@dataclass
class Blend:
    """``lam * a + (1 - lam) * b`` of two scorers (PATR's ``lambda * judge + (1 - lambda) *
    heuristic``). :meth:`observe` is forwarded to the parts that learn."""

    a: ProcessScorer
    b: ProcessScorer
    lam: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"blend lambda must lie in [0, 1], got {self.lam}")

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """Both scorers on all nodes, mixed."""
        first, second = self.a(tree, nodes), self.b(tree, nodes)
        return [Score(_clamp(self.lam * x.value + (1 - self.lam) * y.value),
                      f"{self.lam:g}*[{x.reason}] + {1 - self.lam:g}*[{y.reason}]")
                for x, y in zip(first, second, strict=True)]

    def observe(self, trees: Sequence[RolloutTree]) -> None:
        """Let each part that learns online (has ``observe``) see the finished trees."""
        for part in (self.a, self.b):
            observe = getattr(part, "observe", None)
            if observe is not None:
                observe(trees)


def blend(a: ProcessScorer, b: ProcessScorer, lam: float) -> Blend:
    """``lam * a + (1 - lam) * b``, checked to lie in ``[0, 1]``."""
    return Blend(a, b, lam)
