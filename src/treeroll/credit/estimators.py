"""Advantage estimators over one task's tree (its leaves are the group).

All share one signature, :data:`treeroll.base.AdvantageEstimator`: ``estimator(tree, *,
hyper-parameters) -> np.ndarray [num_leaves]`` in :func:`treeroll.tree.leaves` order.
:func:`treeroll.credit.make_estimator` binds the hyper-parameters of ``AdvantageConfig``.

* ``grpo``: ``(R - mean R) / (std R + eps)`` over the group.
* ``dr_grpo``: ``R - mean R`` (Dr. GRPO drops the std).
* ``rloo``: ``R_i - mean_{j != i} R_j``.
* ``tree`` (:func:`tree_advantage`): Tree-GRPO's ``A_intra + A_inter``: GRPO within each
  first-level subtree (the M trees of a task, :func:`treeroll.tree.subtree_index`) plus GRPO
  over all leaves of the task.
* ``treerl`` (:func:`treerl`): TreeRL's per-node process advantage, one value per turn
  (credit per token: every leaf through a turn gives that turn's tokens the same value).
* ``treepo`` (:func:`treepo`): TreePO's depth subgroups: per leaf, the mean over depths of
  its reward minus the mean reward of the leaves sharing its prefix to that depth.
* ``progress`` (:func:`progress_conditioned`): GRPO, except that a group whose rewards are all
  zero is ranked by how many states each leaf alone reached (observation coverage).
* ``planpo`` (:func:`planpo`): treeroll's reading of PlanPO: GRPO on rewards that grow, up to
  ``1 + beta``, for successes reached in fewer turns than the group's other successes.
* ``gigpo`` (:func:`gigpo`): GiGPO's ``A_episode + omega * A_step``, the step term comparing
  the discounted returns of the turns taken from the same environment state, one value per
  turn of each leaf.
* ``arpo_hard`` (:func:`arpo_hard`): treeroll's reading of ARPO's "hard" shared-token
  advantage: every turn gets the mean GRPO advantage of the group's leaves that share it,
  one value per turn.
* ``sao`` (:class:`BatchBaseline`): treeroll's reading of SAO's group-free baseline, over the
  whole batch (a :class:`~treeroll.base.BatchAdvantageEstimator`): each leaf's reward minus
  the mean reward of the other tasks' leaves, over the batch's reward std.

An estimator returns its credit in one of three forms (:func:`token_credit` turns each into
the per-token advantages the update takes): an array ``[num_leaves]`` (one value per leaf,
broadcast to its model tokens), a mapping ``node id -> value`` (one value per turn, the same in
every leaf through it), or a list with one array per leaf of one value per turn on its path.

treeroll's choice of std (the GRPO paper does not say which): ``std="population"`` (default,
``ddof=0``: numpy's ``std``) keeps every figure measured so far; ``std="sample"`` (``ddof=1``,
unbiased) is what verl and TRL compute (``torch.std``) and so what Tree-GRPO's released code
uses. The two differ by ``sqrt(n / (n - 1))``: 1.07 for a group of 8, 1.41 for an intra-tree
group of 2.

treeroll's choice for groups of one (the Tree-GRPO paper inherits verl's mean 0, std 1, which
makes a lone leaf's advantage its raw reward): ``singleton="zero"`` (default) gives a group of
one advantage 0, so a tree that never branches gets exactly chain GRPO's advantages;
``singleton="verl"`` reproduces verl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from treeroll.tree import (
    Node,
    RolloutTree,
    leaf_rewards,
    leaves,
    leaves_below,
    path_to,
    subtree_index,
)

__all__ = ["BatchBaseline", "arpo_hard", "dr_grpo", "gigpo", "grpo", "normalise", "planpo",
           "progress_conditioned", "rloo", "token_credit", "tree_advantage", "treepo", "treerl",
           "weighted"]


def normalise(rewards: np.ndarray, *, scale: bool = True, eps: float = 1e-6,
              singleton: str = "zero", std: str = "population") -> np.ndarray:
    """Group-normalised advantages of one group's rewards (shape ``[n]``); ``std`` is
    ``"population"`` (ddof=0) or ``"sample"`` (ddof=1), see the module docstring."""
    if std not in ("population", "sample"):
        raise ValueError(f"std must be 'population' or 'sample', got {std!r}")
    if singleton not in ("zero", "verl"):
        raise ValueError(f"singleton must be 'zero' or 'verl', got {singleton!r}")
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.size == 0:
        return rewards
    if rewards.size == 1:
        return rewards.copy() if singleton == "verl" else np.zeros(1)
    centred = rewards - rewards.mean()
    if not scale:
        return centred
    return centred / (rewards.std(ddof=1 if std == "sample" else 0) + eps)


def grpo(tree: RolloutTree, *, eps: float = 1e-6, std: str = "population",
         singleton: str = "zero") -> np.ndarray:
    """GRPO: rewards standardised over the task's group."""
    return normalise(np.array(leaf_rewards(tree)), eps=eps, std=std, singleton=singleton)


