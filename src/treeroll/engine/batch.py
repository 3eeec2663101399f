"""The one rollout entry point every strategy runs on.

For a batch of tasks :func:`rollout` grows one :class:`~treeroll.tree.RolloutTree` per task on
the engine in :mod:`treeroll.engine.loop`: each tree's strategy returns a *frontier* (the nodes to
extend, a node listed ``k`` times branching into ``k`` children), the engine clips it to the
tree's budget, sends its entries to the backend as exact token prefixes as soon as they are
ready, steps a (forked) environment per entry, and records the children. Strategies only
decide *where*; the engine does the rest, so chains, Tree-GRPO, PATR and the others are thin.
The budget rule and the synchronous mode are described in :mod:`treeroll.engine.loop`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treeroll.base import (
    Allocator,
    Env,
    GenerationBackend,
    ProcessScorer,
    Score,
    Strategy,
    StreamingBackend,
)
from treeroll.checks import validate
from treeroll.engine.loop import run_engine
from treeroll.engine.settings import RolloutConfig
from treeroll.formatting import TurnFormat
from treeroll.tree import Node, RolloutTree

__all__ = ["RolloutBatch", "TimedScorer", "continuous_problems", "rollout"]


class TimedScorer:
    """Wraps a process scorer and counts its calls and wall time (scorer cost is reported)."""

    def __init__(self, scorer: ProcessScorer) -> None:
        self.scorer = scorer
        self.seconds = 0.0
        self.calls = 0
        self.nodes = 0

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        start = time.perf_counter()
        try:
            return self.scorer(tree, nodes)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.nodes += len(nodes)


@dataclass
class RolloutBatch:
    """The trees of one batch of tasks and where the time went."""

    trees: list[RolloutTree]
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds: ``generate``, ``env``, ``score``, ``total``."""


def rollout(
    tasks: Sequence[int] | np.ndarray,
    make_env: Callable[[], Env],
    backend: GenerationBackend,
    turn_format: TurnFormat,
    strategy: Strategy,
    *,
    config: RolloutConfig = RolloutConfig(),
    scorer: ProcessScorer | None = None,
    seed: int = 0,
    first_group_id: int = 0,
    on_turn: Callable[[int, int], None] | None = None,
    allocator: Allocator | None = None,
) -> RolloutBatch:
    """Grow one tree per task seed in ``tasks`` (see :mod:`treeroll.engine.loop`).

    ``allocator`` decides each tree's budget (default: ``config.max_leaves`` and
    ``config.max_generated_tokens`` for every tree, once); ``on_turn(calls, ready)`` is
    called after each backend call's steps are absorbed."""
    found = continuous_problems(config, type(backend).__name__,
                                isinstance(backend, StreamingBackend), "rollout.")
    validate(config, "rollout", found)
    start = time.perf_counter()
    timing = {"generate": 0.0, "env": 0.0, "score": 0.0}
    timed = TimedScorer(scorer) if scorer is not None else None
    trees, _, turns = run_engine(tasks, make_env, backend, turn_format, strategy,
                                 config=config, scorer=timed, seed=seed,
                                 first_group_id=first_group_id, on_turn=on_turn,
                                 allocator=allocator, timing=timing)
    for tree in trees:
        tree.meta["config"] = {"max_leaves": config.max_leaves,
                               "max_generated_tokens": config.max_generated_tokens,
                               "max_turn_tokens": config.max_turn_tokens,
                               "temperature": config.temperature}
        tree.meta["turns"] = turns
    if timed is not None:
        timing["score"] = timed.seconds
        timing["generate_and_env"] = timing["generate"] + timing["env"]  # scoring is in neither
        for tree in trees:
            tree.meta["scorer_seconds_batch"] = timed.seconds
            tree.meta["scorer_calls_batch"] = timed.calls
            tree.meta["scored_nodes_batch"] = timed.nodes
    timing["total"] = time.perf_counter() - start
    return RolloutBatch(trees=trees, timing=timing)


def continuous_problems(config: RolloutConfig, backend: str, streams: bool | None,
                        prefix: str) -> list[tuple[str, str]]:
    """Why ``config.continuous`` cannot run, as ``(setting, message)`` pairs (none when it
    can): continuous batching has no rounds (``synchronous`` must be False) and needs a
    backend that streams (``streams``: whether ``backend`` does; None: not known before it is
    built, as for a user's plug-in). ``prefix`` names the section as the caller's user writes
    it (``"rollout."`` in Python, ``"--rollout."`` on the command line)."""
    if not config.continuous:
        return []
    found = []
    if config.synchronous:
        found.append((f"{prefix}continuous", f"is on, which needs {prefix}synchronous false "
                      "(continuous batching has no rounds)"))
    if streams is False:
        found.append((f"{prefix}continuous", f"is on, which needs a backend with submit/"
                      f"advance/busy (treeroll.base.StreamingBackend, such as 'hf'); "
                      f"{backend!r} has none"))
    return found


def count_status(trees: Sequence[RolloutTree]) -> dict[str, Any]:
    """How many nodes ended in each status, over ``trees`` (for logs)."""
    counts: Counter[str] = Counter()
    for tree in trees:
        counts.update(n.status for n in tree.nodes)
    return dict(counts)
