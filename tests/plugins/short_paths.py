"""A process scorer in one file (ARCHITECTURE.md, *Where each kind of plug-in goes*): it
prefers short paths, each turn costing ``scorer.short_paths.per_turn``. One entry-point line
registers it: ``[treeroll.scorers] short_paths = short_paths:SPEC``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from treeroll.base import ProcessScorer, Score
from treeroll.checks import checked
from treeroll.scorers import ScorerSpec
from treeroll.tree import Node, RolloutTree, path_to


@dataclass
class ShortPathsSettings:
    """``scorer.short_paths``: what each turn costs."""

    per_turn: float = checked(0.1, gt=0, le=1)


@dataclass
class ShortPaths:
    """``1 - per_turn * turns``, floored at 0."""

    per_turn: float

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        return [Score(max(0.0, 1.0 - self.per_turn * (len(path_to(node)) - 1)),
                      f"{len(path_to(node)) - 1} turns") for node in nodes]


def build(config: Any, **context: Any) -> ProcessScorer:
    """The scorer with ``scorer.short_paths``'s settings."""
    return ShortPaths(config.short_paths.per_turn)


SPEC = ScorerSpec(build, settings=ShortPathsSettings)
