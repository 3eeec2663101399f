"""Advantage estimators over one task's tree (its leaves are the group).

All share one signature, :data:`treeroll.base.AdvantageEstimator`: ``estimator(tree, *,
hyper-parameters) -> np.ndarray [num_leaves]`` in :func:`treeroll.tree.leaves` order.

* ``grpo``: ``(R - mean R) / (std R + eps)`` over the group (population std, as GRPO).
* ``dr_grpo``: ``R - mean R`` (Dr. GRPO drops the std).
* ``rloo``: ``R_i - mean_{j != i} R_j``.
* ``tree`` (:func:`tree_advantage`): Tree-GRPO's ``A_intra + A_inter``: GRPO within each
  first-level subtree (the M
  trees of a task) plus GRPO over all leaves of the task.

treeroll's choice for groups of one (the Tree-GRPO paper inherits verl's mean 0, std 1, which
makes a lone leaf's advantage its raw reward): ``singleton="zero"`` (default) gives a group of
one advantage 0, so a tree that never branches gets exactly chain GRPO's advantages;
``singleton="verl"`` reproduces verl.
"""

from __future__ import annotations

import numpy as np

from treeroll.tree import RolloutTree, leaf_rewards, leaves, subtree_index

__all__ = ["dr_grpo", "grpo", "normalise", "rloo", "tree_advantage"]


def normalise(rewards: np.ndarray, *, scale: bool = True, eps: float = 1e-6,
              singleton: str = "zero") -> np.ndarray:
    """Group-normalised advantages of one group's rewards (shape ``[n]``)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.size == 0:
        return rewards
    if rewards.size == 1:
        if singleton == "verl":
            return rewards.copy()
        if singleton != "zero":
            raise ValueError(f"singleton must be 'zero' or 'verl', got {singleton!r}")
        return np.zeros(1)
    centred = rewards - rewards.mean()
    return centred / (rewards.std() + eps) if scale else centred


def grpo(tree: RolloutTree, *, eps: float = 1e-6) -> np.ndarray:
    """GRPO: rewards standardised over the task's group."""
    return normalise(np.array(leaf_rewards(tree)), eps=eps)


def dr_grpo(tree: RolloutTree) -> np.ndarray:
    """Dr. GRPO: rewards centred on the group mean, not divided by the std."""
    return normalise(np.array(leaf_rewards(tree)), scale=False)


def rloo(tree: RolloutTree) -> np.ndarray:
    """REINFORCE leave-one-out: each reward minus the mean of the others."""
    rewards = np.array(leaf_rewards(tree), dtype=np.float64)
    n = rewards.size
    if n < 2:
        return np.zeros(n)
    return rewards - (rewards.sum() - rewards) / (n - 1)


def tree_advantage(tree: RolloutTree, *, eps: float = 1e-6, singleton: str = "zero") -> np.ndarray:
    """Tree-GRPO: intra-subtree GRPO plus inter (whole-task) GRPO."""
    group = leaves(tree)
    rewards = np.array(leaf_rewards(tree, group), dtype=np.float64)
    inter = normalise(rewards, eps=eps, singleton=singleton)
    intra = np.zeros_like(rewards)
    subtrees = np.array([subtree_index(tree, leaf) for leaf in group])
    for index in np.unique(subtrees):
        members = subtrees == index
        intra[members] = normalise(rewards[members], eps=eps, singleton=singleton)
    return intra + inter