def dr_grpo(tree: RolloutTree, *, singleton: str = "zero") -> np.ndarray:
    """Dr. GRPO: rewards centred on the group mean, not divided by the std."""
    return normalise(np.array(leaf_rewards(tree)), scale=False, singleton=singleton)


def rloo(tree: RolloutTree) -> np.ndarray:
    """REINFORCE leave-one-out: each reward minus the mean of the others."""
    rewards = np.array(leaf_rewards(tree), dtype=np.float64)
    n = rewards.size
    if n < 2:
        return np.zeros(n)
    return rewards - (rewards.sum() - rewards) / (n - 1)


def tree_advantage(tree: RolloutTree, *, eps: float = 1e-6, std: str = "population",
                   singleton: str = "zero") -> np.ndarray:
    """Tree-GRPO: intra-subtree GRPO plus inter (whole-task) GRPO."""
    group = leaves(tree)
    rewards = np.array(leaf_rewards(tree, group), dtype=np.float64)
    inter = normalise(rewards, eps=eps, std=std, singleton=singleton)
    intra = np.zeros_like(rewards)
    subtrees = np.array([subtree_index(tree, leaf) for leaf in group])
    for index in np.unique(subtrees):
        members = subtrees == index
        intra[members] = normalise(rewards[members], eps=eps, std=std, singleton=singleton)
    return intra + inter


def treerl(tree: RolloutTree, *, leaf_normalise: bool = True) -> dict[int, float]:
    """TreeRL's process advantage of every turn ``n`` (docs/methods.md):
    ``(V(n) - V(root)) + (V(n) - V(parent(n)))`` with ``V`` the mean trajectory reward of the
    group's leaves below a node, divided by ``sqrt(|L(n)|)`` (the leaves below ``n``) when
    ``leaf_normalise``, treeroll's reading of the paper's leaf-level normalisation, which keeps
    a turn shared by many leaves from weighing many times over. Nodes with no leaf of the group
    below them (dropped branches) get no value."""
    group = leaves(tree)
    rewards = np.array(leaf_rewards(tree, group), dtype=np.float64)
    below = leaves_below(tree, group)
    if not below:
        return {}
    count = {i: len(members) for i, members in below.items()}
    value = {i: float(rewards[members].mean()) for i, members in below.items()}
    root = value[tree.root.id]
    out: dict[int, float] = {}
    for node in tree.nodes:
        if node.parent is None or node.id not in value:
            continue
        advantage = (value[node.id] - root) + (value[node.id] - value[node.parent.id])
        out[node.id] = advantage / np.sqrt(count[node.id]) if leaf_normalise else advantage
    return out


def arpo_hard(tree: RolloutTree, *, eps: float = 1e-6, std: str = "population",
              singleton: str = "zero") -> dict[int, float]:
    """ARPO's "hard" advantage (docs/methods.md): every turn gets the mean GRPO
    advantage of the group's leaves that share it (the leaves below its node), so a turn on
    one leaf's path alone keeps that leaf's GRPO advantage and a prefix shared by a winning
    and a losing leaf is pushed by their average, not once per leaf with opposite signs.
    ARPO's paper states the rule without code; the mean over the sharing leaves, each with
    GRPO's group-standardised advantage, is treeroll's reading. Nodes with no leaf of the
    group below them (dropped branches) get no value."""
    group = leaves(tree)
    advantage = normalise(np.array(leaf_rewards(tree, group)), eps=eps, std=std,
                          singleton=singleton)
    return {node_id: float(advantage[members].mean())
            for node_id, members in leaves_below(tree, group).items()
            if node_id != tree.root.id}


