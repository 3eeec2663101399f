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

from treeroll.adapters.groups import EarlyForks, TreeGroups, rows_of
from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.config import TrainConfig
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.tree import leaves, path_to

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
    assert abs(rewarded_share(grown["repeat"]) - 1 / 8) < 0.035
    turns = np.mean([leaf.depth for g in grown["repeat"] for leaf in g.leaves])
    assert abs(turns - 1.75) < 0.12


def test_fork_last_over_represents_episodes_that_go_on(grown):
    # the second chance after an end: rows reach the reward far more often than episodes do
    assert rewarded_share(grown["fork_last"]) > 1 / 8 + 0.08


def test_repeat_groups_are_exactly_g_rows_with_ended_branches_repeated(grown):
    repeated = 0
    for group in grown["repeat"]:
        assert len(group.leaves) == 4 and group.topped_up == 0
        assert len(rows_of(group.tree)) == 4  # the tree holds every row, repeats included
        distinct = {leaf.id for leaf in group.leaves}
        repeated += len(group.leaves) - len(distinct)
        for leaf, row in zip(group.leaves, group.trajectories, strict=True):
            assert row.node_path == [n.id for n in path_to(leaf)]  # a repeat is its leaf's row
        if len(group.tree.root.children) == 1 and group.tree.root.children[0].ended:
            assert len(distinct) == 1  # a chain that ended at its first turn: one row, 4 times
    assert repeated > 0
    # repeats decode nothing: every row's turns were generated once, in the tree
    generated = sum(len(n.action_ids) for g in grown["repeat"] for n in g.tree.nodes)
    rows = sum(len(n.action_ids) for g in grown["repeat"] for leaf in g.leaves
               for n in path_to(leaf)[1:])
    assert generated < rows
    assert all(len(leaves(g.tree)) <= 4 for g in grown["repeat"])


def test_early_forks_on_end_must_be_a_known_rule():
    with pytest.raises(ValueError, match="on_end is 'again'; valid: 'fork_last', 'repeat'"):
        EarlyForks(on_end="again")
