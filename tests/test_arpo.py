"""ARPO / AEPO: when a branch fires after an observation, and that the budget holds (#12)."""

from __future__ import annotations

import numpy as np
import pytest

from treeroll.base import StrategyContext
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.strategies.arpo import ARPO
from treeroll.tree import NodeStatus, RolloutTree, leaves, path_to

from .conftest import ScriptedBackend


def _chain(entropies: list[float]) -> tuple[RolloutTree, list]:
    """A root and one trajectory whose turns have these entropies (each still active, as
    the turns a strategy is handed are)."""
    tree = RolloutTree.new(0, 0, 0, prompt_ids=[1], prompt_text="p")
    nodes, parent = [], tree.root
    for h in entropies:
        parent = tree.add_child(parent, action_ids=[3], entropy=h, status=NodeStatus.ACTIVE)
        nodes.append(parent)
    return tree, nodes


def test_branch_probability_is_alpha_plus_beta_times_the_entropy_rise() -> None:
    _, nodes = _chain([0.2, 0.7, 0.1])
    arpo = ARPO(alpha=0.5, beta=0.4)
    assert arpo.branch_probability(nodes[1]) == pytest.approx(0.5 + 0.4 * 0.5)
    assert arpo.branch_probability(nodes[2]) == pytest.approx(0.5 - 0.4 * 0.1)
    assert ARPO(alpha=0.9, beta=1.0).branch_probability(nodes[1]) == 1.0  # clipped


def test_aepo_penalises_consecutive_branch_points() -> None:
    tree, nodes = _chain([0.2, 0.2, 0.2, 0.2])
    # Two branch points right above the last turn: its parent and grandparent.
    tree.add_child(nodes[1], action_ids=[4], status=NodeStatus.TERMINAL, terminated=True)
    tree.add_child(nodes[2], action_ids=[4], status=NodeStatus.TERMINAL, terminated=True)
    aepo = ARPO(alpha=0.5, beta=0.0, aepo_gamma=0.2)
    assert aepo.branch_probability(nodes[3]) == pytest.approx(0.5 * (1 - 0.2 * 2))
    assert ARPO(alpha=0.5, beta=0.0).branch_probability(nodes[3]) == pytest.approx(0.5)


def test_a_branch_fires_only_after_an_observation_and_within_the_partial_budget() -> None:
    tree, nodes = _chain([0.1, 0.9])
    arpo = ARPO(m=3, initial=2, beam=2, alpha=1.0, beta=0.0)
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    arpo.start(tree, ctx)
    assert ctx.state.partial_left == 1
    # The first turn follows the task, not an observation: it never branches.
    assert arpo.step(tree, [nodes[0]], ctx) == [nodes[0]]
    # The second does (p = 1): it continues and its observation (its parent) gets a sibling.
    assert arpo.step(tree, [nodes[1]], ctx) == [nodes[1], nodes[0]]
    assert ctx.state.partial_left == 0
    assert arpo.step(tree, [nodes[1]], ctx) == [nodes[1]]  # budget spent: no more branches
    never = ARPO(m=3, initial=2, alpha=0.0, beta=0.0)
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    never.start(tree, ctx)
    assert never.step(tree, [nodes[1]], ctx) == [nodes[1]]


@pytest.mark.parametrize(("alpha", "synchronous"), [(1.0, True), (0.0, True), (1.0, False)])
def test_arpo_rollout_ends_with_exactly_m_leaves_branches_or_top_up(
        byte_format, alpha, synchronous) -> None:
    moves = ["Up", "Down", "Left", "Right"]
    arpo = ARPO(m=6, initial=2, alpha=alpha, beta=0.0)
    batch = rollout([0, 1, 2], lambda: make_frozenlake("rllm", size_min=4, size_max=5),
                    ScriptedBackend(moves, choose_by_seed=True), byte_format, arpo,
                    config=RolloutConfig(synchronous=synchronous), seed=0)
    for tree in batch.trees:
        group = leaves(tree)
        assert len(group) == 6
        for leaf in group:  # every branch replays: its observations are its own actions'
            env = make_frozenlake("rllm", size_min=4, size_max=5)
            env.reset(seed=tree.task_seed)
            for node in path_to(leaf)[1:]:
                assert env.step(node.action_text)[0].strip() == node.observation_text.strip()
        assert all(leaf.status in NodeStatus.STOPPED for leaf in group)
        root_chains = len(tree.root.children)
        if alpha == 0.0:  # nothing fires: the two chains, then four from the top-up
            assert root_chains == 6
        else:  # a branch fires at the first observation whenever the budget allows
            assert root_chains < 6
            assert any(len(n.children) > 1 for n in tree.nodes if n.parent is not None)
