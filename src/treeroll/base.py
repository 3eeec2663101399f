"""Every extension point of treeroll, declared in one place.

treeroll has six kinds of plug-in. Each is a ``typing.Protocol`` (or a ``Callable`` alias) over
small typed records, so the rollout engine and the trainer never branch on a plug-in's name:

* :class:`Env` -- a text environment that can be forked (``reset`` / ``step`` / ``fork``).
* :class:`GenerationBackend` -- continues many exact token prefixes at once (token-in/token-out).
* :class:`Strategy` -- decides where a rollout tree branches, continues and stops (and, as a
  :class:`FinishingStrategy`, may have a last word on each finished tree).
* :class:`ProcessScorer` -- scores a partial trajectory in ``[0, 1]`` (PATR's process feedback).
* :data:`AdvantageEstimator` -- turns the leaves of one tree (one task's group) into advantages.
* :class:`Allocator` -- decides each task's budget in a batch, and may grant more later.

Required inputs are positional, hyper-parameters keyword-only; bind hyper-parameters with
``functools.partial`` or the component's config dataclass.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from treeroll.environment import (
    Env,
    ExampleEnv,
    ExpertEnv,
    ExpertReply,
    StepResult,
    TurnLimitedEnv,
)

if TYPE_CHECKING:
    from treeroll.tree import Node, RolloutTree

__all__ = [
    "AdvantageEstimator",
    "Allocator",
    "BatchAdvantageEstimator",
    "Budget",
    "Completion",
    "Env",
    "ExampleEnv",
    "ExpertEnv",
    "ExpertReply",
    "ExtendableStrategy",
    "FinishingStrategy",
    "GenerationBackend",
    "GenerationRequest",
    "LearningScorer",
    "Named",
    "ProcessScorer",
    "SamplingExtras",
    "SamplingParams",
    "SamplingStrategy",
    "Score",
    "ScoringStrategy",
    "SnapshotStrategy",
    "StepResult",
    "Strategy",
    "StrategyContext",
    "StreamingBackend",
    "TurnLimitedEnv",
    "UnitStrategy",
    "UpdatableBackend",
    "plugin_name",
    "tree_state",
]


# --------------------------------------------------------------------------------------------
# Generation backends
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """How to sample continuations. One value for a whole batch of requests."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 disables it)."""
    max_new_tokens: int = 64
    """Upper bound on tokens generated per request (requests may lower it further)."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation of a request ends after it samples one of these ids (the id is kept)."""
    entropy_window: int = 0
    """If > 0, report the mean entropy of the first ``entropy_window`` sampled positions (ARPO)."""
    top_logprobs: int = 0
    """If > 0, report the ``top_logprobs`` most probable ids and their logprobs (under the
    sampling distribution) at each sampled position."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class GenerationRequest:
    """Continue exactly this token prefix (token-in)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int | None = None
    """Per-request cap, e.g. what is left of a token budget; ``None`` uses the batch's."""
    seed: int | None = None
    """Seeds this request's own sampler: its tokens do not depend on the rest of the batch."""


@dataclass
class Completion:
    """What a backend sampled for one request (token-out), with its cost."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled id under the sampling distribution."""
    finish_reason: str
    """``"stop"`` (a stop id was sampled) or ``"length"`` (hit ``max_new_tokens``)."""
    prefill_tokens: int = 0
    """Prompt tokens this request made the backend compute (not served from a cache)."""
    cached_tokens: int = 0
    """Prompt tokens served from the backend's prefix cache."""
    shared_tokens: int = 0
    """Sampled tokens that an earlier request of the same call sampled too, in the same
    context (identical sibling turns): the backend computed them once for both (the HF
    backend decodes such requests in one batch row); always the first tokens of the reply."""
    reused_tokens: int = 0
    """Sampled tokens, other than the reply's last, that this request did not feed: they were
    sampled from logits the backend kept from an earlier call, where the same context had been
    computed (the HF backend replays a turn that repeats an earlier one token for token)."""
    entropy: float | None = None
    """Mean normalised entropy over the first ``entropy_window`` positions, when asked for."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per sampled position, the ``top_logprobs`` most probable ``(id, logprob)``, when asked."""


