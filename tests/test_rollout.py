"""The rollout engine, the tree record, its accounting and export, chain and Tree-GRPO."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import pytest

from treeroll.backends.hf import HFBackend
from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.credit import estimators as advantages
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.strategies import Chain, TreeGRPO
from treeroll.tree import (
    NodeStatus,
    RolloutTree,
    TokenCounts,
    context_ids,
    export_trajectories,
    leaves,
    path_to,
    subtree_index,
    token_counts,
)
from treeroll.tree_json import load_tree, save_tree

from .conftest import ScriptedBackend

MOVES = ["```Right```", "```Down```", "```Left```", "```Up```"]


def _env():  # type: ignore[no-untyped-def]
    return make_frozenlake("rllm", size_min=5, size_max=7)


class RecordingBackend:
    """Wraps a backend and remembers every request and completion (token-in/token-out)."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.log: list[tuple[tuple[int, ...], list[int]]] = []

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        out = self.inner.generate(requests, params)
        self.log.extend((r.prompt_ids, c.token_ids) for r, c in zip(requests, out, strict=True))
        return out

    def reset_cache(self) -> None:
        self.inner.reset_cache()


def test_token_in_token_out_with_a_real_tokenizer(tiny_model, word_tokenizer) -> None:
    """The ids in the tree are exactly the ids the backend was fed and sampled; a node's
    context is a concatenation, never decode + re-encode (which would differ here)."""
    backend = RecordingBackend(HFBackend(tiny_model))
    fmt = TurnFormat(word_tokenizer)
    batch = rollout([3, 4], _env, backend, fmt, TreeGRPO(m=2, n=2, l=1),
                    config=RolloutConfig(max_turn_tokens=6), seed=0)
    sampled = {(prompt, tuple(tokens)) for prompt, tokens in backend.log}
    checked = 0
    for tree in batch.trees:
        for node in tree.nodes[1:]:
            assert node.parent is not None
            assert (tuple(context_ids(node.parent)), tuple(node.action_ids)) in sampled
            assert len(node.action_logprobs) == len(node.action_ids)
            checked += 1
    assert checked > 4
    # A history rebuilt from the turns' text (what environments see: special tokens dropped)
    # would not reproduce the ids: the end-of-turn ids the model sampled are gone.
    leaf = leaves(batch.trees[0])[0]
    history = context_ids(leaf)
    text = word_tokenizer.decode(history, skip_special_tokens=True)
    assert word_tokenizer.encode(text, add_special_tokens=False) != history


def test_identical_greedy_chains_are_computed_once_and_counted_so(tiny_model,
                                                                   word_tokenizer) -> None:
    """Four greedy chains of a task are one chain four times: the HF backend computes them
    as one (its forward count equals one chain's), and the trees' accounting says so:
    ``computed`` equals the lone chain's, ``forwarded`` equals what the backend fed, and
    every later chain's turns are whole-reply duplicates."""
    fmt = TurnFormat(word_tokenizer)
    greedy = RolloutConfig(max_turn_tokens=6, temperature=0.0)
    runs = {}
    for group in (1, 4):
        backend = HFBackend(tiny_model)
        batch = rollout([3, 4], _env, backend, fmt, Chain(group_size=group), config=greedy,
                        seed=0)
        runs[group] = (backend.stats["forward_tokens"],
                       sum((token_counts(t) for t in batch.trees), TokenCounts()))
    (one_fed, one), (four_fed, four) = runs[1], runs[4]
    assert four_fed == one_fed and four.forwarded == four_fed and one.forwarded == one_fed
    assert four.computed == one.computed and four.generated == 4 * one.generated
    assert four.shared == 3 * one.generated and four.duplicates == 3 * one.turns
    assert four.unique == one.unique


def test_export_and_accounting_on_a_tree(byte_format) -> None:
    backend = ScriptedBackend(MOVES, choose_by_seed=True)
    batch = rollout([11], _env, backend, byte_format, TreeGRPO(m=2, n=2, l=1), seed=1)
    tree = batch.trees[0]
    group = leaves(tree)
    trajectories = export_trajectories(tree)
    assert len(trajectories) == len(group) >= 2
    for trajectory, leaf in zip(trajectories, group, strict=True):
        assert trajectory.prompt_ids == tree.root.observation_ids
        full = trajectory.prompt_ids + trajectory.response_ids
        assert full == context_ids(leaf)[: len(full)]
        model_tokens = [t for t, m in zip(trajectory.response_ids, trajectory.response_mask,
                                          strict=True) if m]
        assert model_tokens == [t for n in path_to(leaf)[1:] for t in n.action_ids]
        assert trajectory.node_path == [n.id for n in path_to(leaf)]
        assert trajectory.reward == sum(n.reward for n in path_to(leaf))
    counts = token_counts(tree)
    # Unique tokens: the trie of all contexts, by brute force.
    trie: set[tuple[int, ...]] = set()
    for t in trajectories:
        seq = t.prompt_ids + t.response_ids
        trie.update(tuple(seq[: i + 1]) for i in range(len(seq)))
    assert counts.unique == len(trie)
    assert counts.unique_ends == sum(1 for seq in trie if not any(
        len(other) == len(seq) + 1 and other[:-1] == seq for other in trie))
    assert counts.chain_unique == sum(len(t.prompt_ids) + len(t.response_ids)
                                      for t in trajectories)
    assert counts.generated == sum(len(n.action_ids) for n in tree.nodes)
    assert counts.chain_generated >= counts.generated


