"""Process scorers: PATR's feedback on partial trajectories (ALGORITHMS.md section 3).

Every scorer implements :class:`treeroll.base.ProcessScorer`: called with a tree and the nodes
to score (batched), it returns one :class:`~treeroll.base.Score` per node, a value in ``[0, 1]``
(higher = more promising) and a short reason. A node's state is ``node.env`` (the environment
after the node's step; PATR scores active nodes while it is still there) and its path,
``path_to(node)`` (action texts, ``info``, observation texts).

The built-ins, a module each (helpers they share in :mod:`treeroll.scorers.common`):

* :mod:`~treeroll.scorers.progress` -- :class:`FrozenLakeProgress` (``frozenlake_progress``).
* :mod:`~treeroll.scorers.degeneracy` -- :class:`Degeneracy` (``degeneracy``).
* :mod:`~treeroll.scorers.value` -- :class:`ValueScorer` (``value``), learned online.
* :mod:`~treeroll.scorers.judge` -- :class:`JudgeScorer` (``judge``), an LLM judge.
* :mod:`~treeroll.scorers.blend` -- :class:`Blend` (``blend``, :func:`blend`).

The SWE environment's own scorer is :mod:`treeroll.envs.swe.scorer`. Scoring cost: the rollout
engine wraps the scorer in :class:`treeroll.engine.rollout.TimedScorer` (wall time, calls,
nodes); the judge also counts the tokens it made its backend compute.

:data:`SCORERS` maps a name to a builder taking the :class:`ScorerConfig` and the run objects a
scorer may need (``backend=``, ``turn_format=``, ``seed=``); :func:`make_scorer` builds one.
Adding one: a class implementing the protocol, a builder, and one ``SCORERS.register`` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from treeroll.base import GenerationBackend, ProcessScorer
from treeroll.checks import checked
from treeroll.formatting import TurnFormat
from treeroll.registry import Registry, build_user_plugin
from treeroll.scorers.blend import Blend, blend
from treeroll.scorers.degeneracy import Degeneracy
from treeroll.scorers.judge import JUDGE_PROMPT, JudgeScorer, parse_rating
from treeroll.scorers.progress import FrozenLakeProgress
from treeroll.scorers.value import ValueScorer, trajectory_features

__all__ = ["JUDGE_PROMPT", "SCORERS", "Blend", "Degeneracy", "FrozenLakeProgress",
           "JudgeScorer", "ScorerConfig", "ValueScorer", "blend", "make_scorer", "parse_rating",
           "trajectory_features"]


@dataclass
class ScorerConfig:
    """The process scorer PATR uses (ignored by strategies that do not score)."""

    name: str | None = None
    """e.g. ``frozenlake_progress``, ``degeneracy``, ``blend``; None = no scorer."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own scorer (``package.module:object``): its config block, ``KEY VALUE``
    pairs on the command line or a mapping in YAML, each value read as YAML; a dataclass gets
    them as its fields, a builder as keywords."""
    blend_a: str = "frozenlake_progress"
    """``blend``: first scorer."""
    blend_b: str = "degeneracy"
    """``blend``: second scorer."""
    blend_lambda: float = checked(0.7, ge=0, le=1)
    """``blend``: weight of the first scorer."""
    judge_model_path: str | None = None
    """``judge``: a local model directory (``save_pretrained``) for the judge; None = the
    judge needs a backend passed to ``make_scorer`` by the caller."""


# --------------------------------------------------------------------------------------------
# Builders (registered below) and make_scorer
# --------------------------------------------------------------------------------------------


def build_frozenlake_progress(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``frozenlake_progress`` with its defaults."""
    return FrozenLakeProgress()


def build_degeneracy(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``degeneracy`` with its defaults."""
    return Degeneracy()


def build_value(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``value``: an untrained value scorer (the trainer feeds it with ``observe``)."""
    return ValueScorer(seed=int(context.get("seed", 0)))


def build_judge(config: ScorerConfig, *, backend: GenerationBackend | None = None,
                turn_format: TurnFormat | None = None, **context: Any) -> ProcessScorer:
    """``judge`` on ``backend`` / ``turn_format`` if given, else on the local model at
    ``config.judge_model_path``."""
    if backend is None or turn_format is None:
        path = config.judge_model_path
        if not path:
            raise ValueError("the judge scorer needs a model: set scorer.judge_model_path to a "
                             "local model directory (or pass backend= and turn_format=)")
        from types import SimpleNamespace

        from treeroll.backends import BackendConfig, make_backend
        from treeroll.policies.model import load_policy_files

        model, tokenizer = load_policy_files(path)
        backend = make_backend(BackendConfig(), SimpleNamespace(model=model.eval(),
                                                                tokenizer=tokenizer))
        turn_format = TurnFormat(tokenizer)
    return JudgeScorer(backend, turn_format)


def build_blend(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``blend`` of ``config.blend_a`` and ``config.blend_b`` with weight ``blend_lambda``."""
    if "blend" in (config.blend_a, config.blend_b):
        raise ValueError("scorer.blend_a and scorer.blend_b must name scorers other than blend")
    from dataclasses import replace

    first = make_scorer(replace(config, name=config.blend_a), **context)
    second = make_scorer(replace(config, name=config.blend_b), **context)
    return blend(first, second, config.blend_lambda)


def make_scorer(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """The scorer named by ``config.name``: a registered name (``treeroll.assemble.SCORERS``)
    or ``package.module:object`` (a scorer instance, or a class or builder given the
    ``scorer.options`` block).

    ``context`` (keyword-only) passes run objects some scorers need, e.g. ``backend=`` and
    ``turn_format=`` for ``judge``.
    """
    if not config.name:
        raise ValueError("scorer.name is not set; valid: " + ", ".join(SCORERS.names()))
    if config.name in SCORERS:
        return SCORERS.get(config.name)(config, **context)
    obj: Any = SCORERS.get(config.name)  # an import path, or raises listing the valid names
    made: ProcessScorer = build_user_plugin(obj, config.options, "scorer")
    return made


SCORERS: Registry[Callable[..., ProcessScorer]] = Registry("process scorer")
"""Scorer name -> builder ``(ScorerConfig, **context) -> ProcessScorer``."""
SCORERS.register("frozenlake_progress", build_frozenlake_progress)
SCORERS.register("degeneracy", build_degeneracy)
SCORERS.register("value", build_value)
SCORERS.register("judge", build_judge)
SCORERS.register("blend", build_blend)


def _swe_scorer(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``swe``: the SWE environment's scorer (tests run, edits compile)."""
    from treeroll.envs.swe import SWEProcessScorer

    return SWEProcessScorer()


SCORERS.register("swe", _swe_scorer)
