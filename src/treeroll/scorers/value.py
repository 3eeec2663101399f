"""The learned value scorer (``value``).

:class:`ValueScorer` -- a small MLP on hand-made features of the partial trajectory
(:func:`trajectory_features`), trained online (:meth:`ValueScorer.observe`) on this run's
finished leaves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from treeroll.base import Score
from treeroll.envs.frozenlake_maps import shortest_path_length
from treeroll.scorers.common import clamp, parse_grid, turn_flags
from treeroll.tree import Node, RolloutTree, leaves, path_to, trajectory_reward

__all__ = ["FEATURES", "ValueScorer", "trajectory_features"]


# --------------------------------------------------------------------------------------------
# Features of a partial trajectory, read from text and info only
# --------------------------------------------------------------------------------------------

_TURNS_LEFT = re.compile(r"You have (\d+) (?:turns left|turns to reach)")


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
        grid = parse_grid(path[0].observation_text)
    start_state = None if grid is None else str(grid.start)
    flags = turn_flags(path, start_state)
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
    return clamp(trajectory_reward(leaf))


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
            grid = parse_grid(tree.root.observation_text)
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
        return [Score(clamp(v), f"value {v:.2f} ({self.examples_seen} examples)")
                for v in self.predict(nodes).tolist()]

    def _features(self, node: Node, grid: Any = None) -> np.ndarray:
        if self.features is trajectory_features:
            return trajectory_features(node, grid)
        return np.asarray(self.features(node), dtype=np.float32)