def test_tree_json_round_trip(tmp_path, byte_format) -> None:
    batch = rollout([5], _env, ScriptedBackend(MOVES, choose_by_seed=True), byte_format,
                    TreeGRPO(m=2, n=1, l=1), seed=2)
    tree = batch.trees[0]
    save_tree(tree, tmp_path / "t.json")
    again = load_tree(tmp_path / "t.json")
    assert [n.id for n in again.nodes] == [n.id for n in tree.nodes]
    assert export_trajectories(again) == export_trajectories(tree)
    with pytest.raises(ValueError, match="treeroll tree file"):
        (tmp_path / "bad.json").write_text("{}")
        load_tree(tmp_path / "bad.json")


def test_chain_gives_independent_trajectories(byte_format) -> None:
    batch = rollout([1, 2, 3], _env, ScriptedBackend(MOVES, choose_by_seed=True), byte_format,
                    Chain(group_size=5), seed=0)
    for tree in batch.trees:
        assert len(tree.root.children) == 5
        assert all(len(n.children) <= 1 for n in tree.nodes[1:])
        assert len(leaves(tree)) == 5
        assert all(leaf.status in (NodeStatus.TERMINAL, NodeStatus.TRUNCATED)
                   for leaf in leaves(tree))


def test_tree_grpo_group_size_and_branching(byte_format) -> None:
    """With no budget, and chains that run to the turn limit (so every round finds nodes to
    branch from), the group is exactly G = M(LN + 1): each pick adds one leaf to its tree."""
    for m, n, l in ((2, 2, 2), (3, 1, 2), (1, 3, 1), (2, 0, 3)):  # noqa: E741
        batch = rollout([21, 22], _idle_env, ScriptedBackend(IDLE, choose_by_seed=True),
                        byte_format, TreeGRPO(m=m, n=n, l=l), seed=3)
        for tree in batch.trees:
            assert len(tree.root.children) == m
            assert len(leaves(tree)) == m * (l * n + 1)
            assert sorted(map(len, _trees_of(tree).values())) == [l * n + 1] * m
            assert all(leaf.status == NodeStatus.TRUNCATED for leaf in leaves(tree))
            # every pick branched a node that already had a child, below the root
            assert sum(len(node.children) - 1 for node in tree.nodes[1:] if node.children) == (
                m * l * n)


@pytest.mark.parametrize("max_leaves,max_tokens", [(3, None), (None, 40), (4, 60)])
def test_budget_is_never_exceeded(byte_format, max_leaves, max_tokens) -> None:
    config = RolloutConfig(max_leaves=max_leaves, max_generated_tokens=max_tokens)
    for strategy in (Chain(group_size=8), TreeGRPO(m=4, n=2, l=2)):
        batch = rollout([7, 8, 9], _env, ScriptedBackend(MOVES, choose_by_seed=True),
                        byte_format, strategy, config=config, seed=4)
        for tree in batch.trees:
            counts = token_counts(tree)
            if max_leaves is not None:
                assert counts.leaves <= max_leaves
            if max_tokens is not None:
                assert counts.generated <= max_tokens
            assert all(n.status != NodeStatus.ACTIVE for n in tree.nodes)


def test_budget_cut_branches_are_marked(byte_format) -> None:
    batch = rollout([30], lambda: make_frozenlake("rllm", size_min=9, size_max=9),
                    ScriptedBackend(["```Left```", "```Right```"], choose_by_seed=True),
                    byte_format, Chain(group_size=4),
                    config=RolloutConfig(max_generated_tokens=30), seed=0)
    statuses = {leaf.status for leaf in leaves(batch.trees[0])}
    assert NodeStatus.BUDGET in statuses


