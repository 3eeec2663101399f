"""Trees for an external trainer: one tree per task, exactly ``group_size`` leaves each.

A trainer (TRL, verl, rLLM) asks for ``G`` completions per prompt and normalises rewards over
each block of ``G``. A treeroll strategy's tree has a leaf count of its own: Tree-GRPO's is
``m * (l * n + 1)`` before the budget, PATR prunes, an episode may end early. So
:class:`TreeGroups` grows the trees with the leaf budget set to ``G`` (unless the settings ask
for more, to explore wider), then makes every group exactly ``G``:

- **more than G leaves** (a larger ``rollout.max_leaves``): :func:`choose_leaves` keeps ``G``
  by taking the first-turn subtrees in turn (round robin, each subtree's leaves in creation
  order), so every first-turn branch that has leaves is represented before any gets a second;
- **exactly G by construction**: ``shape=EarlyForks(group_size=G)`` grows one chain (or a
  few) and forks the other leaves from it in its first turns as it goes: nothing grown is
  thrown away, and the forks run beside their chain (with ``on_end="repeat"``, G rows: a leaf
  may stand for several, :func:`rows_of`);
- **fewer than G** (a pruning strategy, or a budget that ran out): the shortfall is filled by
  fresh chains from the same task, grafted onto the tree's root (:func:`graft`), marked
  ``info["top_up"]``: the group is still samples of the current policy, and the tree's credit
  sees them. treeroll chose top-up chains over repeating a leaf, which would weight it twice
  (``EarlyForks(on_end="repeat")`` repeats a leaf on purpose: there the repeat is the row the
  fork it replaces would have been).

The credit treeroll's estimator gives each leaf (``advantage.*``, on the whole tree) comes with
the group, for trainers that accept a precomputed advantage. A process scorer that learns from
finished trees (``value``) is not updated here: ``treeroll train`` calls its ``observe``, an
external trainer does not.
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from treeroll.assemble import assemble
from treeroll.base import (
    BatchAdvantageEstimator,
    Env,
    GenerationBackend,
    ProcessScorer,
    Strategy,
)
from treeroll.causal_lm import CausalLM
from treeroll.config import TrainConfig, load_config
from treeroll.config_checks import check_config
from treeroll.credit import make_estimator
from treeroll.credit.estimators import token_credit, weighted
from treeroll.engine import RolloutConfig, make_allocator, rollout
from treeroll.formatting import TurnFormat
from treeroll.policies import Policy, resolve_policy
from treeroll.strategies import Chain, EarlyForks
from treeroll.strategies.early_forks import REPEATS
from treeroll.tree import (
    Node,
    RolloutTree,
    Trajectory,
    export_trajectories,
    leaves,
    path_to,
)

__all__ = ["LeafGroup", "TreeGroups", "choose_leaves", "graft", "policy_view", "rows_of",
           "seed_for"]

_COPIED = ("action_ids", "action_logprobs", "action_text", "observation_ids",
           "observation_text", "reward", "terminated", "truncated", "status", "note", "score",
           "score_reason", "finish_reason", "entropy")


@dataclass
class LeafGroup:
    """One task's tree and the ``G`` leaves handed to the trainer, as its rows."""

    tree: RolloutTree
    leaves: list[Node]
    """The chosen leaves, in row order (a leaf repeated by ``EarlyForks(on_end="repeat")``
    stands once per row)."""
    trajectories: list[Trajectory]
    """Each chosen leaf as token ids, environment mask and sampling logprobs."""
    credit: list[float | np.ndarray]
    """treeroll's estimator's credit of each chosen leaf (computed on the whole tree): a float,
    or one value per response token for a per-turn estimator."""

    def is_top_up(self, index: int) -> bool:
        """Whether row ``index`` is a top-up chain."""
        return bool(self.leaves[index].info.get("top_up", False))

    @property
    def topped_up(self) -> int:
        """How many of the leaves are top-up chains (the tree had fewer than ``G``)."""
        return sum(self.is_top_up(i) for i in range(len(self.leaves)))

    @property
    def rewards(self) -> list[float]:
        """Each row's environment reward (the sum of its path's turn rewards)."""
        return [t.reward for t in self.trajectories]

    def row_credit(self, index: int) -> float:
        """Row ``index``'s credit as one value: a per-token credit is reduced to its mean over
        the row's model tokens (for trainers that take one advantage per row)."""
        value = self.credit[index]
        if isinstance(value, np.ndarray):
            mask = np.asarray(self.trajectories[index].response_mask, dtype=bool)
            return float(value[mask].mean()) if mask.any() else 0.0
        return float(value)

    def scalar_credit(self) -> list[float]:
        """:meth:`row_credit` of every row."""
        return [self.row_credit(i) for i in range(len(self.leaves))]


