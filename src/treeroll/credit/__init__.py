"""Credit: how each leaf's reward becomes the weight of every model token in the update.

Advantage estimators over a task's group of leaves (:mod:`treeroll.credit.estimators`), their
registry, and :func:`make_estimator`, which binds an ``AdvantageConfig``'s hyper-parameters.
Adding one: a function ``(tree, **options) -> advantages`` (or a
:class:`~treeroll.base.BatchAdvantageEstimator` class) and one ``register_estimator`` line
(with ``settings=`` its own block's dataclass, ``advantage.<name>.*``, if it has one).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from treeroll.base import AdvantageEstimator
from treeroll.checks import checked
from treeroll.credit import estimators
from treeroll.credit.estimators import BatchBaseline, token_credit, weighted
from treeroll.registry import Registry, build_user_plugin, plugin_section

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_BLOCKS",
    "AdvantageConfig",
    "BatchBaseline",
    "GiGPOSettings",
    "PlanPOSettings",
    "make_estimator",
    "register_estimator",
    "token_credit",
    "weighted",
]

@dataclass
class GiGPOSettings:
    """``advantage.gigpo``: GiGPO's step-level term."""

    omega: float = checked(1.0, ge=0)
    """Weight of the step-level advantage."""
    gamma: float = checked(0.95, ge=0, le=1)
    """Discount of the step returns."""
    anchor: str = checked("observation", choices=estimators.ANCHORS)
    """How states are compared: ``observation`` (the exact observation text, turn counters
    included) or ``env_state`` (the environment's ``info["anchor_state"]`` where it reports
    one: FrozenLake's cell, a gymnasium environment's discrete state)."""


@dataclass
class PlanPOSettings:
    """``advantage.planpo``: PlanPO's bonus for short successes."""

    beta: float = checked(0.2, ge=0)
    """At most this much more reward for the group's shortest success."""


ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")
"""Estimator name -> the function (or batch-level class)."""
ADVANTAGE_BLOCKS: dict[str, type] = {}
"""The estimators with settings of their own: ``advantage.<name>.*`` (filled by
:func:`register_estimator`)."""
_SECTION_BUILT = False
"""Whether :class:`AdvantageConfig` is built: no block can be added after."""


def register_estimator(name: str, estimator: AdvantageEstimator, *,
                       settings: type | None = None) -> AdvantageEstimator:
    """Register ``estimator`` as ``name``, with ``settings`` (a dataclass) its own block
    ``advantage.<name>``, whose fields it receives as keywords. An estimator's record is the
    function itself: a function takes its options as keywords, so nothing wraps it.

    A block is part of :class:`AdvantageConfig`, which is built when this module is first
    imported: an estimator registered later (a user's, from their own code) may have no
    block (it is refused, before anything is registered); it takes its options through
    ``advantage.options`` as ``package.module:function`` instead."""
    if settings is not None and _SECTION_BUILT:
        raise ValueError(f"estimator {name!r}: its settings block cannot be added once "
                         "AdvantageConfig is built (at import); register it without settings "
                         "and pass its options with --advantage.options, naming it "
                         "package.module:function")
    ADVANTAGES.register(name, estimator)
    if settings is not None:
        ADVANTAGE_BLOCKS[name] = settings
    return estimator


register_estimator("grpo", estimators.grpo)
register_estimator("dr_grpo", estimators.dr_grpo)
register_estimator("rloo", estimators.rloo)
register_estimator("tree", estimators.tree_advantage)
register_estimator("treerl", estimators.treerl)
register_estimator("gigpo", estimators.gigpo, settings=GiGPOSettings)
register_estimator("treepo", estimators.treepo)
register_estimator("progress", estimators.progress_conditioned)
register_estimator("planpo", estimators.planpo, settings=PlanPOSettings)
register_estimator("arpo_hard", estimators.arpo_hard)
register_estimator("sao", estimators.BatchBaseline)  # type: ignore[arg-type]  # a class