def test_env_snapshots_make_branches_independent(byte_format) -> None:
    """Every child of every branch point continued from its own copy of its parent's state:
    replaying its path on a fresh environment gives exactly the turn, position and reward it
    recorded (a sibling stepped on a shared state first would have moved it)."""
    batch = rollout([40, 41], _env, ScriptedBackend(MOVES, choose_by_seed=True), byte_format,
                    TreeGRPO(m=1, n=3, l=2), seed=5)
    children = [child for tree in batch.trees for node in tree.nodes if len(node.children) > 1
                for child in node.children]
    assert len(children) >= 6
    for child in children:
        tree = next(t for t in batch.trees if child in t.nodes)
        env = _env()
        env.reset(tree.task_seed)
        for turn in path_to(child)[1:]:
            _, reward, terminated, _, info = env.step(turn.action_text)
        assert (info["turn"], info["position"], reward, terminated) == (
            child.info["turn"], child.info["position"], child.reward, child.terminated)


def test_generation_is_batched_across_trees(byte_format) -> None:
    backend = ScriptedBackend(MOVES, choose_by_seed=True)
    calls = []

    class Counting(ScriptedBackend):
        def generate(self, requests, params):  # type: ignore[no-untyped-def]
            calls.append(len(requests))
            return backend.generate(requests, params)

    rollout([1, 2, 3, 4], _env, Counting(MOVES), byte_format, Chain(group_size=3), seed=0)
    assert calls[0] == 12  # every branch of every tree in one backend call


def test_rollout_is_deterministic_given_seed(tiny_model, word_tokenizer) -> None:
    fmt = TurnFormat(word_tokenizer)
    runs = [rollout([3], _env, HFBackend(tiny_model), fmt, TreeGRPO(m=2, n=1, l=1),
                    config=RolloutConfig(max_turn_tokens=4), seed=9).trees[0] for _ in range(2)]
    assert [n.action_ids for n in runs[0].nodes] == [n.action_ids for n in runs[1].nodes]
    assert np.isclose(sum(n.reward for n in runs[0].nodes), sum(n.reward for n in runs[1].nodes))


# ------------------------------------------------------------------------------ Tree-GRPO


IDLE = ["idle", "wait"]
"""Replies FrozenLake rejects (no move): a chain never ends before the turn limit."""


def _idle_env():  # type: ignore[no-untyped-def]
    return make_frozenlake("rllm", size_min=3, size_max=3)  # 6 turns, then truncated


def _trees_of(tree):  # type: ignore[no-untyped-def]
    """Group leaves by subtree_index (which of the M trees each belongs to)."""
    groups: dict[int, list] = {}
    for leaf in leaves(tree):
        groups.setdefault(subtree_index(tree, leaf), []).append(leaf)
    return groups


def test_tree_grpo_keeps_k_leaves_when_the_budget_ends_the_rollout(byte_format) -> None:
    """k applies however the rollout ends: here the token budget stops it mid-expansion."""
    # Two chains of 6 turns of 5 tokens are 60 tokens; the budget leaves ~20 for 6 expansions.
    config = RolloutConfig(max_generated_tokens=80)
    batch = rollout([1, 2], _idle_env, ScriptedBackend(IDLE, choose_by_seed=True), byte_format,
                    TreeGRPO(m=2, n=3, l=2, k=2), config=config, seed=0)
    for tree in batch.trees:
        assert any(leaf.status == NodeStatus.BUDGET for leaf in leaves(tree))
        stopped = [n for n in tree.nodes if n.is_leaf and n.parent is not None]
        assert len(stopped) > 2 * 2  # more leaves than k per tree were grown
        groups = _trees_of(tree)
        assert sorted(groups) == [0, 1]
        assert all(len(group) == 2 for group in groups.values()), \
            {index: len(group) for index, group in groups.items()}
        assert any(n.status == NodeStatus.DROPPED for n in tree.nodes)


class _Turns:
    """Ends (truncated) after ``max_turns`` turns; reward 1 for a turn whose reply is ``good``."""

    system_prompt = "turns"

    def __init__(self, max_turns: int) -> None:
        self.max_turns = max_turns
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.turn = 0
        return f"task {seed}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        return (f"turn {self.turn}", float(action.strip() == "good"), False,
                self.turn >= self.max_turns, {"success": False})

    def fork(self) -> _Turns:
        return copy.deepcopy(self)


