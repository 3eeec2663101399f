"""Process scorers: PATR's feedback on partial trajectories (docs/methods.md).

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
* :mod:`~treeroll.scorers.mixture` -- :class:`Blend` (``blend``, :func:`blend`).

The SWE environment's own scorer is :mod:`treeroll.envs.swe.scorer`. Scoring cost: the rollout
engine wraps the scorer in :class:`treeroll.engine.batch.TimedScorer` (wall time, calls,
nodes); the judge also counts the tokens it made its backend compute.

:data:`SCORERS` maps a name to a :class:`ScorerSpec`: a builder taking the
:class:`ScorerConfig` and the run objects a scorer may need (``backend=``, ``turn_format=``,
``seed=``), and its settings dataclass; :func:`make_scorer` builds one. Adding one: a class
implementing the protocol, a builder, and one ``register_scorer`` line (or a ``ScorerSpec``
under the ``treeroll.scorers`` entry point of a package of your own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from treeroll.base import GenerationBackend, ProcessScorer
from treeroll.checks import checked
from treeroll.formatting import TurnFormat
from treeroll.registry import Registry, build_user_plugin, plugin_section
from treeroll.scorers.degeneracy import Degeneracy
from treeroll.scorers.judge import JUDGE_PROMPT, JudgeScorer, parse_rating
from treeroll.scorers.mixture import Blend, blend
from treeroll.scorers.progress import FrozenLakeProgress
from treeroll.scorers.value import ValueScorer, trajectory_features

__all__ = [
    "JUDGE_PROMPT",
    "SCORERS",
    "SCORER_BLOCKS",
    "Blend",
    "BlendSettings",
    "Degeneracy",
    "FrozenLakeProgress",
    "JudgeScorer",
    "JudgeSettings",
    "ScorerConfig",
    "ScorerSpec",
    "ValueScorer",
    "blend",
    "make_scorer",
    "parse_rating",
    "register_scorer",
    "trajectory_features",
]


@dataclass
class BlendSettings:
    """``scorer.blend``: the two scorers ``blend`` mixes and the weight of the first."""

    a: str = "frozenlake_progress"
    """First scorer."""
    b: str = "degeneracy"
    """Second scorer."""
    weight: float = checked(0.7, ge=0, le=1)
    """Weight of the first scorer (``weight * a + (1 - weight) * b``)."""


@dataclass
class JudgeSettings:
    """``scorer.judge``: the model the ``judge`` scorer asks."""

    model_path: str | None = None
    """A local model directory (``save_pretrained``); None = the judge needs a backend passed
    to :func:`make_scorer` by the caller."""


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
    ``config.judge.model_path``."""
    if backend is None or turn_format is None:
        path = config.judge.model_path
        if not path:
            raise ValueError("the judge scorer needs a model: set scorer.judge.model_path to a "
                             "local model directory (or pass backend= and turn_format=)")
        from treeroll.backends import BackendConfig, make_backend
        from treeroll.policies import Policy
        from treeroll.policies.model import load_policy_files

        model, tokenizer = load_policy_files(path)
        backend = make_backend(BackendConfig(), Policy(model.eval(), tokenizer))
        turn_format = TurnFormat(tokenizer)
    return JudgeScorer(backend, turn_format)


def build_blend(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``blend`` of ``scorer.blend.a`` and ``scorer.blend.b`` with weight
    ``scorer.blend.weight``."""
    settings = config.blend
    if "blend" in (settings.a, settings.b):
        raise ValueError("scorer.blend.a and scorer.blend.b must name scorers other than blend")
    from dataclasses import replace

    first = make_scorer(replace(config, name=settings.a), **context)
    second = make_scorer(replace(config, name=settings.b), **context)
    return blend(first, second, settings.weight)


def make_scorer(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """The scorer named by ``config.name``: a registered name (:data:`SCORERS`)
    or ``package.module:object`` (a scorer instance, or a class or builder given the
    ``scorer.options`` block).

    ``context`` (keyword-only) passes run objects some scorers need, e.g. ``backend=`` and
    ``turn_format=`` for ``judge``.
    """
    if not config.name:
        raise ValueError("scorer.name is not set; valid: " + ", ".join(SCORERS.names()))
    if config.name in SCORERS:
        return SCORERS.get(config.name).build(config, **context)
    obj: Any = SCORERS.get(config.name)  # an import path, or raises listing the valid names
    made: ProcessScorer = build_user_plugin(obj, config.options, "scorer")
    return made


ScorerBuilder = Callable[..., ProcessScorer]
"""``(scorer_config, **context) -> ProcessScorer``; ``context`` holds run objects a scorer may
need (``backend=``, ``turn_format=``, ``seed=``)."""


@dataclass(frozen=True)
class ScorerSpec:
    """One process scorer's registration record: its builder and its settings block's
    dataclass (``scorer.<name>.*``; None when it has no settings)."""

    build: ScorerBuilder
    _: KW_ONLY  # every other field by name: a record grows without reordering
    settings: type | None = None


SCORERS: Registry[ScorerSpec] = Registry("process scorer")
"""Scorer name -> :class:`ScorerSpec`."""


def register_scorer(name: str, build: ScorerBuilder, *, settings: type | None = None
                    ) -> ScorerSpec:
    """Register scorer ``name`` (see :class:`ScorerSpec`)."""
    return SCORERS.register(name, ScorerSpec(build, settings=settings))


def _swe_scorer(config: ScorerConfig, **context: Any) -> ProcessScorer:
    """``swe``: the SWE environment's scorer (tests run, edits compile)."""
    from treeroll.envs.swe import SWEProcessScorer

    return SWEProcessScorer()


register_scorer("frozenlake_progress", build_frozenlake_progress)
register_scorer("degeneracy", build_degeneracy)
register_scorer("value", build_value)
register_scorer("judge", build_judge, settings=JudgeSettings)
register_scorer("blend", build_blend, settings=BlendSettings)
register_scorer("swe", _swe_scorer)


SCORERS.load_entry_points("treeroll.scorers", record=ScorerSpec)  # installed packages' own

SCORER_BLOCKS: dict[str, type] = {
    name: spec.settings for name in SCORERS if (spec := SCORERS.get(name)).settings is not None}
"""The scorers that have settings: ``scorer.<name>.*`` (from the records)."""


@dataclass
class ScorerSection:
    """The process scorer PATR uses (ignored by strategies that do not score)."""

    name: str | None = None
    """e.g. ``frozenlake_progress``, ``degeneracy``, ``blend``; None = no scorer."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own scorer (``package.module:object``): its config block, ``KEY VALUE``
    pairs on the command line or a mapping in YAML, each value read as YAML; a dataclass gets
    them as its fields, a builder as keywords."""


if TYPE_CHECKING:  # what plugin_section makes, as the type checker sees the built-ins
    @dataclass
    class ScorerConfig(ScorerSection):
        judge: JudgeSettings = field(default_factory=JudgeSettings)
        blend: BlendSettings = field(default_factory=BlendSettings)
else:
    ScorerConfig = plugin_section(ScorerSection, SCORER_BLOCKS, "ScorerConfig")
