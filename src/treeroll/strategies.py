"""Rollout strategies: where a task's tree branches, continues and stops.

Each strategy is a small dataclass (its hyper-parameters are its fields) implementing
:class:`treeroll.base.Strategy` over the engine in :mod:`treeroll.rollout`. They differ only
in the frontier they return:

* ``chain`` -- G independent trajectories from the root (the GRPO / RLOO baseline).
* ``tree_grpo`` -- Tree-GRPO (ALGORITHMS.md section 2): M chains, then L rounds in which N
  non-leaf nodes of each of the M subtrees are picked uniformly (with replacement) and
  continued to the end; optionally k random leaves kept per subtree (in ``finish``, so the
  budget ending a rollout early does not skip it).
* ``patr`` -- PATR (section 3): B0 branches, advance K turns, score, expand the top-k into M
  children each, let the middle survive, prune ``s < median(s) - alpha`` or Theta repeats of one
  action; pruned branches stay in the group as negatives (option).
* ``random_tree`` -- PATR's random counterpart: the same schedule with uniform random scores and
  no score-based pruning (the "random tree" baseline of the PATR paper).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from treeroll.base import Budget, StrategyContext
from treeroll.tree import Node, NodeStatus, RolloutTree, leaves, path_to, subtree_index

__all__ = ["PATR", "Chain", "RandomTree", "TreeGRPO", "live_or_room"]


def _active(created: Sequence[Node]) -> list[Node]:
    return [n for n in created if not n.ended and n.status == NodeStatus.ACTIVE]


def live_or_room(tree: RolloutTree, created: list[Node], m: int) -> tuple[list[Node], int]:
    """A round-based strategy's first question each step: the branches still running (to
    continue), and, once none is, how many leaves of the ``m`` are left to open."""
    frontier = _active(created)
    return frontier, (0 if frontier else m - len(leaves(tree)))


@dataclass
class Chain:
    """G independent trajectories per task (GRPO's group)."""

    group_size: int = 8
    """G: trajectories per task."""

    name: ClassVar[str] = "chain"
    revisits_nodes: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError("chain.group_size must be >= 1")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """G copies of the root."""
        return [tree.root] * self.group_size

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue every branch that has not ended."""
        return _active(created)

    def units(self, tree: RolloutTree, frontier: Sequence[Node],
              ctx: StrategyContext) -> list[Hashable]:
        """Every trajectory is its own unit: it never waits for the others."""
        if ctx.unit is not None:
            return [ctx.unit] * len(frontier)
        first = ctx.state.get("units", 0)
        ctx.state["units"] = first + len(frontier)
        return list(range(first, first + len(frontier)))

    def extend(self, tree: RolloutTree, ctx: StrategyContext, grant: Budget) -> list[Node]:
        """More chains from the root: one per granted leaf (``group_size`` if the grant has
        no leaf count)."""
        return [tree.root] * (grant.leaves if grant.leaves is not None else self.group_size)


@dataclass
class TreeGRPO:
    """Tree-GRPO's random branching: group size ``m * (l * n + 1)`` before ``k`` and budget.

    Every branch belongs to one of the ``m`` trees: a chain started by a root pick joins the
    tree it was picked for (``Node.tree_index``), in its intra-tree group and as a node to
    branch from in later rounds.
    """

    m: int = 2
    """M: independent chains (trees) per task."""
    n: int = 2
    """N: nodes picked per tree in each expansion round."""
    l: int = 1  # noqa: E741 -- the paper's name
    """L: expansion rounds."""
    k: int | None = None
    """Keep only k random leaves per tree (None keeps all), however the rollout ended."""
    include_root: bool = False
    """Let the root be picked too (the released code does; it amounts to a fresh chain)."""

    name: ClassVar[str] = "tree_grpo"
    revisits_nodes: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.m < 1 or self.n < 0 or self.l < 0:
            raise ValueError("tree_grpo needs m >= 1, n >= 0, l >= 0")
        if self.k is not None and self.k < 1:
            raise ValueError("tree_grpo.k must be >= 1 or null")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """M chains from the root (the i-th is tree i)."""
        ctx.state["round"] = 0
        ctx.state["root_picks"] = list(range(self.m))  # tree of each root entry, in order
        return [tree.root] * self.m

    def units(self, tree: RolloutTree, frontier: Sequence[Node],
              ctx: StrategyContext) -> list[Hashable]:
        """Each of the M trees is a unit: tree ``i`` is expanded as soon as its own branches
        have ended (the synchronous engine waits for all M, as the released code does)."""
        roots = iter(ctx.state.pop("root_units", ctx.state.get("root_picks", [])))
        return [next(roots) if node is tree.root else subtree_index(tree, node)
                for node in frontier]

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """A node may be picked while its tree has expansion rounds left (rounds are counted
        per tree when the engine runs units, per task in synchronous rounds)."""
        rounds = ctx.state.get("unit_rounds", {})
        index = subtree_index(tree, node)
        done = rounds[index] if index in rounds else ctx.state.get("round", 0)
        return int(done) < self.l

    def extend(self, tree: RolloutTree, ctx: StrategyContext, grant: Budget) -> list[Node]:
        """More budget: new chains from the root, one per granted leaf (``m`` without a leaf
        count), dealt over the M trees in turn (each joins the tree it was dealt to, as a
        root pick does); the root keeps its snapshot, the nodes of finished trees do not."""
        count = grant.leaves if grant.leaves is not None else self.m
        ctx.state["root_picks"] = [i % self.m for i in range(count)]
        ctx.state["root_units"] = list(ctx.state["root_picks"])
        return [tree.root] * count

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue active branches; when all have ended, run the next expansion round
        (of the whole task, or of one of its trees when ``ctx.unit`` names it)."""
        if ctx.unit is not None:
            return self._step_unit(tree, created, ctx, int(ctx.unit))  # type: ignore[call-overload]
        # New children of the root come from the root entries of the last frontier, in order;
        # the budget may have cut the last of them.
        fresh = [node for node in created if node.parent is tree.root]
        for node, index in zip(fresh, ctx.state["root_picks"], strict=False):
            node.tree_index = index
        ctx.state["root_picks"] = []
        active = _active(created)
        if active:
            return active
        while ctx.state["round"] < self.l:
            ctx.state["round"] += 1
            picks = self._pick(tree, ctx)
            if picks:
                return picks
        return []

    def _step_unit(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext,
                   index: int) -> list[Node]:
        """Tree ``index`` alone: its rounds are counted apart and its picks drawn from a
        generator of its own, so the picks do not depend on when the other trees end."""
        for node in created:
            if node.parent is tree.root:
                node.tree_index = index
        active = _active(created)
        if active:
            return active
        rounds = ctx.state.setdefault("unit_rounds", {})
        while rounds.get(index, 0) < self.l:
            rounds[index] = rounds.get(index, 0) + 1
            rng = np.random.default_rng([ctx.seed, index, rounds[index]])
            members = _by_tree(tree).get(index, [])
            picks = self._pick_from(tree, members, rng, rounds[index])
            if picks:
                ctx.state["root_units"] = [index] * sum(node is tree.root for node in picks)
                return picks
        return []

    def finish(self, tree: RolloutTree, ctx: StrategyContext) -> None:
        """Keep ``k`` random leaves per tree (when set), whether the schedule or the budget
        ended the rollout."""
        if self.k is None:
            return
        for members in _by_tree(tree).values():
            group = [n for n in members
                     if n.is_leaf and n.status not in NodeStatus.OUT_OF_GROUP]
            if len(group) <= self.k:
                continue
            keep = set(ctx.rng.choice(len(group), size=self.k, replace=False).tolist())
            for i, leaf in enumerate(group):
                if i not in keep:
                    leaf.status, leaf.note = NodeStatus.DROPPED, f"not among the k={self.k} kept"

    def _pick(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        picks: list[Node] = []
        root_picks: list[int] = []
        for index, members in _by_tree(tree).items():
            chosen = self._pick_from(tree, members, ctx.rng, ctx.state["round"])
            picks.extend(chosen)
            root_picks.extend(index for node in chosen if node is tree.root)
        ctx.state["root_picks"] = root_picks
        return picks

    def _pick_from(self, tree: RolloutTree, members: list[Node], rng: np.random.Generator,
                   round_: int) -> list[Node]:
        """N nodes of one tree to expand, uniformly with replacement among its non-leaf
        nodes (and the root with ``include_root``)."""
        candidates = [n for n in members if n.children and not n.ended]
        if self.include_root:
            candidates.append(tree.root)
        picks = []
        for choice in rng.integers(len(candidates), size=self.n) if candidates else []:
            node = candidates[int(choice)]
            node.note = f"picked for expansion in round {round_}"
            picks.append(node)
        return picks


def _by_tree(tree: RolloutTree) -> dict[int, list[Node]]:
    """Every node but the root, grouped by the tree it belongs to (:func:`subtree_index`),
    trees in the order of their first chain."""
    groups: dict[int, list[Node]] = {}
    for first in tree.root.children:
        groups.setdefault(subtree_index(tree, first), []).extend(_subtree(first))
    return groups


def _subtree(node: Node) -> list[Node]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(current.children)
    return out


def action_key(node: Node) -> str:
    """The action a turn took: ``info["action_key"]``, else the moves the environment reports
    it executed (``info["action_names"]``, FrozenLake), else the stripped reply text."""
    if "action_key" in node.info:
        return str(node.info["action_key"])
    names = node.info.get("action_names")
    if names and not node.info.get("format_error", False):
        return "|".join(str(name) for name in names)
    return node.action_text.strip()


def repeated_action(node: Node, theta: int) -> bool:
    """True if the last ``theta`` actions on the path to ``node`` are the same action."""
    if theta < 1:
        return False
    actions = [action_key(n) for n in path_to(node)[1:]]
    return len(actions) >= theta and len(set(actions[-theta:])) == 1


@dataclass
class PATR:
    """Process-scorer guided Adaptive Tree Rollout (ALGORITHMS.md section 3).

    Every ``k_turns`` turns all active branches are scored; the ``top_k`` best expand into
    ``m`` children each (the parent is replaced by its children), branches with
    ``s < median(s) - alpha`` are pruned, the rest survive. A branch whose last ``theta``
    actions are identical is pruned at any turn. Pruned branches stay in the group as
    negatives when ``keep_pruned`` (reward = what they earned when stopped), else they are
    dropped from it. With ``use_scores=False`` (or no scorer) the scores are uniform random
    and nothing is pruned on score: the random-tree counterpart.
    """

    b0: int = 4
    """Initial branches from the task's initial state."""
    k_turns: int = 5
    """K: turns advanced between scoring rounds (5 on FrozenLake, 13 on SWE in the paper)."""
    top_k: int = 2
    """Branches expanded per scoring round."""
    m: int = 2
    """Children per expanded branch."""
    alpha: float = 0.5
    """Prune margin below the median score."""
    theta: int = 6
    """Prune a branch whose last theta actions are the same action (0 disables)."""
    keep_pruned: bool = True
    """Keep pruned branches in the group as negatives (else they are dropped)."""
    use_scores: bool = True
    """False: uniform random scores, no score pruning (the random-tree baseline)."""

    name: ClassVar[str] = "patr"
    revisits_nodes: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.b0 < 1 or self.k_turns < 1 or self.top_k < 0 or self.m < 1:
            raise ValueError("patr needs b0 >= 1, k_turns >= 1, top_k >= 0, m >= 1")
        if self.alpha < 0:
            raise ValueError("patr.alpha must be >= 0")
        if self.theta < 0:
            raise ValueError(f"patr.theta must be >= 0 (0 disables it), got {self.theta}")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """B0 branches from the root."""
        ctx.state["since_score"] = 0
        return [tree.root] * self.b0

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Prune repeats; every K turns score, expand the top-k, prune the low tail."""
        active = []
        for node in _active(created):
            if repeated_action(node, self.theta):
                self._prune(node, f"same action {self.theta} times in a row")
            else:
                active.append(node)
        ctx.state["since_score"] += 1
        if ctx.state["since_score"] < self.k_turns or not active:
            return active
        ctx.state["since_score"] = 0
        scores = self._scores(tree, active, ctx)
        return self.select(active, scores, ctx.rng,
                           prune=self.use_scores and ctx.scorer is not None)

    def select(self, active: list[Node], scores: list[float], rng: np.random.Generator,
               *, prune: bool | None = None) -> list[Node]:
        """One scoring round over ``active`` with ``scores``: expand, survive or prune.

        ``prune`` (default ``use_scores``): whether low scores prune; off when the scores are
        random (scoring disabled or no scorer)."""
        use_prune = (self.use_scores if prune is None else prune) and len(active) > 1
        threshold = float(np.median(scores)) - self.alpha
        order = sorted(range(len(active)), key=lambda i: (-scores[i], i))
        survivors = [i for i in order if not (use_prune and scores[i] < threshold)]
        expand = set(survivors[: self.top_k])
        frontier: list[Node] = []
        for i, node in enumerate(active):
            if i in expand:
                node.note = f"expanded: top-{self.top_k} score {scores[i]:.3f}"
                frontier.extend([node] * self.m)
            elif i in survivors:
                node.note = f"kept: score {scores[i]:.3f}"
                frontier.append(node)
            else:
                self._prune(node, f"score {scores[i]:.3f} < median - alpha = {threshold:.3f}")
        return frontier

    def _scores(self, tree: RolloutTree, active: list[Node], ctx: StrategyContext) -> list[float]:
        if not self.use_scores or ctx.scorer is None:
            values = ctx.rng.random(len(active)).tolist()
            for node, value in zip(active, values, strict=True):
                node.score, node.score_reason = value, "random (scoring disabled)"
            return values
        scored = ctx.scorer(tree, active)
        for node, score in zip(active, scored, strict=True):
            node.score, node.score_reason = score.value, score.reason
        return [s.value for s in scored]

    def _prune(self, node: Node, why: str) -> None:
        node.status = NodeStatus.PRUNED if self.keep_pruned else NodeStatus.DROPPED
        node.note = "pruned: " + why


@dataclass
class RandomTree(PATR):
    """PATR's schedule with random scores and no score pruning (the paper's random tree)."""

    use_scores: bool = False
    """Always False for the random tree."""

    name: ClassVar[str] = "random_tree"
