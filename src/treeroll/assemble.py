"""The one door: a run config becomes the parts a run is made of.

:func:`assemble` turns a config (``treeroll.config.TrainConfig`` or any config with its
sections) into the environment factory, strategy, advantage estimator and process scorer, and
gives the backend and a fresh allocator on demand; the trainer, ``treeroll rollout`` and the
trainer adapters build their parts with it, and every other command (SFT, evaluation, the Ray
command) builds what it needs with the same functions below, each a lookup in one registry.
Each kind of plug-in is looked up in its own package's registry (:data:`treeroll.envs.ENVS`,
:data:`treeroll.strategies.STRATEGIES`, :data:`treeroll.credit.ADVANTAGES`,
:data:`treeroll.scorers.SCORERS`, :data:`treeroll.backends.BACKENDS`,
:data:`treeroll.engine.ALLOCATORS`); ``package.module:object`` names a user's own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from treeroll.backends import (
    make_backend,
)
from treeroll.base import (
    AdvantageEstimator,
    Allocator,
    Env,
    GenerationBackend,
    ProcessScorer,
    ScoringStrategy,
    Strategy,
    plugin_name,
)
from treeroll.causal_lm import PolicyParts
from treeroll.config import TrainConfig
from treeroll.credit import make_estimator
from treeroll.engine import make_allocator
from treeroll.envs import env_spec, make_env_factory
from treeroll.scorers import SCORERS, make_scorer
from treeroll.strategies import make_strategy

__all__ = ["RunParts", "assemble", "scorer_name_for"]


def scorer_name_for(scorer_name: str | None, strategy: Strategy, env_name: str) -> str | None:
    """The process scorer a run builds: ``scorer_name`` when set; else, for a strategy that
    steers by scores (a :class:`~treeroll.base.ScoringStrategy` whose ``use_scores`` is on:
    PATR), the environment's own (its :class:`~treeroll.envs.EnvSpec`'s), with a warning saying
    so; else ``None``.

    A scoring strategy on an environment without a scorer of its own is an error naming
    ``--scorer.name`` (PATR would otherwise silently become the random tree)."""
    if scorer_name or not (isinstance(strategy, ScoringStrategy) and strategy.use_scores):
        return scorer_name or None
    name = repr(plugin_name(strategy))
    spec = env_spec(env_name)
    default = spec.scorer if spec is not None else None
    if default is None:
        raise ValueError(f"strategy {name} steers by process scores, but no scorer "
                         f"is set and environment {env_name!r} has none of its own; pass "
                         f"--scorer.name (valid: {', '.join(SCORERS.names())}, or "
                         "package.module:object), or --strategy.name random_tree to branch "
                         "without scores")
    warnings.warn(f"strategy {name} has no --scorer.name: using the {env_name} "
                  f"environment's scorer {default!r}", stacklevel=2)
    return default


@dataclass
class RunParts:
    """A run's plug-ins, built from its config by :func:`assemble`."""

    config: TrainConfig
    """The config they were built from."""
    make_env: Callable[[], Env]
    """A zero-argument environment constructor."""
    strategy: Strategy
    estimator: AdvantageEstimator
    scorer: ProcessScorer | None
    """The process scorer (None when the strategy does not score and none is named)."""

    def backend(self, policy: PolicyParts | None) -> GenerationBackend:
        """The configured backend (``backend.name`` and its ``backend.<name>`` block) for
        ``policy`` (anything with ``model`` and ``tokenizer``)."""
        return make_backend(self.config.backend, policy)

    def allocator(self) -> Allocator | None:
        """A fresh allocator for one batch (None: the uniform default)."""
        return make_allocator(self.config.allocator, self.config.rollout)


def assemble(config: TrainConfig, *, make_env: Callable[[], Env] | None = None,
             strategy: Strategy | None = None, scorer: ProcessScorer | None = None,
             **scorer_context: Any) -> RunParts:
    """Build every plug-in ``config`` names, checking each before any work (a bad allocator
    fails here too). ``make_env``, ``strategy`` and ``scorer`` replace what the config would
    build (an adapter's own environment, :class:`~treeroll.strategies.EarlyForks`);
    ``scorer_context`` reaches the scorer's builder (``backend=``, ``turn_format=``,
    ``seed=``)."""
    made_env = make_env or make_env_factory(config.env)
    made_strategy = strategy if strategy is not None else make_strategy(config.strategy)
    estimator = make_estimator(config.advantage)
    make_allocator(config.allocator, config.rollout)
    if scorer is None:
        name = scorer_name_for(config.scorer.name, made_strategy, config.env.name)
        if name:
            scorer = make_scorer(replace(config.scorer, name=name), **scorer_context)
    return RunParts(config, made_env, made_strategy, estimator, scorer)
