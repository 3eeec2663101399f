"""IGRPO as treeroll defines it: which node is expanded next, suppression, weights (#12)."""

from __future__ import annotations

import numpy as np
import pytest

from treeroll.base import StrategyContext
from treeroll.credit.estimators import grpo, token_credit, weighted
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.strategies.igrpo import IGRPO, beta_gain
from treeroll.tree import NodeStatus, RolloutTree, leaves

from .conftest import ScriptedBackend


def _variance(a: float, b: float) -> float:
    return a * b / ((a + b) ** 2 * (a + b + 1))


def test_beta_gain_is_the_expected_variance_drop_of_one_more_outcome() -> None:
    # Beta(2, 3) (one success, two failures): p = 0.4 of moving to Beta(3, 3), else Beta(2, 4).
    expected = _variance(2, 3) - (0.4 * _variance(3, 3) + 0.6 * _variance(2, 4))
    assert beta_gain(1, 2) == pytest.approx(expected)
    assert beta_gain(0, 0) > beta_gain(5, 5) > beta_gain(50, 50) > 0  # more known, less gain


def _two_chains() -> tuple[RolloutTree, list]:
    """Root -> a -> {win, loss} and root -> b -> loss: node a has mixed outcomes below it."""
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="p")
    a = tree.add_child(tree.root, action_ids=[3], status=NodeStatus.EXPANDED)
    b = tree.add_child(tree.root, action_ids=[3], status=NodeStatus.EXPANDED)
    win = tree.add_child(a, action_ids=[4], reward=1.0, terminated=True,
                         status=NodeStatus.TERMINAL)
    loss = tree.add_child(a, action_ids=[5], terminated=True, status=NodeStatus.TERMINAL)
    lost = tree.add_child(b, action_ids=[5], terminated=True, status=NodeStatus.TERMINAL)
    return tree, [a, b, win, loss, lost]


def test_the_highest_gain_node_is_expanded_next_and_ended_turns_never() -> None:
    tree, (a, b, *_ends) = _two_chains()
    igrpo = IGRPO(m=5, per_round=1)
    gains = igrpo.gains(tree)
    # root: 1 success of 3 leaves, times 3; a: 1 of 2, times 2; b: 0 of 1, times 1.
    assert gains[tree.root.id] == pytest.approx(beta_gain(1, 2) * 3)
    assert gains[a.id] == pytest.approx(beta_gain(1, 1) * 2)
    assert gains[b.id] == pytest.approx(beta_gain(0, 1) * 1)
    assert set(gains) == {tree.root.id, a.id, b.id}  # the ended turns cannot be expanded
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    igrpo.start(tree, ctx)
    best = max(gains, key=lambda i: gains[i])
    assert igrpo.step(tree, [], ctx) == [tree.nodes[best]]
    # A threshold above every gain suppresses them all: nothing is expanded.
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    shy = IGRPO(m=5, threshold=1.0)
    shy.start(tree, ctx)
    assert shy.step(tree, [], ctx) == []
    assert ctx.state.suppressed == {tree.root.id, a.id, b.id}


def test_unbiased_weights_are_the_nested_average_and_scale_the_advantages() -> None:
    tree, (_a, _b, win, loss, lost) = _two_chains()
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    IGRPO(m=3).finish(tree, ctx)
    # Nested average: win and loss share a's half (1/4 each), lost has b's half (1/2);
    # normalised to mean 1 over the three leaves: 3/4, 3/4, 3/2.
    assert [leaf.info["sample_weight"] for leaf in (win, loss, lost)] == pytest.approx(
        [0.75, 0.75, 1.5])
    credit = weighted(tree, token_credit(tree, grpo(tree)))
    np.testing.assert_allclose(credit, grpo(tree) * np.array([0.75, 0.75, 1.5]))
    IGRPO(m=3, weights="teacher").finish(tree, ctx)
    assert [leaf.info["sample_weight"] for leaf in leaves(tree)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("synchronous", [True, False])
def test_igrpo_rollout_spends_m_leaves_and_weighs_every_leaf(byte_format, synchronous) -> None:
    """Also under a token budget that ends the rollout early: ``finish`` weighs the leaves."""
    batch = rollout([0, 1, 2], lambda: make_frozenlake("rllm", size_min=3, size_max=4),
                    ScriptedBackend(["Up", "Down", "Left", "Right"], choose_by_seed=True),
                    byte_format, IGRPO(m=6, initial=2, per_round=2),
                    config=RolloutConfig(synchronous=synchronous), seed=0)
    for tree in batch.trees:
        group = leaves(tree)
        assert len(group) == 6
        weights = [leaf.info["sample_weight"] for leaf in group]
        assert np.mean(weights) == pytest.approx(1.0)
        assert any(n.note.startswith("IGRPO gain") for n in tree.nodes)
    cut = rollout([0], lambda: make_frozenlake("rllm", size_min=3, size_max=4),
                  ScriptedBackend(["Up", "Down", "Left", "Right"], choose_by_seed=True),
                  byte_format, IGRPO(m=6, initial=2),
                  config=RolloutConfig(max_generated_tokens=30, synchronous=synchronous),
                  seed=0)
    assert all("sample_weight" in leaf.info for leaf in leaves(cut.trees[0]))