@runtime_checkable
class GenerationBackend(Protocol):
    """Continues many exact token prefixes at once and reports what that cost.

    Implementations reuse work on shared prefixes (a KV-cache trie in the transformers
    backend, automatic prefix caching in vLLM, RadixAttention in SGLang). They must count
    honestly: ``prefill_tokens`` are prompt tokens actually forwarded for this request,
    ``cached_tokens`` those served from a cache, so the two add up to ``len(prompt_ids)``
    (a request whose prompt is entirely cached forwards its last token again, unless the
    backend kept that position's logits, as the transformers backend does).
    """

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        """Sample one continuation per request, batched; results in request order."""
        ...

    def reset_cache(self) -> None:
        """Forget every cached prefix (call after a weight update)."""
        ...


@runtime_checkable
class UpdatableBackend(GenerationBackend, Protocol):
    """A backend that can take new weights: an optional protocol (a trainer whose backend
    shares its model object in-process only needs ``reset_cache`` after an update)."""

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Sample with these weights from now on. Everything cached under the old weights
        (prefix KV, kept logits) is forgotten: it would mix two policies in one sample."""
        ...


@runtime_checkable
class StreamingBackend(GenerationBackend, Protocol):
    """A backend that decodes requests continuously: an optional protocol. Requests join the
    running decode batch as they are submitted, and each finishes as soon as its own reply
    ends, whatever the others do (continuous batching, as vLLM and SGLang schedule). The
    engine uses it with ``RolloutConfig.continuous``."""

    def submit(self, requests: Sequence[GenerationRequest],
               params: SamplingParams) -> list[int]:
        """Queue requests for the running batch; one ticket each (all with one ``params``)."""
        ...

    def advance(self) -> list[tuple[int, Completion]]:
        """Join what is queued, decode one step; the requests that finished, by ticket."""
        ...

    @property
    def busy(self) -> bool:
        """Whether submitted requests are still queued or decoding."""
        ...


# --------------------------------------------------------------------------------------------
# Process scorers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """A process score in ``[0, 1]`` (higher = more promising) and a short human reason."""

    value: float
    reason: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.value <= 1.0:
            raise ValueError(f"a process score must lie in [0, 1], got {self.value}")


@runtime_checkable
class ProcessScorer(Protocol):
    """Scores partial trajectories. Called with all nodes to score at once (batched)."""

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """Return one :class:`Score` per node, in order."""
        ...


# --------------------------------------------------------------------------------------------
# Rollout strategies
# --------------------------------------------------------------------------------------------


@runtime_checkable
class LearningScorer(ProcessScorer, Protocol):
    """A :class:`ProcessScorer` that learns from finished trees (optional: the value scorer;
    the trainer hands it each step's trees)."""

    def observe(self, trees: Sequence[RolloutTree]) -> Any:
        """Learn from the finished ``trees`` (their leaves' rewards)."""
        ...


@runtime_checkable
class Named(Protocol):
    """A plug-in that says its registered name (the built-in strategies do)."""

    name: str


def plugin_name(plugin: object) -> str:
    """``plugin.name`` for a :class:`Named` plug-in, else its class name (for records)."""
    return str(plugin.name) if isinstance(plugin, Named) else type(plugin).__name__


@dataclass
class StrategyContext:
    """What a strategy may look at besides the tree: the budget left and a seeded RNG."""

    rng: np.random.Generator
    max_leaves: int | None
    """Leaves this tree may still end with (``None`` = unlimited)."""
    tokens_left: int | None
    """Generated tokens this tree may still spend (``None`` = unlimited)."""
    scorer: ProcessScorer | None = None
    state: Any = None
    """The strategy's own per-tree state: a dataclass of its own, made on first use by
    :func:`tree_state` (``TreeGRPOState``: the rounds done so far, ...)."""
    seed: int = 0
    """The seed of ``rng``: a strategy that needs draws independent of the order in which
    its units finish derives its own generators from it (``default_rng([seed, ...])``)."""
    unit: Hashable | None = None
    """Set by the engine while it calls ``step`` for one unit of a :class:`UnitStrategy`
    (``None``: the call covers the whole tree, as in synchronous rounds)."""


StateT = TypeVar("StateT")


def tree_state(ctx: StrategyContext, kind: type[StateT]) -> StateT:
    """The strategy's per-tree state in ``ctx``, of the strategy's own dataclass ``kind``
    (made with its defaults on first use): typed fields instead of string keys, so a
    misspelt one fails type checking."""
    if ctx.state is None:
        ctx.state = kind()
    elif not isinstance(ctx.state, kind):
        raise TypeError(f"the tree's strategy state is a {type(ctx.state).__name__}, not a "
                        f"{kind.__name__}: one context per tree and strategy")
    return ctx.state


@runtime_checkable
class Strategy(Protocol):
    """Decides where one task's tree grows.

    The rollout engine keeps a *frontier*: a list of nodes to extend by one turn each. Listing
    a node ``k`` times samples ``k`` children from it (a branch point); leaving an active node
    out stops it (the strategy records why in ``node.status``). The engine sends the ready
    entries of every tree in a batch to the backend together, enforces the budget, and stops a
    tree when its frontier is empty (see :mod:`treeroll.engine.loop`).
    """

    @property
    def revisits_nodes(self) -> bool:
        """True if the strategy may later branch from any node (then every node keeps a forked
        environment snapshot); False if it only extends the nodes it just created."""
        ...

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """Return the first frontier (usually the root, several times)."""
        ...

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Given the children created by the last turn, return the next frontier.

        ``created`` is in the order of the frontier entries that ran; the budget only removes
        entries, so several entries of one node keep their order (the first ones run)."""
        ...


@runtime_checkable
class ScoringStrategy(Strategy, Protocol):
    """A :class:`Strategy` that can steer by a process scorer (PATR): when ``use_scores`` is
    on and no scorer is named, the run uses the environment's own
    (:func:`treeroll.assemble.scorer_name_for`)."""

    use_scores: bool


@runtime_checkable
class FinishingStrategy(Strategy, Protocol):
    """A :class:`Strategy` with a last word on each tree: an optional protocol (the engine
    calls ``finish`` on strategies that implement it). Tree-GRPO keeps its ``k`` random leaves
    per tree there, so ``k`` holds however the rollout ended (its schedule or the budget)."""

    def finish(self, tree: RolloutTree, ctx: StrategyContext) -> None:
        """Called once per tree when the rollout has ended: every branch has stopped and its
        status is final. May drop leaves from the group (``NodeStatus.DROPPED``); must not
        add nodes."""
        ...


@dataclass(frozen=True)
class SamplingExtras:
    """What a strategy needs recorded at every turn besides the tokens and their logprobs."""

    entropy_window: int = 0
    """Mean normalised entropy of each turn's first ``entropy_window`` tokens (``Node.entropy``)."""
    top_logprobs: int = 0
    """The ``top_logprobs`` most probable ids per generated token
    (``Node.info["top_logprobs"]``)."""


@runtime_checkable
class SamplingStrategy(Strategy, Protocol):
    """A :class:`Strategy` that asks for per-turn sampling extras: an optional protocol (ARPO
    branches on the entropy after an observation). The engine asks once per rollout and takes
    the larger of this and ``RolloutConfig.entropy_window``."""

    def sampling_extras(self) -> SamplingExtras:
        """The extras every turn of this strategy's trees records."""
        ...


@runtime_checkable
class SnapshotStrategy(Strategy, Protocol):
    """A :class:`Strategy` that says per node whether it may branch from it again: an
    optional protocol for strategies with ``revisits_nodes`` (every node otherwise keeps a
    forked environment snapshot until the rollout ends; an SWE snapshot is a working tree)."""

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """False once the strategy will never extend ``node`` again (its snapshot is dropped;
        asked after each of the tree's steps, for nodes not about to be extended)."""
        ...


@runtime_checkable
class UnitStrategy(Strategy, Protocol):
    """A :class:`Strategy` whose branches fall into independent *units*: an optional protocol.

    By default a tree advances as one unit: ``step`` sees every child its last frontier
    created, after all of them are back. A unit strategy splits the frontier: the engine calls
    ``step`` for one unit (``ctx.unit`` names it, ``created`` holds that unit's children only)
    as soon as that unit's branches are back, while the tree's other units are still in
    flight. Chain's units are its trajectories; Tree-GRPO's are its M trees, so tree ``i`` is
    expanded as soon as its own chain has ended. With ``RolloutConfig.synchronous`` the engine
    ignores units (the released code's batched rounds).
    """

    def units(self, tree: RolloutTree, frontier: Sequence[Node],
              ctx: StrategyContext) -> list[Hashable]:
        """The unit of each entry of ``frontier`` (just returned by ``start``, ``step`` or
        ``extend``), in order."""
        ...


@dataclass(frozen=True)
class Budget:
    """What one task's tree may spend: leaves and generated tokens (``None`` = no limit)."""

    leaves: int | None = None
    tokens: int | None = None


@runtime_checkable
class ExtendableStrategy(Strategy, Protocol):
    """A :class:`Strategy` that can use more budget after its tree went idle: an optional
    protocol (an :class:`Allocator` may grant more; a strategy without ``extend`` ignores it)."""

    def extend(self, tree: RolloutTree, ctx: StrategyContext, grant: Budget) -> list[Node]:
        """The tree has nothing in flight and was granted ``grant`` more (already added to
        ``ctx``); return the frontier that spends it (empty: the tree stays finished)."""
        ...


# --------------------------------------------------------------------------------------------
# Budget allocators
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Allocator(Protocol):
    """Decides how much each task of a batch may spend (VIGOR moves budget between tasks).

    ``start`` gives every tree its first budget; whenever trees go idle (nothing in flight,
    nothing left to do) the engine calls ``grant`` with all idle trees, and each budget it
    returns is *added* to that tree's (``None`` fields add nothing), after which the tree's
    strategy continues it (:class:`ExtendableStrategy`). The rollout ends when every tree is
    idle and ``grant`` returns nothing new. Grants for trees that are not idle are an error.
    """

    def start(self, trees: Sequence[RolloutTree]) -> list[Budget]:
        """One budget per tree, in order."""
        ...

    def grant(self, trees: Sequence[RolloutTree], idle: Sequence[int]) -> dict[int, Budget]:
        """More budget for some of the idle trees (indices into ``trees``); ``{}`` = none."""
        ...


# --------------------------------------------------------------------------------------------
# Advantage estimators
# --------------------------------------------------------------------------------------------

AdvantageEstimator = Callable[["RolloutTree"], Any]
"""Maps one task's tree (its leaves are the group) to its credit: one advantage per leaf in the
order of ``treeroll.tree.leaves(tree)`` (shape ``[num_leaves]``), or per turn (a mapping
``node id -> value``, or one array of turn values per leaf); see
:func:`treeroll.credit.estimators.token_credit`. Hyper-parameters are keyword-only."""


@runtime_checkable
class BatchAdvantageEstimator(Protocol):
    """Credit that needs the whole batch, not one task's group (a baseline over the other
    tasks, as SAO's single rollouts need): the trainer calls :meth:`over_batch` with every
    tree of a step instead of calling the estimator once per tree."""

    def over_batch(self, trees: Sequence[RolloutTree]) -> list[Any]:
        """One credit per tree, in order, each in a form :data:`AdvantageEstimator`
        returns."""
        ...