def policy_view(config: TrainConfig) -> str:
    """The observation view the adapters' turn format uses: ``policy.view``, else the one
    recorded in ``policy.init``'s folder (its ``treeroll.json``; the weights are not read),
    else ``plain``."""
    if config.policy.view is not None:
        return config.policy.view
    if config.policy.init is None:
        return "plain"
    meta = resolve_policy(config.policy.init) / "treeroll.json"
    view: str = json.loads(meta.read_text()).get("view", "plain") if meta.is_file() else "plain"
    return view


def seed_for(group: str, task_seed: int) -> int:
    """A reproducible rollout seed for a trainer's group id (verl's ``uid``, rLLM's episode
    id) and task: CRC-32 of the id, not Python's ``hash`` (salted per process)."""
    state = np.random.SeedSequence([zlib.crc32(group.encode()), int(task_seed)])
    return int(state.generate_state(1)[0])


def rows_of(tree: RolloutTree) -> list[Node]:
    """The leaves of ``tree`` as a group's rows: each leaf once, and again for every repeat
    :class:`EarlyForks` (``on_end="repeat"``) recorded on it in ``info["repeats"]``."""
    return [leaf for leaf in leaves(tree) for _ in range(1 + int(leaf.info.get(REPEATS, 0)))]


def choose_leaves(tree: RolloutTree, group_size: int) -> list[Node]:
    """``group_size`` rows of ``tree`` (:func:`rows_of`): all of them when there are at most
    that many, else the first-turn subtrees in turn, round robin (see the module docstring)."""
    group = rows_of(tree)
    if len(group) <= group_size:
        return group
    by_subtree: dict[int, list[Node]] = {}
    for leaf in group:
        by_subtree.setdefault(path_to(leaf)[1].id, []).append(leaf)
    queues = list(by_subtree.values())
    chosen: list[Node] = []
    while len(chosen) < group_size:
        for queue in queues:
            if queue and len(chosen) < group_size:
                chosen.append(queue.pop(0))
    order = {leaf.id: i for i, leaf in enumerate(group)}
    return sorted(chosen, key=lambda leaf: order[leaf.id])


def graft(tree: RolloutTree, donor: RolloutTree) -> list[Node]:
    """Copy every non-root node of ``donor`` (a tree of the same task: same root prompt) under
    ``tree``'s root, marked ``info["top_up"] = True``; returns the copied leaves."""
    if donor.root.observation_ids != tree.root.observation_ids:
        raise ValueError(f"cannot graft a tree of another prompt onto task {tree.task_seed}")
    copies: dict[int, Node] = {donor.root.id: tree.root}
    for node in donor.nodes[1:]:
        assert node.parent is not None
        fields = {name: getattr(node, name) for name in _COPIED}
        copies[node.id] = tree.add_child(copies[node.parent.id],
                                         info={**node.info, "top_up": True}, **fields)
    return [copies[n.id] for n in donor.nodes[1:] if n.is_leaf]