def gigpo(tree: RolloutTree, *, omega: float = 1.0, gamma: float = 0.95, eps: float = 1e-6,
          std: str = "population", singleton: str = "zero", anchor: str = "observation"
          ) -> list[np.ndarray]:
    """GiGPO (Feng et al. 2025, verl-agent; docs/methods.md) on a task's tree: per
    leaf, one value per turn ``t``: ``A_episode(leaf) + omega * A_step(leaf, t)``.

    ``A_episode`` is GRPO over the group's leaves. ``A_step`` groups the steps of all leaves
    by their *anchor state*, the observation the turn was taken from (its parent node's
    ``observation_text``, compared exactly as GiGPO hashes states), and standardises within
    each group the step's discounted return ``sum_k gamma^k r_(t+k)`` along the leaf. Every
    leaf is one trajectory of the group, so a turn shared by several leaves is a member of its
    step group once per leaf through it, each with that leaf's return: the same members as if
    the leaves had been sampled as independent chains, which is GiGPO's setting (its groups
    also gather states that separate trajectories reach again, a tree's siblings included).
    A state seen by one step only gets ``A_step = 0`` (``singleton="zero"``). The step
    returns are standardised (verl-agent's ``mean_std_norm``); ``omega=1`` and ``gamma=0.95``
    are treeroll's defaults.

    ``anchor="env_state"`` compares states by what the environment reports as
    ``info["anchor_state"]`` (verl-agent's ``anchor_obs``: the state without the prompt's
    counters, FrozenLake's cell) where a node has it, by the observation text elsewhere (the
    root: a reset reports no info, so a return to the start state does not join the root's
    group). On rLLM's FrozenLake the observation names the turn, so with ``"observation"``
    a cell reached at two different turns is two anchor states."""
    group = leaves(tree)
    episode = normalise(np.array(leaf_rewards(tree, group)), eps=eps, std=std,
                        singleton=singleton)
    if anchor not in ANCHORS:
        raise ValueError(f"gigpo anchor={anchor!r}; valid: {', '.join(ANCHORS)}")
    keys: dict[str, int] = {}
    members: list[tuple[int, int, int, float]] = []  # (anchor, leaf, turn, return)
    for index, leaf in enumerate(group):
        path = path_to(leaf)
        ret = 0.0
        for turn in range(len(path) - 1, 0, -1):
            ret = path[turn].reward + gamma * ret
            state = _anchor_key(path[turn - 1], anchor)
            members.append((keys.setdefault(state, len(keys)), index, turn - 1, ret))
    step = [np.zeros(leaf.depth) for leaf in group]
    anchors = np.array([m[0] for m in members], dtype=np.int64)
    returns = np.array([m[3] for m in members], dtype=np.float64)
    for key in range(len(keys)):
        chosen = np.flatnonzero(anchors == key)
        values = normalise(returns[chosen], eps=eps, std=std, singleton=singleton)
        for position, value in zip(chosen, values, strict=True):
            _, index, turn, _ = members[position]
            step[index][turn] = value
    return [episode[i] + omega * step[i] for i in range(len(group))]


ANCHORS = ("observation", "env_state")
"""How :func:`gigpo` compares states: the observation text, or the environment's
``info["anchor_state"]``."""


def _anchor_key(node: Node, anchor: str) -> str:
    """The state ``node``'s turn was taken from, as :func:`gigpo` compares them (prefixed so
    that an observation text never equals a reported state)."""
    if anchor == "env_state" and "anchor_state" in node.info:
        return f"state:{node.info['anchor_state']}"
    return f"text:{node.observation_text}"


