"""Allocators: how much of a batch's rollout budget each task gets
(:class:`treeroll.base.Allocator`).

* ``uniform`` (:class:`UniformAllocator`): every task the same budget, once.
* ``vigor`` (:class:`Vigor`): VIGOR's variance-guided allocation (docs/methods.md).
  Every task starts with ``m0`` rollouts; in each later round the tasks kept from the round
  before are ranked by the variance of their group's rewards, the top ``alpha`` of them are
  kept and their rollout count is multiplied by ``gamma``. VIGOR decides *how much* a task
  gets; the task's strategy decides how that budget becomes a tree (chain adds chains,
  Tree-GRPO deals new root chains over its trees: :class:`treeroll.base.ExtendableStrategy`).

treeroll's reading where the paper's summary is silent:

* the total is pinned to the uniform budget it replaces, ``group`` leaves per task
  (``rollout.max_leaves`` unless ``allocator.vigor.group`` is set) times the tasks of the
  batch; a grant never takes the batch past it, and what the rounds leave unspent is dealt
  one leaf at a time to the tasks in order of reward variance (highest first, then task
  order), so the batch spends exactly the uniform total;
* a task whose rewards are all equal (variance 0) is never kept for a doubling round: more
  samples of an all-success or all-failure task carry no GRPO signal unless it changes;
* with a token budget (``rollout.max_generated_tokens``) each task's tokens follow its leaves:
  ``tokens * leaves / group``, so the batch's tokens also total the uniform ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from treeroll.base import Allocator, Budget
from treeroll.checks import checked
from treeroll.engine.settings import RolloutConfig
from treeroll.registry import Registry
from treeroll.tree import RolloutTree, leaf_rewards, leaves

__all__ = ["ALLOCATORS", "AllocatorConfig", "UniformAllocator", "Vigor", "VigorConfig",
           "build_vigor", "make_allocator"]


@dataclass
class VigorConfig:
    """VIGOR's settings (defaults: the paper's m0 = 2, T = 4 rounds, alpha = 0.5, gamma = 2)."""

    m0: int = checked(2, ge=1)
    """Rollouts every task starts with."""
    rounds: int = checked(4, ge=1)
    """Rounds in all, the first (``m0`` each) included."""
    alpha: float = checked(0.5, gt=0, le=1)
    """Share of the previous round's tasks kept, by reward variance."""
    gamma: int = checked(2, ge=2)
    """Factor by which a kept task's rollout count grows."""
    group: int | None = checked(None, ge=1)
    """Uniform leaves per task whose total VIGOR redistributes (None: ``rollout.max_leaves``)."""


@dataclass
class AllocatorConfig:
    """Which allocator splits each batch's budget between its tasks."""

    name: str = "uniform"
    """``uniform`` (every task ``rollout.max_leaves`` / ``max_generated_tokens``), ``vigor``
    (:data:`ALLOCATORS`)."""
    vigor: VigorConfig = field(default_factory=VigorConfig)


@dataclass
class UniformAllocator:
    """Every tree gets the same budget once and never more (today's behaviour)."""

    leaves: int | None = None
    tokens: int | None = None

    def start(self, trees: Sequence[RolloutTree]) -> list[Budget]:
        """The same budget for every tree."""
        return [Budget(leaves=self.leaves, tokens=self.tokens) for _ in trees]

    def grant(self, trees: Sequence[RolloutTree], idle: Sequence[int]) -> dict[int, Budget]:
        """Nothing more."""
        return {}


class Vigor:
    """VIGOR for one batch (make a new one per batch: it keeps the rounds' state)."""

    def __init__(self, config: VigorConfig, group: int, tokens: int | None = None) -> None:
        if config.m0 > group:
            raise ValueError(f"allocator.vigor.m0 = {config.m0} is more than the uniform "
                             f"{group} leaves per task that VIGOR redistributes")
        self.config, self.group, self.tokens = config, group, tokens
        self.counts: list[int] = []
        self.kept: list[int] = []
        self.round = 0
        self.pool = 0

    def _budget(self, leaves_: int) -> Budget:
        tokens = None if self.tokens is None else self.tokens * leaves_ // self.group
        return Budget(leaves=leaves_, tokens=tokens)

    def start(self, trees: Sequence[RolloutTree]) -> list[Budget]:
        """``m0`` rollouts per task."""
        self.counts = [self.config.m0] * len(trees)
        self.kept = list(range(len(trees)))
        self.pool = self.group * len(trees) - sum(self.counts)
        self.round = 1
        return [self._budget(self.config.m0) for _ in trees]

    def grant(self, trees: Sequence[RolloutTree], idle: Sequence[int]) -> dict[int, Budget]:
        """The next round's doublings, then the remainder, then nothing."""
        if self.pool <= 0 or self.round > self.config.rounds:
            return {}
        variance = [float(np.var(leaf_rewards(t))) if leaves(t) else 0.0 for t in trees]
        grants: dict[int, int] = {}
        if self.round < self.config.rounds:
            ranked = sorted((t for t in self.kept if variance[t] > 0),
                            key=lambda t: (-variance[t], t))
            self.kept = ranked[:math.ceil(self.config.alpha * len(self.kept))]
            for t in self.kept:
                extra = min(self.counts[t] * (self.config.gamma - 1), self.pool)
                if extra > 0:
                    grants[t] = extra
                    self.pool -= extra
        if self.round >= self.config.rounds or not grants:
            # The remainder, one leaf at a time in order of variance.
            order = sorted(range(len(trees)), key=lambda t: (-variance[t], t))
            for i in range(self.pool):
                t = order[i % len(order)]
                grants[t] = grants.get(t, 0) + 1
            self.pool = 0
            self.round = self.config.rounds
        self.round += 1
        for t, extra in grants.items():
            self.counts[t] += extra
        return {t: self._budget(extra) for t, extra in sorted(grants.items())}


def build_vigor(config: AllocatorConfig, rollout: RolloutConfig) -> Allocator:
    """VIGOR for one batch, redistributing ``rollout``'s per-task budget (a
    :class:`treeroll.engine.RolloutConfig`); it needs a leaf budget and says so."""
    group = config.vigor.group or rollout.max_leaves
    if group is None:
        raise ValueError("VIGOR redistributes a per-task leaf budget: set "
                         "--rollout.max-leaves (or --allocator.vigor.group) to the uniform "
                         "leaves per task")
    return Vigor(config.vigor, group, rollout.max_generated_tokens)


AllocatorBuilder = Callable[["AllocatorConfig", RolloutConfig], Allocator | None]
ALLOCATORS: Registry[AllocatorBuilder] = Registry("allocator")
"""Allocator name -> ``builder(allocator_config, rollout_config)`` of a fresh allocator for one
batch (``None``: ``rollout()``'s uniform default)."""
ALLOCATORS.register("uniform", lambda config, rollout: None)
ALLOCATORS.register("vigor", build_vigor)


def make_allocator(allocator_config: AllocatorConfig, rollout_config: RolloutConfig
                   ) -> Allocator | None:
    """A fresh allocator for one batch, named by ``allocator_config.name`` (errors name the
    setting); ``None`` for the uniform default."""
    made: Allocator | None = ALLOCATORS.get(allocator_config.name)(allocator_config,
                                                                     rollout_config)
    return made
