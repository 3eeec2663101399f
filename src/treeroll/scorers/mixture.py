"""The blend of two scorers (``blend``).

:class:`Blend` (and :func:`blend`) -- ``lam * a + (1 - lam) * b``; :meth:`Blend.observe` is
forwarded to the parts that learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeroll.base import LearningScorer, ProcessScorer, Score
from treeroll.scorers.common import clamp
from treeroll.tree import Node, RolloutTree

__all__ = ["Blend", "blend"]


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
        return [Score(clamp(self.lam * x.value + (1 - self.lam) * y.value),
                      f"{self.lam:g}*[{x.reason}] + {1 - self.lam:g}*[{y.reason}]")
                for x, y in zip(first, second, strict=True)]

    def observe(self, trees: Sequence[RolloutTree]) -> None:
        """Let each part that learns online (a :class:`~treeroll.base.LearningScorer`) see the
        finished trees."""
        for part in (self.a, self.b):
            if isinstance(part, LearningScorer):
                part.observe(trees)


def blend(a: ProcessScorer, b: ProcessScorer, lam: float) -> Blend:
    """``lam * a + (1 - lam) * b``, checked to lie in ``[0, 1]``."""
    return Blend(a, b, lam)