def treepo(tree: RolloutTree, *, eps: float = 1e-6, std: str = "population") -> np.ndarray:
    """TreePO's subgroup advantage (docs/methods.md), one value per leaf.

    For every depth ``d`` at which a leaf's path has a node (the root, depth 0, is the whole
    group), the leaf's reward minus the mean reward of the group's leaves through that node;
    depths whose node has a single leaf below are skipped; the leaf's advantage is the mean
    over the remaining depths (0 when none remain), divided by the std of the group's
    advantages. treeroll's choice: TreePO whitens over the *batch*, but an estimator sees one
    task, so the whitening here is over the task's group (a group of identical advantages is
    left unscaled)."""
    group = leaves(tree)
    rewards = np.array(leaf_rewards(tree, group), dtype=np.float64)
    below = leaves_below(tree, group)
    out = np.zeros(len(group))
    for index, leaf in enumerate(group):
        terms = [rewards[index] - rewards[below[node.id]].mean()
                 for node in path_to(leaf) if len(below[node.id]) > 1]
        out[index] = float(np.mean(terms)) if terms else 0.0
    spread = out.std(ddof=1 if std == "sample" and len(out) > 1 else 0)
    return out / (spread + eps) if spread > 0 else out


def progress_conditioned(tree: RolloutTree, *, eps: float = 1e-6, std: str = "population",
                         singleton: str = "zero") -> np.ndarray:
    """Progress-conditioned GPO (docs/methods.md): plain GRPO, except when every leaf
    of the group has reward 0; then the leaves are ranked by observation coverage instead, so
    an all-failure group still carries a signal.

    treeroll's reading of "first-visit coverage" on a tree: a leaf's coverage is the number of
    distinct observations (``observation_text``) on its path that no other leaf's path
    reaches; observations on a shared prefix count for nobody. The coverages are then
    group-normalised like rewards."""
    group = leaves(tree)
    rewards = np.array(leaf_rewards(tree, group), dtype=np.float64)
    if len(group) == 0 or np.any(rewards != 0):
        return normalise(rewards, eps=eps, std=std, singleton=singleton)
    seen_by: dict[str, set[int]] = {}
    for index, leaf in enumerate(group):
        for node in path_to(leaf)[1:]:
            seen_by.setdefault(node.observation_text, set()).add(index)
    coverage = np.zeros(len(group))
    for indices in seen_by.values():
        if len(indices) == 1:
            coverage[next(iter(indices))] += 1
    return normalise(coverage, eps=eps, std=std, singleton=singleton)


def planpo(tree: RolloutTree, *, beta: float = 0.2, eps: float = 1e-6,
           std: str = "population", singleton: str = "zero") -> np.ndarray:
    """treeroll's reading of PlanPO's "planning-aware group optimisation" (only its abstract
    is public): GRPO on shaped rewards ``R' = R * (1 + beta * s)``, ``s`` in [0, 1] how much
    shorter (in turns) a leaf with ``R > 0`` is than the group's other rewarded leaves
    (``(T_max - T) / (T_max - T_min)``, 1 when they all took as many turns). Only rewarded
    leaves are shaped, and by at most ``1 + beta``, so a failure never gains by being short and
    a success always outranks a failure: the term cannot collapse into length minimisation."""
    group = leaves(tree)
    rewards = np.array(leaf_rewards(tree, group), dtype=np.float64)
    turns = np.array([leaf.depth for leaf in group], dtype=np.float64)
    rewarded = rewards > 0
    shaped = rewards.copy()
    if rewarded.any():
        low, high = turns[rewarded].min(), turns[rewarded].max()
        shortness = np.ones(len(group)) if high == low else (high - turns) / (high - low)
        shaped[rewarded] = rewards[rewarded] * (1.0 + beta * shortness[rewarded])
    return normalise(shaped, eps=eps, std=std, singleton=singleton)


