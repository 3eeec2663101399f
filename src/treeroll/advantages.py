"""Advantage estimators over one task's tree (its leaves are the group).

All share one signature, :data:`treeroll.base.AdvantageEstimator`: ``estimator(tree, *,
hyper-parameters) -> np.ndarray [num_leaves]`` in :func:`treeroll.tree.leaves` order.
:func:`treeroll.plugins.make_estimator` binds the hyper-parameters of ``AdvantageConfig``.

* ``grpo``: ``(R - mean R) / (std R + eps)`` over the group.
* ``dr_grpo``: ``R - mean R`` (Dr. GRPO drops the std).
* ``rloo``: ``R_i - mean_{j != i} R_j``.
* ``tree`` (:func:`tree_advantage`): Tree-GRPO's ``A_intra + A_inter``: GRPO within each
  first-level subtree (the M trees of a task, :func:`treeroll.tree.subtree_index`) plus GRPO
  over all leaves of the task.
* ``treerl`` (:func:`treerl`): TreeRL's per-node process advantage, one value per turn
  (credit per token: every leaf through a turn gives that turn's tokens the same value).

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
from typing import Any

import numpy as np

from treeroll.tree import Node, RolloutTree, leaf_rewards, leaves, path_to, subtree_index

__all__ = ["dr_grpo", "grpo", "normalise", "rloo", "token_credit", "tree_advantage", "treerl"]


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
    """TreeRL's process advantage of every turn ``n`` (ALGORITHMS.md section 7):
    ``(V(n) - V(root)) + (V(n) - V(parent(n)))`` with ``V`` the mean trajectory reward of the
    group's leaves below a node, divided by ``sqrt(|L(n)|)`` (the leaves below ``n``) when
    ``leaf_normalise``, treeroll's reading of the paper's leaf-level normalisation, which keeps
    a turn shared by many leaves from weighing many times over. Nodes with no leaf of the group
    below them (dropped branches) get no value."""
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for leaf, reward in zip(leaves(tree), leaf_rewards(tree), strict=True):
        for node in path_to(leaf):
            total[node.id] = total.get(node.id, 0.0) + reward
            count[node.id] = count.get(node.id, 0) + 1
    if not count:
        return {}
    value = {i: total[i] / count[i] for i in count}
    root = value[tree.root.id]
    out: dict[int, float] = {}
    for node in tree.nodes:
        if node.parent is None or node.id not in value:
            continue
        advantage = (value[node.id] - root) + (value[node.id] - value[node.parent.id])
        out[node.id] = advantage / np.sqrt(count[node.id]) if leaf_normalise else advantage
    return out


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
