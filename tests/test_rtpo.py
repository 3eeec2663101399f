"""RTPO's sparse reverse trees: which node each reverse round branches from (#12)."""

from __future__ import annotations

import pytest

from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.strategies.rtpo import RTPO
from treeroll.tree import NodeStatus, leaves, path_to

from .conftest import ScriptedBackend

MOVES = ["Up", "Down", "Left", "Right"]


def _first_line_leaf(chain):  # type: ignore[no-untyped-def]
    node = chain
    while node.children:
        node = node.children[0]
    return node


@pytest.mark.parametrize("synchronous", [True, False])
def test_reverse_rounds_branch_from_the_last_decision_points_first(byte_format,
                                                                   synchronous) -> None:
    # Right, Right, ... from a scripted backend: first-wave chains of several turns.
    batch = rollout([3, 4], lambda: make_frozenlake("rllm", size_min=5, size_max=6),
                    ScriptedBackend(["Down", "Right"]), byte_format, RTPO(m=6, initial=2),
                    config=RolloutConfig(synchronous=synchronous), seed=0)
    for tree in batch.trees:
        assert len(leaves(tree)) == 6  # 2 chains + 2 branches in each of 2 reverse rounds
        assert all(leaf.status in NodeStatus.STOPPED for leaf in leaves(tree))
        for chain in tree.root.children[:2]:
            line = path_to(_first_line_leaf(chain))
            assert len(line) >= 4
            # Round 1 branched from the node above the leaf, round 2 from the one above that.
            rounds = {node.note: node for node in line if node.note.startswith("RTPO")}
            assert rounds["RTPO reverse round 1"] is line[-2]
            assert rounds["RTPO reverse round 2"] is line[-3]
            assert len(line[-2].children) == 2 and len(line[-3].children) == 2


def test_the_last_reverse_round_is_cut_to_the_leaves_left(byte_format) -> None:
    batch = rollout([0, 1, 2], lambda: make_frozenlake("rllm", size_min=5, size_max=6),
                    ScriptedBackend(["Up", "Left"]), byte_format, RTPO(m=5, initial=2), seed=0)
    for tree in batch.trees:
        assert len(leaves(tree)) == 5
        notes = [n.note for n in tree.nodes if n.note.startswith("RTPO")]
        # 2 chains, round 1 branches both, round 2 has room for one: the first chain's.
        assert sorted(notes) == ["RTPO reverse round 1"] * 2 + ["RTPO reverse round 2"]
        first_line = path_to(_first_line_leaf(tree.root.children[0]))
        assert first_line[-3].note == "RTPO reverse round 2"
