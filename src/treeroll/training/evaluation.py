"""Held-out evaluation, the task pools it draws from, and progress reporting.

Training seeds and held-out seeds are disjoint by construction (:func:`task_pools`); SFT's
expert data and RL both draw only from the training pool.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from treeroll.base import Env, GenerationBackend
from treeroll.config import HELD_OUT_RESERVED, EvalConfig
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import EnvConfig
from treeroll.formatting import TurnFormat
from treeroll.strategies import Chain
from treeroll.tree import RolloutTree, leaves, path_to

__all__ = ["EvalResult", "QuietReporter", "Reporter", "evaluate", "task_pools", "wilson_interval"]


class Reporter(Protocol):
    """Receives progress (the CLI shows it with :mod:`treeroll.cli.reporting`: rich progress bars
    on a terminal, plain lines otherwise)."""

    def phase(self, text: str, total: int | None = None) -> None:
        """A new phase starts (warm start, evaluation, training)."""
        ...

    def advance(self, done: int, info: dict[str, Any]) -> None:
        """``done`` units of the current phase are finished; ``info`` has live figures."""
        ...


class QuietReporter:
    """A :class:`Reporter` that shows nothing."""

    def phase(self, text: str, total: int | None = None) -> None:
        """Ignored."""

    def advance(self, done: int, info: dict[str, Any]) -> None:
        """Ignored."""


@dataclass
class EvalResult:
    """Held-out success rate with its 95% Wilson interval, and the share of well-formed
    replies."""

    success_rate: float
    low: float
    high: float
    tasks: int
    temperature: float
    format_ok: float = 1.0
    """Share of the evaluation's turns whose reply the environment could parse."""
    successes: list[bool] = field(default_factory=list)
    """Per task, in the order of the seeds evaluated (not in :meth:`as_dict`)."""
    pool: str = "held_out"
    """The task pool evaluated (``EvalConfig.pool``)."""
    trees: list[RolloutTree] = field(default_factory=list)
    """The evaluated episodes, one tree per task (not in :meth:`as_dict`)."""

    def first(self, tasks: int) -> EvalResult:
        """The same evaluation restricted to its first ``tasks`` tasks (the evaluations made
        during training are on a pool's first ``eval.tasks_during`` tasks: the start and the
        end, made on more, are read on those too, so that the curve compares like with
        like). Greedy, a task's episode does not depend on the others evaluated beside it
        (up to batched arithmetic); sampled, the draws do, so this is the same evaluation
        read on fewer tasks, not the draws of a separate one on them."""
        if not 1 <= tasks <= self.tasks:
            raise ValueError(f"first({tasks}): an evaluation of {self.tasks} tasks has "
                             f"1 to {self.tasks} first tasks")
        if tasks == self.tasks:
            return self
        return _result(self.successes[:tasks], self.trees[:tasks], self.temperature, self.pool)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return {"success_rate": self.success_rate, "ci95_low": self.low, "ci95_high": self.high,
                "tasks": self.tasks, "temperature": self.temperature,
                "format_ok": self.format_ok, "pool": self.pool}


def pool_words(evaluation: EvalConfig) -> str:
    """How messages name the evaluation's pool: ``held-out`` or ``validation``."""
    return evaluation.pool.replace("_", "-")


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _draw(rng: np.random.Generator, count: int, taken: set[int]) -> list[int]:
    """``count`` task seeds from ``rng``, skipping (and then adding to) ``taken``."""
    drawn: list[int] = []
    while len(drawn) < count:
        seed = int(rng.integers(1_000_000))
        if seed not in taken:
            taken.add(seed)
            drawn.append(seed)
    return drawn


def task_pools(env: EnvConfig, evaluation: EvalConfig) -> tuple[np.ndarray, np.ndarray]:
    """Training task seeds and the evaluation seeds of ``evaluation.pool``, disjoint.

    ``held_out``: drawn from ``evaluation.seed``, skipping every training seed (a prefix of
    the first ``HELD_OUT_RESERVED``). ``validation``: drawn from ``evaluation.validation_seed``,
    skipping the training seeds and those ``HELD_OUT_RESERVED`` held-out seeds."""
    train = np.random.default_rng(env.task_seed).choice(1_000_000, size=env.train_tasks,
                                                        replace=False)
    taken = set(train.tolist())
    needed = max(evaluation.tasks, evaluation.tasks_during)
    if evaluation.pool == "held_out":
        return train, np.array(_draw(np.random.default_rng(evaluation.seed), needed, taken))
    _draw(np.random.default_rng(evaluation.seed), HELD_OUT_RESERVED, taken)
    validation = _draw(np.random.default_rng(evaluation.validation_seed), needed, taken)
    return train, np.array(validation)


def evaluate(backend: GenerationBackend, turn_format: TurnFormat, make_env: Callable[[], Env],
             seeds: Sequence[int] | np.ndarray, config: EvalConfig,
             rollout_config: RolloutConfig, seed: int = 0,
             reporter: Reporter | None = None) -> EvalResult:
    """Success rate of one trajectory per held-out task (greedy when
    ``config.temperature`` is 0), and the share of well-formed replies.

    With a ``reporter`` (whose phase the caller starts, with ``len(seeds)`` as its total) it
    advances by finished tasks after every turn, and to ``len(seeds)`` with the ``success``
    rate at the end."""
    settings = replace(rollout_config, temperature=config.temperature, max_leaves=None,
                       max_generated_tokens=None)

    def on_turn(turn: int, live: int) -> None:
        if reporter is not None and live:  # one live trajectory per unfinished task
            reporter.advance(len(seeds) - live, {})

    backend.reset_cache()
    batch = rollout(seeds, make_env, backend, turn_format, Chain(group_size=1),
                    config=settings, seed=seed, on_turn=on_turn)
    backend.reset_cache()
    per_task = [leaves(tree) for tree in batch.trees]  # one each; none if the task failed
    successes = [bool(group[0].info.get("success")) if group else False for group in per_task]
    result = _result(successes, batch.trees, config.temperature, config.pool)
    if reporter is not None:
        reporter.advance(len(seeds), {"success": result.success_rate})
    return result


def _result(successes: list[bool], trees: list[RolloutTree], temperature: float,
            pool: str) -> EvalResult:
    """An evaluation's figures from its per-task outcomes and episodes (one tree a task):
    the success rate with its Wilson interval, and the share of well-formed turns."""
    turns = [node for tree in trees for leaf in leaves(tree) for node in path_to(leaf)[1:]]
    well_formed = sum(not node.info.get("format_error", False) for node in turns)
    wins, tasks = sum(successes), len(successes)
    low, high = wilson_interval(wins, tasks)
    return EvalResult(wins / max(tasks, 1), low, high, tasks, temperature,
                      well_formed / max(len(turns), 1), successes, pool, trees)
