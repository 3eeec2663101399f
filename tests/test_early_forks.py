"""EarlyForks' rows as samples of the policy: ``on_end="repeat"`` keeps each row an unbiased
sample of the policy's episodes, ``"fork_last"`` (a second chance after an end) does not.

A coin-flip environment and a backend that answers ``stop`` or ``go`` by each request's seed:
an episode ends at the first ``stop`` (reward 0) or after three ``go`` (reward 1), so a
policy episode is rewarded with probability 1/8 and lasts 1.75 turns on average.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from treeroll.adapters.tree_groups import TreeGroups, choose_leaves, rows_of
from treeroll.base import Completion, GenerationRequest, SamplingParams, StrategyContext
from treeroll.config import TrainConfig
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.strategies import EarlyForks
from treeroll.strategies.early_forks import REPEATS
from treeroll.tree import NodeStatus, RolloutTree, leaves, path_to

EOS = ByteTokenizer.eos_token_id


class CoinBackend:
    """``stop`` or ``go`` by the parity of each request's seed."""

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        out = []
        for request in requests:
            ids = [*ByteTokenizer().encode(("stop", "go")[(request.seed or 0) % 2]), EOS]
            out.append(Completion(ids, [-0.7] * len(ids), "stop",
                                  prefill_tokens=len(request.prompt_ids)))
        return out

    def reset_cache(self) -> None:
        pass


class CoinEnv:
    """Ends at the first ``stop`` (reward 0) or after three ``go`` (reward 1)."""

    system_prompt = "coin"

    def __init__(self) -> None:
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.turn = 0
        return f"task {seed}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action != "go":
            return "stopped", 0.0, True, False, {"success": False}
        self.turn += 1
        done = self.turn >= 3
        return f"turn {self.turn}", float(done), done, False, {"success": done}

    def fork(self) -> CoinEnv:
        return copy.deepcopy(self)


def grow(on_end: str, tasks: int = 600, group_size: int = 4) -> list[Any]:
    config = TrainConfig()
    config = replace(config, strategy=replace(config.strategy, name="chain"))
    groups = TreeGroups(config, TurnFormat(ByteTokenizer()), group_size=group_size,
                        make_env=CoinEnv,
                        shape=EarlyForks(group_size=group_size, within=2, on_end=on_end))
    return groups.grow_on(CoinBackend(), list(range(tasks)), seed=3)


@pytest.fixture(scope="module")
def grown() -> dict[str, list[Any]]:
    return {on_end: grow(on_end) for on_end in EarlyForks.ON_END}


def rewarded_share(groups: list[Any]) -> float:
    return float(np.mean([r for g in groups for r in g.rewards]))


def test_repeat_rows_are_rewarded_as_often_as_policy_episodes(grown):
    # each row on its own is a policy episode: rewarded with probability 1/8
    assert abs(rewarded_share(grown["repeat"]) - 1 / 8) < 0.02
    turns = np.mean([leaf.depth for g in grown["repeat"] for leaf in g.leaves])
    assert abs(turns - 1.75) < 0.1


def test_fork_last_over_represents_episodes_that_go_on(grown):
    # the second chance after an end: rows reach the reward far more often than episodes do
    assert rewarded_share(grown["fork_last"]) > 0.2


def test_repeat_groups_are_exactly_g_rows_with_ended_branches_repeated(grown):
    repeated = 0
    for group in grown["repeat"]:
        assert len(group.leaves) == 4 and group.topped_up == 0
        assert len(rows_of(group.tree)) == 4  # the tree holds every row, repeats included
        distinct = {leaf.id for leaf in group.leaves}
        repeated += len(group.leaves) - len(distinct)
        tree_leaves = leaves(group.tree)
        assert len(tree_leaves) + sum(n.info.get(REPEATS, 0) for n in tree_leaves) == 4
        assert len(distinct) == len(tree_leaves)  # each leaf, repeated or not, is handed over
        for leaf, row in zip(group.leaves, group.trajectories, strict=True):
            assert row.node_path == [n.id for n in path_to(leaf)]  # a repeat is its leaf's row
        if len(group.tree.root.children) == 1 and group.tree.root.children[0].ended:
            assert len(distinct) == 1  # a chain that ended at its first turn: one row, 4 times
    assert repeated > 0
    # repeats decode nothing: a tree holds only the nodes on its distinct leaves' paths
    for group in grown["repeat"]:
        on_paths = {n.id for leaf in leaves(group.tree) for n in path_to(leaf)}
        assert on_paths == {n.id for n in group.tree.nodes}


def test_early_forks_on_end_must_be_a_known_rule():
    with pytest.raises(ValueError, match="on_end is 'again'; valid: 'fork_last', 'repeat'"):
        EarlyForks(on_end="again")


def test_choose_leaves_counts_a_repeated_leaf_once_per_row():
    tree = RolloutTree.new(0, 0, 0, [], "root")
    a, b = tree.add_child(tree.root, action_text="a"), tree.add_child(tree.root, action_text="b")
    for node in (a, b):
        node.status, node.terminated = NodeStatus.TERMINAL, True
    a.info[REPEATS] = 2
    assert [n.id for n in rows_of(tree)] == [a.id, a.id, a.id, b.id]
    assert [n.id for n in choose_leaves(tree, 4)] == [a.id, a.id, a.id, b.id]
    assert sorted(n.id for n in choose_leaves(tree, 2)) == [a.id, b.id]  # one per subtree


@pytest.mark.parametrize("on_end", EarlyForks.ON_END)
def test_a_failed_branch_is_never_repeated_and_forks_again_only_under_fork_last(on_end):
    shape = EarlyForks(group_size=4, within=2, on_end=on_end)
    tree = RolloutTree.new(0, 0, 0, [], "root")
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=4, tokens_left=None)
    assert shape.start(tree, ctx) == [tree.root]
    failed = tree.add_child(tree.root, action_text="boom")
    failed.status = NodeStatus.FAILED
    frontier = shape.step(tree, [failed], ctx)
    assert REPEATS not in failed.info  # a failed row is not handed over, nor repeated
    # fork_last retries the move from the root for the 3 rows owed; repeat leaves all 4 rows
    # to the adapter's top-up (fresh chains)
    assert frontier == ([tree.root] if on_end == "fork_last" else [])


def test_early_forks_is_a_registered_strategy_a_run_names_with_its_settings():
    """Registered like every strategy: ``--strategy.name early_forks`` and its block
    ``strategy.early_forks.*`` grow a tree of exactly ``group_size`` rows outside the
    adapters too (it lived in ``adapters/tree_groups.py``, unregistered, before)."""
    from dataclasses import replace

    from treeroll.cli.one_tree import build_one_tree
    from treeroll.config import TrainConfig
    from treeroll.strategies import STRATEGIES

    assert STRATEGIES.get("early_forks") is EarlyForks
    config = TrainConfig()
    config.strategy = replace(config.strategy, name="early_forks",
                              early_forks=EarlyForks(group_size=6, chains=2))
    config.rollout = replace(config.rollout, max_turn_tokens=24)
    tree = build_one_tree(config, task_seed=3)
    assert tree.meta["strategy"] == "early_forks" and len(rows_of(tree)) == 6
