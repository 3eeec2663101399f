"""``random_tree``: PATR's random counterpart, the same schedule with uniform random scores and
no score-based pruning (the "random tree" baseline of the PATR paper)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from treeroll.strategies.patr import PATR

__all__ = ["RandomTree"]


@dataclass
class RandomTree(PATR):
    """PATR's schedule with random scores and no score pruning (the paper's random tree)."""

    use_scores: bool = False
    """Always False for the random tree (true would be PATR itself: refused)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.use_scores:
            raise ValueError("random_tree.use_scores is always false (with scores it is "
                             "PATR): use --strategy.name patr")

    name: ClassVar[str] = "random_tree"
