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

import numpy as np

from treeroll.tree import RolloutTree, leaf_rewards, leaves, subtree_index

__all__ = ["dr_grpo", "grpo", "normalise", "rloo", "tree_advantage"]


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