@dataclass
class AdvantageSection:
    """Credit assignment over each task's group of leaves. :func:`make_estimator` passes each
    shared option (``std``, ``singleton``, ``eps``) to the estimator if it takes it, and the
    estimator's own block (``advantage.gigpo.*``) to it; an option the estimator does not take
    must keep its default (else an error names it)."""

    name: str = "grpo"
    """``grpo``, ``dr_grpo``, ``rloo``, ``tree``, ``treepo``, ``progress``, ``planpo`` (one
    value per leaf), ``treerl``, ``gigpo`` or ``arpo_hard`` (per turn), ``sao`` (over the
    whole batch: for one rollout per task) or ``package.module:function``."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own estimator (``package.module:object``): its config block, ``KEY VALUE``
    pairs on the command line or a mapping in YAML, each value read as YAML; a dataclass gets
    them as its fields, a builder as keywords."""
    std: str = checked("population", choices=("population", "sample"))
    """``grpo``, ``tree``, ``sao`` and those built on them (``gigpo``, ``treepo``, ``progress``,
    ``planpo``, ``arpo_hard``): divide by the ``population`` std (ddof=0, the default) or the
    ``sample`` std (ddof=1, unbiased: verl's and TRL's, hence Tree-GRPO's code's)."""
    singleton: str = checked("zero", choices=("zero", "verl"))
    """``grpo``, ``dr_grpo``, ``tree``, ``arpo_hard``: a group of one gets advantage ``zero``
    (default: a tree that never branches is exactly chain GRPO) or, ``verl``, its raw reward
    (verl's mean 0 / std 1)."""
    eps: float = checked(1e-6, ge=0)
    """``grpo``, ``tree``, ``gigpo``, ``arpo_hard``, ``sao``: added to the std before dividing."""


if TYPE_CHECKING:  # what plugin_section makes, as the type checker sees the built-ins
    @dataclass
    class AdvantageConfig(AdvantageSection):
        gigpo: GiGPOSettings = field(default_factory=GiGPOSettings)
        planpo: PlanPOSettings = field(default_factory=PlanPOSettings)
else:
    AdvantageConfig = plugin_section(AdvantageSection, ADVANTAGE_BLOCKS, "AdvantageConfig")
_SECTION_BUILT = True


def make_estimator(advantage_config: AdvantageConfig) -> AdvantageEstimator:
    """The estimator named by ``advantage_config.name`` with its hyper-parameters bound.

    Each shared option (``std``, ``singleton``, ``eps``) is passed as a keyword to an
    estimator that takes it, and the fields of the estimator's own block (``advantage.gigpo``
    for ``gigpo``) to it (``functools.partial`` of a function; a class, a
    :class:`~treeroll.base.BatchAdvantageEstimator`, is built with them). An estimator that
    does not take an option never receives it, and a non-default value for it (or for another
    estimator's block) is an error naming the option and the estimator, rather than a setting
    silently ignored (``rloo`` takes none).
    """
    name = advantage_config.name
    estimator = ADVANTAGES.get(name)
    try:  # a class (a batch-level estimator) takes its options when built; a function after
        parameters = list(inspect.signature(estimator).parameters.values())  # the tree
        parameters = parameters if inspect.isclass(estimator) else parameters[1:]
    except (TypeError, ValueError):  # a callable whose signature cannot be read
        parameters = []
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    accepted = [p.name for p in parameters if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                         inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if ":" in name and getattr(advantage_config, "options", None):
        if inspect.isclass(estimator):  # a batch-level estimator: built with its options
            made: AdvantageEstimator = build_user_plugin(estimator, advantage_config.options,
                                                         "advantage")
            return made
        return build_user_plugin(functools.partial, advantage_config.options, "advantage",
                                 estimator)
    options: dict[str, Any] = {}
    for block in ADVANTAGE_BLOCKS:  # the estimator's own block, and no other one set
        settings = getattr(advantage_config, block)
        for option in dataclasses.fields(settings):
            value = getattr(settings, option.name)
            if block == name:
                options[option.name] = value
            elif value != option.default:
                raise ValueError(f"advantage.{block}.{option.name}={value!r} is for the "
                                 f"{block!r} estimator, not {name!r}; leave it at its default "
                                 f"{option.default!r} or choose --advantage.name {block}")
    for option in dataclasses.fields(AdvantageSection):  # the shared options
        if option.name in ("name", "options"):
            continue
        value = getattr(advantage_config, option.name)
        if takes_any or option.name in accepted:
            options[option.name] = value
        elif value != option.default:
            takes = ", ".join(accepted) or "no options"
            raise ValueError(f"advantage.{option.name}={value!r} does not apply to the "
                             f"{name!r} estimator (it takes: {takes}); leave it at its "
                             f"default {option.default!r} or choose an estimator that takes it")
    if inspect.isclass(estimator):
        built: AdvantageEstimator = estimator(**options)  # type: ignore[assignment]
        return built
    return functools.partial(estimator, **options)

