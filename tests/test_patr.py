"""PATR (strategies.PATR): expansion, pruning boundary, Theta, pruned-as-negatives, budget,
and equivalence with the random tree when scoring is off."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from treeroll.base import Completion, GenerationRequest, SamplingParams, Score, StrategyContext
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs.frozenlake import make_frozenlake
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.scorers import FrozenLakeProgress
from treeroll.strategies import PATR, RandomTree, repeated_action
from treeroll.tree import (
    Node,
    NodeStatus,
    RolloutTree,
    export_trajectories,
    leaf_rewards,
    leaves,
    path_to,
)

EOS = ByteTokenizer.eos_token_id


class FakeBackend:
    """Replies from a list: in call order (``by_seed=False``) or picked by each request's seed
    (deterministic in the engine's seed, independent of batching)."""

    def __init__(self, replies: Sequence[str], by_seed: bool = True) -> None:
        self.replies = list(replies)
        self.by_seed = by_seed
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        out = []
        for request in requests:
            index = (request.seed or 0) if self.by_seed else self.calls
            self.calls += 1
            ids = [*ByteTokenizer().encode(self.replies[index % len(self.replies)]), EOS]
            cap = min(request.max_new_tokens or params.max_new_tokens, params.max_new_tokens)
            ids = ids[:cap]
            out.append(Completion(ids, [-1.0] * len(ids),
                                  "stop" if ids[-1] == EOS else "length",
                                  prefill_tokens=len(request.prompt_ids)))
        return out

    def reset_cache(self) -> None:
        pass


class CountEnv:
    """Never terminates; truncates after ``max_turns`` turns. Reward 1 per ``good`` reply."""

    system_prompt = "count"

    def __init__(self, max_turns: int = 4) -> None:
        self.max_turns = max_turns
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.turn = 0
        return f"task {seed}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        truncated = self.turn >= self.max_turns
        return (f"turn {self.turn}", float(action == "good"), False, truncated,
                {"success": False})

    def fork(self) -> CountEnv:
        return copy.deepcopy(self)


class ByAction:
    """Scores a node by its action text (``values[text]``); asserts PATR passes live states."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values
        self.calls: list[list[int]] = []

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        assert all(node.env is not None for node in nodes), "scored nodes keep their state"
        self.calls.append([node.depth for node in nodes])
        return [Score(self.values[node.action_text], "by action") for node in nodes]


FORMAT = TurnFormat(ByteTokenizer())


def _nodes(n: int) -> tuple[RolloutTree, list[Node]]:
    tree = RolloutTree.new(0, 0, 0, [], "root")
    return tree, [tree.add_child(tree.root, action_text=f"a{i}") for i in range(n)]


def _shape(tree: RolloutTree) -> list[tuple[int | None, str, str, str]]:
    return [(None if n.parent is None else n.parent.id, n.action_text, n.status, n.note)
            for n in tree.nodes]


# ------------------------------------------------------------------------------ select


def test_top_k_expand_into_m_children_middle_survives() -> None:
    _, active = _nodes(5)
    patr = PATR(top_k=2, m=3, alpha=1.0)
    frontier = patr.select(active, [0.1, 0.9, 0.5, 0.7, 0.3], np.random.default_rng(0))
    assert [n.action_text for n in frontier] == ["a0", "a1", "a1", "a1", "a2", "a3", "a3",
                                                 "a3", "a4"]
    assert active[1].note.startswith("expanded") and active[3].note.startswith("expanded")
    assert active[0].note.startswith("kept")
    # ties: the earlier branch wins
    _, active = _nodes(3)
    frontier = PATR(top_k=1, m=2, alpha=1.0).select(active, [0.5, 0.5, 0.5],
                                                    np.random.default_rng(0))
    assert [n.action_text for n in frontier] == ["a0", "a0", "a1", "a2"]


def test_prune_boundary_is_median_minus_alpha_inclusive() -> None:
    _, active = _nodes(7)
    patr = PATR(top_k=0, alpha=0.25)
    # median of the seven scores is 0.5, so the threshold is exactly 0.25
    scores = [0.5, 0.5, 0.75, 0.25, float(np.nextafter(0.25, 0.0)), 0.0, 1.0]
    frontier = patr.select(active, scores, np.random.default_rng(0))
    assert [n.action_text for n in frontier] == ["a0", "a1", "a2", "a3", "a6"]
    assert active[3].status == NodeStatus.ACTIVE  # equal to the threshold: survives
    assert active[4].status == NodeStatus.PRUNED  # just below: pruned
    assert active[5].status == NodeStatus.PRUNED
    assert "median - alpha = 0.250" in active[4].note


def test_pruned_are_never_expanded_and_single_branch_is_never_pruned() -> None:
    _, active = _nodes(3)
    frontier = PATR(top_k=3, m=2, alpha=0.1).select(active, [1.0, 1.0, 0.0],
                                                    np.random.default_rng(0))
    assert [n.action_text for n in frontier] == ["a0", "a0", "a1", "a1"]
    _, active = _nodes(1)
    assert PATR(top_k=0, alpha=0.0).select(active, [0.0], np.random.default_rng(0)) == active


def test_scoring_off_never_prunes_on_score() -> None:
    _, active = _nodes(4)
    patr = PATR(top_k=1, alpha=0.0, use_scores=False)
    frontier = patr.select(active, [1.0, 0.0, 0.0, 0.0], np.random.default_rng(0))
    assert len(frontier) == 5 and all(n.status == NodeStatus.ACTIVE for n in active)


# ------------------------------------------------------------------------------ Theta


def _chain(actions: Sequence[str], info: dict[str, Any] | None = None
           ) -> tuple[RolloutTree, Node]:
    tree = RolloutTree.new(0, 0, 0, [], "root")
    node = tree.root
    for action in actions:
        node = tree.add_child(node, action_text=action, info=dict(info or {}))
        node.env = CountEnv()
    return tree, node


def test_theta_repeats_prune_at_any_turn() -> None:
    patr = PATR(theta=6, k_turns=100)
    ctx = StrategyContext(rng=np.random.default_rng(0), max_leaves=None, tokens_left=None)
    patr.start(RolloutTree.new(0, 0, 0, [], "r"), ctx)
    tree, five = _chain(["```Up```"] * 5)
    assert patr.step(tree, [five], ctx) == [five]
    tree, six = _chain(["```Left```"] + ["```Up```"] * 6)
    assert patr.step(tree, [six], ctx) == []
    assert six.status == NodeStatus.PRUNED and "same action 6 times" in six.note
    tree, mixed = _chain(["```Up```"] * 5 + ["```Down```"])
    assert patr.step(tree, [mixed], ctx) == [mixed]
    assert not repeated_action(six, 0)  # theta = 0 disables


def test_theta_compares_executed_actions_not_reply_text() -> None:
    """FrozenLake reports the moves it executed; reasoning text around them does not make
    two identical moves different actions."""
    tree = RolloutTree.new(0, 0, 0, [], "root")
    node = tree.root
    for i in range(6):
        text = "Moving on.\n```Up```" if i % 2 else "```Up```"
        node = tree.add_child(node, action_text=text,
                              info={"action_names": ["Up"], "format_error": False})
    assert repeated_action(node, 6)


def test_theta_through_the_engine() -> None:
    batch = rollout([0], lambda: CountEnv(max_turns=20), FakeBackend(["same"]), FORMAT,
                    PATR(b0=2, k_turns=100, theta=3), seed=0)
    tree = batch.trees[0]
    assert all(leaf.depth == 3 and leaf.status == NodeStatus.PRUNED for leaf in leaves(tree))
    assert len(leaves(tree)) == 2


# ------------------------------------------------------------------------------ engine


def _good_bad_rollout(keep_pruned: bool) -> RolloutTree:
    patr = PATR(b0=4, k_turns=1, top_k=2, m=2, alpha=0.4, theta=0, keep_pruned=keep_pruned)
    scorer = ByAction({"good": 1.0, "bad": 0.0})
    batch = rollout([0], lambda: CountEnv(max_turns=3), FakeBackend(["good", "bad"],
                    by_seed=False), FORMAT, patr, scorer=scorer, seed=0)
    assert scorer.calls and all(depths == [depths[0]] * len(depths) for depths in scorer.calls)
    return batch.trees[0]


def test_pruned_kept_as_negatives() -> None:
    tree = _good_bad_rollout(keep_pruned=True)
    pruned = [n for n in tree.nodes if n.status == NodeStatus.PRUNED]
    assert pruned and all(n.action_text == "bad" and n.is_leaf for n in pruned)
    group = leaves(tree)
    assert all(n in group for n in pruned)
    # A pruned branch's reward is what it earned when stopped: its "bad" last turn earned 0,
    # but one pruned at depth 2 had earned 1 on its "good" first turn, and keeps it.
    earned = {n.id: sum(p.action_text == "good" for p in path_to(n)) for n in pruned}
    assert max(earned.values()) >= 1
    rewards = dict(zip([n.id for n in group], leaf_rewards(tree, group), strict=True))
    exported = {t.node_path[-1]: t.reward for t in export_trajectories(tree)}
    assert all(rewards[i] == exported[i] == earned[i] for i in earned)
    expanded = [n for n in tree.nodes if n.note.startswith("expanded")]
    assert expanded and all(n.action_text == "good" and len(n.children) == 2 for n in expanded)
    assert not any(n.status == NodeStatus.DROPPED for n in tree.nodes)


def test_pruned_dropped_from_group_when_off() -> None:
    kept = _good_bad_rollout(keep_pruned=True)
    tree = _good_bad_rollout(keep_pruned=False)
    dropped = [n for n in tree.nodes if n.status == NodeStatus.DROPPED]
    assert dropped and not any(n.status == NodeStatus.PRUNED for n in tree.nodes)
    assert not any(n in leaves(tree) for n in dropped)
    assert len(leaves(tree)) == len(leaves(kept)) - len(dropped)
    assert [n.action_text for n in tree.nodes] == [n.action_text for n in kept.nodes]


def test_scores_every_k_turns() -> None:
    scorer = ByAction({"good": 0.5})
    rollout([0], lambda: CountEnv(max_turns=7), FakeBackend(["good"]), FORMAT,
            PATR(b0=2, k_turns=3, top_k=1, m=2, theta=0), scorer=scorer, seed=0)
    assert [depths[0] for depths in scorer.calls] == [3, 6]


FROZEN_REPLIES = ["```Up```", "```Down```", "```Left```", "```Right```",
                  "Moving on.\n```Right```", "nonsense", "```Down```"]


@pytest.mark.parametrize("keep_pruned", [True, False])
@pytest.mark.parametrize(("max_leaves", "max_tokens"), [(5, None), (None, 300), (7, 150),
                                                       (1, None), (None, 12)])
def test_budget_is_never_exceeded(max_leaves: int | None, max_tokens: int | None,
                                  keep_pruned: bool) -> None:
    config = RolloutConfig(max_turn_tokens=24, max_leaves=max_leaves,
                           max_generated_tokens=max_tokens)
    patr = PATR(b0=4, k_turns=1, top_k=2, m=3, alpha=0.1, theta=3, keep_pruned=keep_pruned)
    batch = rollout(list(range(6)), lambda: make_frozenlake("rllm"),
                    FakeBackend(FROZEN_REPLIES), FORMAT, patr, config=config,
                    scorer=FrozenLakeProgress(), seed=3)
    for tree in batch.trees:
        group = leaves(tree)
        assert group or not keep_pruned  # dropping pruned branches may empty a group
        if max_leaves is not None:
            assert len(group) <= max_leaves
        if max_tokens is not None:
            assert sum(len(n.action_ids) for n in tree.nodes) <= max_tokens
        assert all(n.status in NodeStatus.STOPPED for n in tree.nodes if n.is_leaf
                   and n.parent is not None)


# ------------------------------------------------------------------------------ random tree


def _frozen(strategy: Any, scorer: Any = None, seed: int = 7) -> list[RolloutTree]:
    return rollout(list(range(5)), lambda: make_frozenlake("rllm"), FakeBackend(FROZEN_REPLIES),
                   FORMAT, strategy, scorer=scorer, seed=seed).trees


def test_scoring_disabled_is_the_random_tree() -> None:
    settings = dict(b0=3, k_turns=2, top_k=1, m=2, alpha=0.0, theta=4)
    reference = _frozen(RandomTree(**settings))  # type: ignore[arg-type]
    assert [_shape(t) for t in _frozen(RandomTree(**settings))] == [  # type: ignore[arg-type]
        _shape(t) for t in reference]
    for variant in (_frozen(PATR(use_scores=False, **settings)),  # type: ignore[arg-type]
                    _frozen(PATR(use_scores=False, **settings),  # type: ignore[arg-type]
                            scorer=FrozenLakeProgress()),
                    _frozen(PATR(**settings))):  # type: ignore[arg-type]  # no scorer
        assert [_shape(t) for t in variant] == [_shape(t) for t in reference]
    notes = [n.note for t in reference for n in t.nodes]
    assert not any("median" in note for note in notes)  # never pruned on score
    assert any(note.startswith("expanded") for note in notes)
    assert all(n.score_reason == "random (scoring disabled)" for t in reference for n in t.nodes
               if n.score is not None)


def test_patr_with_scores_differs_from_random_tree() -> None:
    settings = dict(b0=3, k_turns=1, top_k=1, m=2, alpha=0.1, theta=4)
    scored = _frozen(PATR(**settings), scorer=FrozenLakeProgress())  # type: ignore[arg-type]
    random = _frozen(RandomTree(**settings))  # type: ignore[arg-type]
    assert [_shape(t) for t in scored] != [_shape(t) for t in random]
    assert any(n.score_reason.startswith("distance") for t in scored for n in t.nodes)


# ------------------------------------------------------------------------------ default scorer


def test_patr_without_a_scorer_uses_the_environments_own() -> None:
    """PATR steers by scores: with no scorer named it takes the environment's own (and says
    so), or refuses where the environment has none; unscored strategies get none."""
    import warnings

    from treeroll.assemble import scorer_name_for
    from treeroll.strategies import Chain

    for env, expected in (("frozenlake_rllm", "frozenlake_progress"),
                          ("frozenlake_ragen", "frozenlake_progress"), ("swe", "swe")):
        with pytest.warns(UserWarning, match=f"scorer {expected!r}"):
            assert scorer_name_for(None, PATR(), env) == expected
    with pytest.raises(ValueError, match=r"--scorer\.name .*valid: .*frozenlake_progress"):
        scorer_name_for(None, PATR(), "gym:CliffWalking-v1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scorer_name_for("degeneracy", PATR(), "gym:CliffWalking-v1") == "degeneracy"
        for unscored in (RandomTree(), PATR(use_scores=False), Chain()):
            assert scorer_name_for(None, unscored, "gym:CliffWalking-v1") is None


def test_train_with_patr_and_no_scorer_scores_with_the_env_scorer(tmp_path) -> None:
    """Through the config: `treeroll train --strategy.name patr` alone scores with
    frozenlake_progress on FrozenLake (it used to fall back to random scores)."""
    import json
    import warnings
    from dataclasses import replace

    from treeroll.config import load_config
    from treeroll.training.trainer import train

    base = load_config("configs/tiny.yaml")
    config = replace(base, runs_dir=str(tmp_path),
                     strategy=replace(base.strategy, name="patr",
                                      patr=replace(base.strategy.patr, k_turns=1)),
                     optim=replace(base.optim, steps=1),
                     eval=replace(base.eval, tasks=2, tasks_during=2))
    assert config.scorer.name is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config)
    tree = json.loads((tmp_path / base.name / "trees" / "step_00001.json").read_text())
    reasons = [n["score_reason"] for n in tree["nodes"] if n["score"] is not None]
    assert reasons and not any(reason.startswith("random") for reason in reasons), reasons
    assert any("frozenlake_progress" in str(w.message) for w in caught)
    gym = replace(config, name="gym", env=replace(config.env, name="gym:CliffWalking-v1"))
    with pytest.raises(ValueError, match=r"--scorer\.name"):
        train(gym)


def test_the_random_tree_refuses_scores() -> None:
    """``random_tree`` with ``use_scores`` on would be PATR under another name."""
    from treeroll.strategies import RandomTree

    with pytest.raises(ValueError, match=r"random_tree\.use_scores is always false"):
        RandomTree(use_scores=True)
    assert RandomTree().use_scores is False