def token_credit(tree: RolloutTree, credit: Any) -> list[float | np.ndarray]:
    """An estimator's credit as the trainer takes it, one entry per leaf in :func:`leaves`
    order: a float (one value for the whole leaf) or an array over the leaf's response tokens
    (a turn's value on its model tokens, 0 on environment tokens, which are not trained).

    ``credit`` is an array ``[num_leaves]``, a mapping ``node id -> value`` or a list of one
    array per leaf with one value per turn (see the module docstring)."""
    group = leaves(tree)
    if isinstance(credit, Mapping):
        missing = [n.id for leaf in group for n in path_to(leaf)[1:] if n.id not in credit]
        if missing:
            raise ValueError(f"per-turn credit has no value for node(s) {sorted(set(missing))}")
        return [_per_token(leaf, [float(credit[n.id]) for n in path_to(leaf)[1:]])
                for leaf in group]
    if isinstance(credit, np.ndarray) and credit.ndim == 1:
        if len(credit) != len(group):
            raise ValueError(f"per-leaf credit has {len(credit)} values for {len(group)} leaves")
        return [float(a) for a in credit]
    if isinstance(credit, Sequence) and len(credit) == len(group):
        out: list[float | np.ndarray] = []
        for leaf, turns in zip(group, credit, strict=True):
            values = np.asarray(turns, dtype=np.float64).reshape(-1)
            if len(values) != leaf.depth:
                raise ValueError(f"per-turn credit of leaf {leaf.id} has {len(values)} values "
                                 f"for {leaf.depth} turns")
            out.append(_per_token(leaf, values.tolist()))
        return out
    raise ValueError(f"an advantage estimator must return an array [{len(group)}], a mapping "
                     "node id -> value or one array of turn values per leaf; got "
                     f"{type(credit).__name__}")


def weighted(tree: RolloutTree, credit: list[float | np.ndarray]) -> list[float | np.ndarray]:
    """``credit`` (from :func:`token_credit`) times each leaf's ``info["sample_weight"]``, the
    weight a strategy that over-samples some prefixes records (IGRPO); 1 where none is."""
    out: list[float | np.ndarray] = []
    for leaf, value in zip(leaves(tree), credit, strict=True):
        weight = float(leaf.info.get("sample_weight", 1.0))
        out.append(value * weight if weight != 1.0 else value)
    return out


def _per_token(leaf: Node, turn_values: Sequence[float]) -> np.ndarray:
    """Turn values spread over the leaf's response tokens (the layout of
    :func:`treeroll.tree.export_trajectories`: each turn's action, then its observation except
    after the leaf's own turn)."""
    parts: list[np.ndarray] = []
    for node, value in zip(path_to(leaf)[1:], turn_values, strict=True):
        parts.append(np.full(len(node.action_ids), value))
        if node is not leaf:
            parts.append(np.zeros(len(node.observation_ids)))
    return np.concatenate(parts) if parts else np.zeros(0)


@dataclass(frozen=True)
class BatchBaseline:
    """SAO's baseline as treeroll reads it (docs/methods.md): with one rollout per
    task there is no group to compare with, so each leaf is compared with the *other tasks*
    of the batch: ``A = (R - mean of the rewards of the leaves of every other tree) /
    (std of all the batch's rewards + eps)``; 0 for a batch of one task. Leave-one-task-out
    keeps the baseline independent of the leaf it scores (no bias from its own reward)."""

    eps: float = 1e-6
    std: str = "population"

    def __post_init__(self) -> None:
        if self.std not in ("population", "sample") or self.eps < 0:
            raise ValueError(f"sao needs std 'population' or 'sample' and eps >= 0, got "
                             f"std={self.std!r}, eps={self.eps}")

    def __call__(self, tree: RolloutTree) -> np.ndarray:
        """Refused: this baseline needs the batch (:meth:`over_batch`)."""
        raise TypeError("the 'sao' estimator compares tasks with each other: it needs the "
                        "whole batch (over_batch), not one tree")

    def over_batch(self, trees: Sequence[RolloutTree]) -> list[np.ndarray]:
        """One array of leaf advantages per tree (:func:`treeroll.tree.leaves` order)."""
        rewards = [np.asarray(leaf_rewards(tree), dtype=float) for tree in trees]
        everything = np.concatenate(rewards) if rewards else np.zeros(0)
        ddof = 1 if self.std == "sample" else 0
        scale = (float(np.std(everything, ddof=ddof)) if everything.size > ddof else 0.0) \
            + self.eps
        total, count = float(everything.sum()), everything.size
        out = []
        for r in rewards:
            others = count - r.size
            if others == 0 or scale == 0.0:  # no other task to compare with, or all equal
                out.append(np.zeros(r.size))
            else:
                out.append((r - (total - float(r.sum())) / others) / scale)
        return out