class TreeGroups:
    """Grows treeroll trees for a trainer's tasks with the trainer's current model.

    ``config`` supplies the strategy, rollout settings, scorer, estimator, environment and
    backend (the same YAML ``treeroll train`` reads; its optimiser settings are the trainer's
    business and unused). ``group_size`` is the trainer's ``G``. ``make_env`` overrides the
    environment named by ``config.env``. ``shape`` replaces ``config.strategy`` with a strategy
    object, :class:`EarlyForks` for a tree of exactly ``G`` leaves. Every setting is checked
    here, before any work.
    """

    def __init__(self, config: TrainConfig, turn_format: TurnFormat, *, group_size: int,
                 make_env: Callable[[], Env] | None = None,
                 scorer: ProcessScorer | None = None, shape: Strategy | None = None) -> None:
        if group_size < 1:
            raise ValueError(f"group_size is {group_size}; a group needs at least 1 leaf")
        if isinstance(shape, EarlyForks) and shape.group_size != group_size:
            raise ValueError(f"shape EarlyForks(group_size={shape.group_size}) for groups of "
                             f"{group_size}: make it EarlyForks(group_size={group_size}, ...)")
        check_config(config)
        self.config, self.turn_format, self.group_size = config, turn_format, group_size
        if isinstance(make_estimator(config.advantage), BatchAdvantageEstimator):
            raise ValueError(f"advantage.name {config.advantage.name!r} compares the tasks of a "
                             "whole batch; a trainer adapter credits one task's group at a "
                             "time: choose a per-group estimator (grpo, rloo, tree, ...)")
        self.parts = assemble(config, make_env=make_env, strategy=shape, scorer=scorer)
        self.make_env, self.strategy = self.parts.make_env, self.parts.strategy
        self.estimator, self.scorer = self.parts.estimator, self.parts.scorer
        budget = config.rollout.max_leaves
        self.rollout_config = replace(config.rollout, max_leaves=max(budget or 0, group_size))

    @classmethod
    def from_file(cls, path: str | None, tokenizer: Any, *, group_size: int) -> TreeGroups:
        """Groups for a trainer that owns the tokenizer: the settings of the treeroll YAML
        ``path`` (None: the defaults), the turn format in :func:`policy_view`'s view."""
        config = load_config(path) if path is not None else TrainConfig()
        return cls(config, TurnFormat(tokenizer, view=policy_view(config)),
                   group_size=group_size)

    def grow(self, tasks: Sequence[int], model: CausalLM, tokenizer: Any, *, seed: int,
             temperature: float | None = None, top_p: float | None = None) -> list[LeafGroup]:
        """One :class:`LeafGroup` of exactly ``group_size`` leaves per task seed in ``tasks``,
        sampled from ``model`` as it is now (a fresh backend per call: the weights changed
        since the last one). ``temperature`` and ``top_p`` override ``rollout.*`` (an adapter
        passes the trainer's, so that the recorded logprobs are those of the distribution the
        trainer samples and recomputes)."""
        policy = Policy(model, tokenizer, self.turn_format.view)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                backend = self.parts.backend(policy)
                return self.grow_on(backend, tasks, seed=seed, temperature=temperature,
                                    top_p=top_p)
        finally:
            model.train(was_training)

    def grow_on(self, backend: GenerationBackend, tasks: Sequence[int], *, seed: int,
                temperature: float | None = None,
                top_p: float | None = None) -> list[LeafGroup]:
        """:meth:`grow` on a backend the trainer owns (verl's inference server, say)."""
        settings = self.rollout_config
        if temperature is not None:
            settings = replace(settings, temperature=float(temperature))
        if top_p is not None:
            settings = replace(settings, top_p=float(top_p))
        strategy = copy.deepcopy(self.strategy)  # calls may run side by side (verl's loops)
        batch = rollout(list(tasks), self.make_env, backend, self.turn_format, strategy,
                        config=settings, scorer=self.scorer, seed=seed,
                        allocator=make_allocator(self.config.allocator, settings))
        return [self._group(tree, backend, settings, seed) for tree in batch.trees]

    def _group(self, tree: RolloutTree, backend: Any, settings: RolloutConfig,
               seed: int) -> LeafGroup:
        shortfall = self.group_size - len(rows_of(tree))
        if shortfall > 0:
            chains = rollout([tree.task_seed], self.make_env, backend, self.turn_format,
                             Chain(group_size=shortfall),
                             config=replace(settings, max_leaves=shortfall),
                             seed=seed + 7919 * (tree.tree_id + 1))
            graft(tree, chains.trees[0])
        chosen = choose_leaves(tree, self.group_size)
        if len(chosen) != self.group_size:
            raise RuntimeError(f"task {tree.task_seed}: {len(chosen)} leaves after the top-up, "
                               f"expected {self.group_size}")
        group = leaves(tree)
        credit = weighted(tree, token_credit(tree, self.estimator(tree)))
        index = {leaf.id: i for i, leaf in enumerate(group)}
        trajectories = export_trajectories(tree)
        rows = [index[leaf.id] for leaf in chosen]
        return LeafGroup(tree=tree, leaves=chosen,
                         trajectories=[trajectories[i] for i in rows],
                         credit=[credit[i] for i in rows])
