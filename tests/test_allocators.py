"""VIGOR: which task gets more rollouts, and that a batch never spends more than the uniform
budget it redistributes (issue #12)."""

from __future__ import annotations

import pytest

from treeroll.engine import RolloutConfig, make_allocator, rollout
from treeroll.engine.allocators import AllocatorConfig, Vigor, VigorConfig
from treeroll.envs import make_frozenlake
from treeroll.strategies import Chain
from treeroll.tree import NodeStatus, RolloutTree, leaves

from .conftest import ScriptedBackend


def _grow(tree: RolloutTree, rewards: list[float]) -> None:
    for r in rewards:
        tree.add_child(tree.root, action_ids=[3], reward=r, terminated=True,
                       status=NodeStatus.TERMINAL)


def test_vigor_doubles_the_highest_variance_tasks_and_deals_the_rest() -> None:
    trees = [RolloutTree.new(i, i, i, prompt_ids=[1], prompt_text="p") for i in range(4)]
    vigor = Vigor(VigorConfig(m0=2, rounds=4, alpha=0.5, gamma=2), group=8)
    assert [b.leaves for b in vigor.start(trees)] == [2, 2, 2, 2]
    for tree, rewards in zip(trees, [[1, 0], [1, 1], [0, 0], [1, 0]], strict=True):
        _grow(tree, rewards)
    # Round 2: tasks 0 and 3 have variance, 1 and 2 none: the top half is {0, 3}, doubled.
    first = vigor.grant(trees, range(4))
    assert {t: b.leaves for t, b in first.items()} == {0: 2, 3: 2}
    _grow(trees[0], [1, 1])  # task 0: [1, 0, 1, 1], variance 0.1875
    _grow(trees[3], [0, 1])  # task 3: [1, 0, 0, 1], variance 0.25: ranks first now
    second = vigor.grant(trees, range(4))
    assert {t: b.leaves for t, b in second.items()} == {3: 4}
    _grow(trees[3], [1, 1, 1, 0])
    third = vigor.grant(trees, range(4))
    assert {t: b.leaves for t, b in third.items()} == {3: 8}
    _grow(trees[3], [1] * 8)
    # Round 4 is the last: the 8 leaves left of 4 x 8 go one at a time by variance.
    rest = vigor.grant(trees, range(4))
    assert sum(b.leaves for b in rest.values()) == 32 - 2 * 4 - 4 - 4 - 8
    assert vigor.grant(trees, range(4)) == {}
    assert sum(vigor.counts) == 32


def test_vigor_with_no_variance_anywhere_spreads_the_budget_evenly() -> None:
    trees = [RolloutTree.new(i, i, i, prompt_ids=[1], prompt_text="p") for i in range(3)]
    vigor = Vigor(VigorConfig(m0=2), group=4, tokens=100)
    vigor.start(trees)
    for tree in trees:
        _grow(tree, [0, 0])
    grants = vigor.grant(trees, range(3))
    assert {t: (b.leaves, b.tokens) for t, b in grants.items()} == {
        0: (2, 50), 1: (2, 50), 2: (2, 50)}
    assert vigor.grant(trees, range(3)) == {}


def test_vigor_rollout_spends_exactly_the_uniform_leaves(byte_format) -> None:
    moves = ["Up", "Down", "Left", "Right"]
    config = RolloutConfig(max_leaves=6)
    allocator = make_allocator(AllocatorConfig(name="vigor"), config)
    assert isinstance(allocator, Vigor)
    batch = rollout(list(range(5)), lambda: make_frozenlake("rllm", size_min=3, size_max=4),
                    ScriptedBackend(moves, choose_by_seed=True), byte_format,
                    Chain(group_size=6), config=config, allocator=allocator, seed=0)
    counts = [len(leaves(t)) for t in batch.trees]
    assert sum(counts) == 5 * 6
    assert counts == allocator.counts
    assert all(leaf.status in NodeStatus.STOPPED for t in batch.trees for leaf in leaves(t))


def test_vigor_without_a_leaf_budget_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match=r"--rollout\.max-leaves"):
        make_allocator(AllocatorConfig(name="vigor"), RolloutConfig())
    with pytest.raises(ValueError, match="m0 = 9"):
        make_allocator(AllocatorConfig(name="vigor", vigor=VigorConfig(m0=9)),
                       RolloutConfig(max_leaves=8))
    with pytest.raises(ValueError, match="unknown allocator 'nope'; valid: uniform, vigor"):
        make_allocator(AllocatorConfig(name="nope"), RolloutConfig())