def test_tree_grpo_root_picks_join_the_tree_they_were_picked_for(byte_format) -> None:
    """One-turn chains leave the root as the only node to branch from: every pick is a root
    pick, and each belongs to the tree it was picked for, in the intra advantage too."""
    batch = rollout([0, 1, 2], lambda: _Turns(1), ScriptedBackend(["good", "bad"],
                    choose_by_seed=True), byte_format,
                    TreeGRPO(m=2, n=2, l=2, include_root=True), seed=0)
    for tree in batch.trees:
        # Frontiers in order: the 2 chains, then per round tree 0's 2 picks, tree 1's 2 picks.
        assert [subtree_index(tree, n) for n in tree.root.children] == [0, 1, 0, 0, 1, 1, 0, 0,
                                                                       1, 1]
        group = leaves(tree)
        assert len(group) == 2 * (2 * 2 + 1)
        r = np.array([leaf.reward for leaf in group])
        members = np.array([0, 1, 0, 0, 1, 1, 0, 0, 1, 1])
        intra = np.zeros_like(r)
        for index in (0, 1):
            g = r[members == index]
            intra[members == index] = (g - g.mean()) / (g.std() + 1e-6)
        inter = (r - r.mean()) / (r.std() + 1e-6)
        np.testing.assert_allclose(advantages.tree_advantage(tree), intra + inter)
    assert any(np.ptp([leaf.reward for leaf in leaves(tree)]) > 0 for tree in batch.trees)


def test_tree_grpo_root_picks_are_candidates_of_later_rounds(byte_format) -> None:
    """A chain started by a root pick in round 1 can be branched from in round 2, as part of
    the tree it was picked for; every pick adds one leaf to its tree: 1 + L*N leaves each."""
    batch = rollout([0, 1], lambda: _Turns(2), ScriptedBackend(["good", "bad"],
                    choose_by_seed=True), byte_format,
                    TreeGRPO(m=2, n=6, l=2, include_root=True), seed=0)
    for tree in batch.trees:
        assert sorted(len(group) for group in _trees_of(tree).values()) == [13, 13]
        root_picks = tree.root.children[2:]
        assert root_picks  # the root was picked in some round
        later = [n for n in root_picks if len(n.children) > 1]
        assert later and all("round 2" in n.note for n in later)
        assert all(subtree_index(tree, c) == subtree_index(tree, n)
                   for n in later for c in n.children)


def test_trie_counts_a_repeated_sibling_turn_as_replayed_and_its_leaf_end_once() -> None:
    """Two sibling turns with the same tokens share the trie: the later one's sampled tokens
    are ``replayed``; a token nothing follows is an end; ``forwarded_over_unique`` divides by
    the trie tokens that are fed."""
    tree = RolloutTree.new(0, tree_id=0, group_id=0, prompt_ids=[1, 2], prompt_text="")
    first = tree.add_child(tree.root, action_ids=[3, 4], observation_ids=[5])
    tree.add_child(tree.root, action_ids=[3, 4], observation_ids=[5])  # a repeat
    tree.add_child(first, action_ids=[6], observation_ids=[], terminated=True)
    tree.add_child(first, action_ids=[7, 8], observation_ids=[], terminated=True)
    counts = token_counts(tree)
    assert counts.unique == 8  # 1 2 3 4 5 6 7 8
    assert counts.replayed == 2
    assert counts.unique_ends == 2  # 6 and 8
    counts.prefill, counts.turns = 10, 4
    assert counts.forwarded_over_unique == counts.forwarded / 6


@pytest.mark.parametrize("temperature", [0.0, 0.05])
def test_replayed_turns_change_no_tree_and_the_counts_match_the_backends_forwards(
        tiny_model, word_tokenizer, temperature) -> None:
    """Tree-GRPO's expansions often repeat their chain's turn; the HF backend replays such a
    turn from kept logits. The trees are those of a backend that does not replay, the
    accounting's ``forwarded`` is what each backend fed, and with replay every position the
    trees' trie holds is fed once (``forwarded_over_unique`` 1.0; one tree per batch, so no
    prompt prefix is shared across trees)."""
    fmt = TurnFormat(word_tokenizer)
    config = RolloutConfig(max_turn_tokens=6, temperature=temperature)
    runs = {}
    for replay in (False, True):
        backend = HFBackend(tiny_model, replay=replay)
        batch = rollout([7], _env, backend, fmt, TreeGRPO(m=2, n=2, l=1), config=config,
                        seed=3)
        counts = token_counts(batch.trees[0])
        assert counts.forwarded == backend.stats["forward_tokens"]
        runs[replay] = ([[n.action_ids for n in t.nodes] for t in batch.trees], counts)
        paths = {tuple(t for n in path_to(leaf) for t in n.action_ids)
                 for leaf in leaves(batch.trees[0])}
        assert len(paths) > 1 or temperature == 0  # sampled: the branches part somewhere
    (plain, plain_counts), (replayed, counts) = runs[False], runs[True]
    assert replayed == plain
    assert counts.reused > 0 and plain_counts.reused == 0
    assert counts.forwarded < plain_counts.forwarded
    assert counts.forwarded_over_unique == 1.0
