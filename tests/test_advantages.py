"""Advantage estimators on trees, against loops written from the formulas."""

from __future__ import annotations

import numpy as np
import pytest

from treeroll import advantages
from treeroll.plugins import ADVANTAGES
from treeroll.tree import NodeStatus, RolloutTree, leaves


def _tree(structure: list[list[float]]) -> RolloutTree:
    """A root with one subtree per entry; subtree j branches once into len(entry) leaves with
    those rewards (a single-leaf subtree is a chain)."""
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1, 2], prompt_text="p")
    for rewards in structure:
        trunk = tree.add_child(tree.root, action_ids=[3], status=NodeStatus.EXPANDED)
        for r in rewards:
            tree.add_child(trunk, action_ids=[4], reward=r, terminated=True,
                           status=NodeStatus.TERMINAL)
    return tree


def test_grpo_matches_formula() -> None:
    tree = _tree([[1.0, 0.0], [0.0], [1.0, 1.0, 0.0]])
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(advantages.grpo(tree), (r - r.mean()) / (r.std() + 1e-6))
    np.testing.assert_allclose(advantages.dr_grpo(tree), r - r.mean())
    loo = np.array([r[i] - np.delete(r, i).mean() for i in range(len(r))])
    np.testing.assert_allclose(advantages.rloo(tree), loo)


def test_tree_is_intra_plus_inter() -> None:
    tree = _tree([[1.0, 0.0], [0.0], [1.0, 1.0, 0.0]])
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    inter = (r - r.mean()) / (r.std() + 1e-6)
    intra = np.zeros(6)
    for members in ([0, 1], [3, 4, 5]):
        g = r[members]
        intra[members] = (g - g.mean()) / (g.std() + 1e-6)
    np.testing.assert_allclose(advantages.tree_advantage(tree), intra + inter)
    verl = advantages.tree_advantage(tree, singleton="verl")
    assert verl[2] == pytest.approx(inter[2] + 0.0)  # reward 0 alone: R = 0 either way


def test_branching_factor_one_gives_chain_grpo() -> None:
    """A tree that never branches (M chains, no expansion) is exactly chain GRPO."""
    tree = _tree([[1.0], [0.0], [0.0], [1.0], [1.0]])
    np.testing.assert_array_equal(advantages.tree_advantage(tree), advantages.grpo(tree))


def test_dropped_leaves_leave_the_group() -> None:
    tree = _tree([[1.0, 0.0, 1.0]])
    leaves(tree)[0].status = NodeStatus.DROPPED
    assert len(advantages.grpo(tree)) == 2


def test_constant_group_has_zero_advantage_and_registry() -> None:
    tree = _tree([[1.0, 1.0], [1.0]])
    for name in ("grpo", "dr_grpo", "rloo", "tree"):
        np.testing.assert_allclose(ADVANTAGES.get(name)(tree), 0.0, atol=1e-9)
    with pytest.raises(ValueError, match="valid: dr_grpo, grpo, rloo, tree"):
        ADVANTAGES.get("nope")
