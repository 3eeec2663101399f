"""Process scorers: progress, degeneracy, value, judge, blend, make_scorer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from treeroll.base import Completion, GenerationRequest, ProcessScorer, SamplingParams, Score
from treeroll.envs.frozenlake import FrozenLakeEnv, make_frozenlake
from treeroll.envs.frozenlake_maps import ACTION_NAMES, shortest_path_length
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.scorers import (
    Blend,
    BlendSettings,
    Degeneracy,
    FrozenLakeProgress,
    JudgeScorer,
    ScorerConfig,
    ValueScorer,
    blend,
    make_scorer,
    parse_rating,
    trajectory_features,
)
from treeroll.tree import Node, NodeStatus, RolloutTree

_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))


def _env_with_hole(min_size: int = 4) -> FrozenLakeEnv:
    env = make_frozenlake("rllm", size_min=min_size)
    for seed in range(100):
        env.reset(seed)
        if any("O" in row for row in env.grid) and start_distance_of(env) >= 3:
            return env
    raise AssertionError("no map with a hole and a far goal in 100 seeds")


def start_distance_of(env: FrozenLakeEnv) -> int:
    distance = shortest_path_length(env.grid, env.start, env.goal)
    assert distance is not None
    return distance


def _shuttle(env: FrozenLakeEnv) -> tuple[str, str]:
    """An action to a frozen neighbour of the start, and the action back."""
    for name, (dr, dc) in zip(ACTION_NAMES, _MOVES, strict=True):
        row, col = env.start[0] + dr, env.start[1] + dc
        if 0 <= row < env.size and 0 <= col < env.size and env.grid[row][col] == "_":
            return name, ACTION_NAMES[(ACTION_NAMES.index(name) + 2) % 4]
    raise AssertionError("the start needs a frozen neighbour")


def _tree_for(env: FrozenLakeEnv) -> RolloutTree:
    first = f"Current observation (turn 0):\n{env.render()}\nYou have {env.turn_limit} turns."
    return RolloutTree.new(0, 0, 0, prompt_ids=[], prompt_text=first)


def _walk(tree: RolloutTree, env: FrozenLakeEnv, replies: Sequence[str]) -> Node:
    """Step a fork of ``env`` through ``replies``, recording each turn as a node; the last
    node keeps the environment (as PATR's scoring sees it)."""
    node = tree.root
    env = env.fork()
    for reply in replies:
        observation, reward, terminated, truncated, info = env.step(reply)
        node = tree.add_child(node, action_text=reply, observation_text=observation,
                              reward=reward, terminated=terminated, truncated=truncated,
                              info=info)
        if terminated or truncated:
            node.status = NodeStatus.TERMINAL if terminated else NodeStatus.TRUNCATED
            break
    node.env = None if node.ended else env
    return node


def _placed(env: FrozenLakeEnv, cell: tuple[int, int]) -> Node:
    """A depth-1 node whose environment has the player on ``cell``."""
    placed = env.fork()
    placed.position = cell
    tree = _tree_for(env)
    node = tree.add_child(tree.root, action_text="```Up```",
                          info={"format_error": False, "position": cell, "action_names": ["Up"]})
    node.env = placed
    return node


def _score(scorer: ProcessScorer, node: Node) -> Score:
    tree_root = node
    while tree_root.parent is not None:
        tree_root = tree_root.parent
    tree = RolloutTree(0, 0, 0, root=tree_root, nodes=[tree_root])
    (score,) = scorer(tree, [node])
    return score


# ------------------------------------------------------------------------------ progress


def test_progress_hole_start_closer_goal() -> None:
    env = _env_with_hole()
    scorer = FrozenLakeProgress()
    hole = next((r, c) for r, row in enumerate(env.grid) for c, cell in enumerate(row)
                if cell == "O")
    assert _score(scorer, _placed(env, hole)).value == 0.0
    at_start = _score(scorer, _placed(env, env.start))
    assert at_start.value == pytest.approx(0.5)
    d0 = start_distance_of(env)
    closer = next((env.start[0] + dr, env.start[1] + dc) for dr, dc in _MOVES
                  if 0 <= env.start[0] + dr < env.size and 0 <= env.start[1] + dc < env.size
                  and shortest_path_length(env.grid, (env.start[0] + dr, env.start[1] + dc),
                                           env.goal) == d0 - 1)
    assert _score(scorer, _placed(env, closer)).value == pytest.approx(0.5 + 0.5 / d0)
    on_goal = env.fork()
    on_goal.position, on_goal.success = env.goal, True
    node = _placed(env, env.goal)
    node.env = on_goal
    assert _score(scorer, node).value == 1.0


def test_progress_format_error_lowers_and_ended_nodes() -> None:
    env = _env_with_hole()
    tree = _tree_for(env)
    there, back = _shuttle(env)
    clean = _walk(tree, env, [f"```{there}```", f"```{back}```"])
    sloppy = _walk(tree, env, [f"```{there}```", f"```{back}```", "no action here"])
    assert isinstance(clean.env, FrozenLakeEnv) and isinstance(sloppy.env, FrozenLakeEnv)
    assert clean.env.position == sloppy.env.position
    scorer = FrozenLakeProgress(format_penalty=0.1, out_of_reach_factor=1.0)
    (a, b) = scorer(tree, [clean, sloppy])
    assert b.value == pytest.approx(a.value - 0.1)
    assert "format error" in b.reason
    # nodes without a snapshot: success 1, fell 0
    ended = Node(id=99, parent=tree.root, depth=1, terminated=True, info={"success": False})
    assert scorer(tree, [ended])[0].value == 0.0
    ended.info["success"] = True
    assert scorer(tree, [ended])[0].value == 1.0


def test_progress_rejects_other_envs() -> None:
    tree = RolloutTree.new(0, 0, 0, [], "x")
    node = tree.add_child(tree.root)
    node.env = object()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="FrozenLake"):
        FrozenLakeProgress()(tree, [node])


# ------------------------------------------------------------------------------ degeneracy


def test_degeneracy_repeats_and_revisits_lower_the_score() -> None:
    env = _env_with_hole()
    tree = _tree_for(env)
    scorer = Degeneracy()
    # moving back and forth: no repeated action, every turn but the first revisits a cell
    there, back = _shuttle(env)
    shuttle = _walk(tree, env, [f"```{there}```", f"```{back}```"] * 2)
    # a wall bump repeated: the same action and the same cell every turn
    wall = next(name for name, (dr, dc) in zip(ACTION_NAMES, _MOVES, strict=True)
                if not (0 <= env.start[0] + dr < env.size and 0 <= env.start[1] + dc < env.size)
                ) if env.start[0] in (0, env.size - 1) or env.start[1] in (0, env.size - 1) \
        else None
    root_score = scorer(tree, [tree.root])[0]
    assert root_score.value == 1.0
    one_move = _walk(tree, env, [f"```{there}```"])
    assert scorer(tree, [one_move])[0].value == 1.0
    s_shuttle = scorer(tree, [shuttle])[0]
    assert s_shuttle.value < 1.0 and "revisits 0.75" in s_shuttle.reason
    if wall is not None:
        bump = _walk(tree, env, [f"```{wall}```"] * 4)
        s_bump = scorer(tree, [bump])[0]
        assert s_bump.value < s_shuttle.value
    # same action with different reasoning text counts as a repeat
    texts = _walk(tree, env, [f"```{there}```", f"Moving on.\n```{back}```",
                              f"```{back}```"])
    assert "repeats 0.33" in scorer(tree, [texts])[0].reason


def test_degeneracy_format_error_run() -> None:
    env = _env_with_hole()
    tree = _tree_for(env)
    scorer = Degeneracy(max_format_run=3)
    one = _walk(tree, env, ["oops"])
    three = _walk(tree, env, ["oops", "what", "again"])
    values = [s.value for s in scorer(tree, [one, three])]
    assert values[1] < values[0] < 1.0
    assert all(0.0 <= v <= 1.0 for v in values)


# ------------------------------------------------------------------------------ value


def _synthetic_trees(n: int, rng: np.random.Generator) -> list[RolloutTree]:
    """Trees of random-policy FrozenLake episodes: the outcome depends on the path."""
    trees = []
    env0 = make_frozenlake("rllm", size_max=4)
    for i in range(n):
        env0.reset(int(rng.integers(1000)))
        tree = _tree_for(env0)
        for _ in range(3):
            replies = [f"```{ACTION_NAMES[int(a)]}```" for a in rng.integers(4, size=8)]
            _walk(tree, env0, replies)
        tree.tree_id = i
        trees.append(tree)
    return trees


def test_value_untrained_then_learns_to_separate() -> None:
    rng = np.random.default_rng(0)
    scorer = ValueScorer(min_examples=50, steps_per_observe=200, seed=0)
    train = _synthetic_trees(60, rng)
    probe = train[0].nodes[1:3]
    assert all(s == Score(0.5, "untrained") for s in scorer(train[0], probe))
    for chunk in range(0, 60, 20):
        scorer.observe(train[chunk:chunk + 20])
    assert scorer.trained
    test = _synthetic_trees(30, np.random.default_rng(1))
    winners, losers = [], []
    for tree in test:
        for node in tree.nodes[1:]:
            if node.ended:
                (winners if node.info.get("success") else losers).append(node)
    assert winners and losers
    win = scorer.predict(winners).mean()
    lose = scorer.predict(losers).mean()
    assert win > lose + 0.3, (win, lose)
    scores = scorer(test[0], test[0].nodes[1:])
    assert all(0.0 <= s.value <= 1.0 for s in scores)


def test_value_ignores_pruned_leaves_by_default() -> None:
    rng = np.random.default_rng(0)
    tree = _synthetic_trees(1, rng)[0]
    for node in tree.nodes[1:]:
        if node.is_leaf:
            node.status = NodeStatus.PRUNED
    scorer = ValueScorer(min_examples=1)
    scorer.observe([tree])
    assert scorer.examples_seen == 0


def test_features_read_the_map_from_text() -> None:
    env = _env_with_hole()
    tree = _tree_for(env)
    node = _walk(tree, env, [f"```{_shuttle(env)[0]}```"])
    features = trajectory_features(node)
    assert features[6] == 1.0  # grid parsed
    assert features.shape == (11,)
    plain = RolloutTree.new(0, 0, 0, [], "no map here")
    assert trajectory_features(plain.add_child(plain.root))[6] == 0.0


# ------------------------------------------------------------------------------ judge


@pytest.mark.parametrize(("reply", "expected"), [
    ("Rating: 8/10", 0.8),
    ("7/10", 0.7),
    ("I'd say 3 out of 5", 0.6),
    ("Rating: 8", 0.8),
    ("score = 6.5", 0.65),
    ("The agent is at turn 12, rating 7", 0.7),
    ("70%", 0.7),
    ("seven", 0.7),
    ("Ten!", 1.0),
    ("-3 then 4", 0.4),
    ("0", 0.0),
    ("no idea", None),
    ("", None),
    ("12/10 and 15", None),
])
def test_parse_rating(reply: str, expected: float | None) -> None:
    value = parse_rating(reply)
    if expected is None:
        assert value is None
    else:
        assert value == pytest.approx(expected)


class CannedJudge:
    """A fake backend replying with canned texts in order (byte tokens, eos 256)."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        out = []
        for request in requests:
            reply = self.replies[len(self.requests) % len(self.replies)]
            self.requests.append(request)
            ids = [*ByteTokenizer().encode(reply)[: params.max_new_tokens - 1], 256]
            out.append(Completion(ids, [0.0] * len(ids), "stop",
                                  prefill_tokens=len(request.prompt_ids)))
        return out

    def reset_cache(self) -> None:
        pass


def test_judge_batches_one_request_per_node_and_parses() -> None:
    env = _env_with_hole()
    tree = _tree_for(env)
    there, back = _shuttle(env)
    nodes = [_walk(tree, env, [f"```{there}```"]),
             _walk(tree, env, [f"```{there}```", f"```{back}```"]),
             _walk(tree, env, ["hmm"])]
    backend = CannedJudge(["Rating: 9/10", "I cannot tell", "two"])
    judge = JudgeScorer(backend, TurnFormat(ByteTokenizer()), max_new_tokens=32)
    scores = judge(tree, nodes)
    assert [s.value for s in scores] == [pytest.approx(0.9), 0.5, pytest.approx(0.2)]
    assert scores[1].reason == "unparsable judge reply"
    assert len(backend.requests) == 3
    prompt = ByteTokenizer().decode(list(backend.requests[1].prompt_ids))
    assert f"```{back}```" in prompt and "Current observation" in prompt
    assert judge.cost["requests"] == 3 and judge.cost["unparsable"] == 1
    assert judge.cost["prefill"] == sum(len(r.prompt_ids) for r in backend.requests)
    assert judge(tree, []) == []


def test_make_scorer_builds_judge_with_a_backend() -> None:
    judge = make_scorer(ScorerConfig(name="judge"), backend=CannedJudge(["5"]),
                        turn_format=TurnFormat(ByteTokenizer()))
    assert isinstance(judge, JudgeScorer)
    with pytest.raises(ValueError, match=r"judge\.model_path"):
        make_scorer(ScorerConfig(name="judge"))


# ------------------------------------------------------------------------------ blend


class Constant:
    def __init__(self, value: float) -> None:
        self.value = value
        self.observed = 0

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        return [Score(self.value, f"constant {self.value}") for _ in nodes]

    def observe(self, trees: Any) -> None:
        self.observed += 1


def test_blend_arithmetic_range_and_observe() -> None:
    tree = RolloutTree.new(0, 0, 0, [], "x")
    nodes = [tree.root, tree.add_child(tree.root)]
    a, b = Constant(1.0), Constant(0.2)
    mixed = blend(a, b, 0.25)(tree, nodes)
    assert [s.value for s in mixed] == [pytest.approx(0.25 + 0.75 * 0.2)] * 2
    assert "constant 1.0" in mixed[0].reason and "constant 0.2" in mixed[0].reason
    assert blend(a, b, 1.0)(tree, nodes)[0].value == 1.0
    assert blend(a, b, 0.0)(tree, nodes)[0].value == pytest.approx(0.2)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            blend(a, b, bad)
    blend(a, b, 0.5).observe([tree])
    assert a.observed == b.observed == 1


def test_make_scorer_by_name() -> None:
    built = make_scorer(ScorerConfig(name="blend", blend=BlendSettings(a="frozenlake_progress",
                                                                 b="degeneracy", weight=0.7)))
    assert isinstance(built, Blend) and built.lam == 0.7
    assert isinstance(built.a, FrozenLakeProgress) and isinstance(built.b, Degeneracy)
    assert isinstance(make_scorer(ScorerConfig(name="value")), ValueScorer)
    assert isinstance(make_scorer(ScorerConfig(name="tests.test_scorers:Degeneracy")),
                      Degeneracy)
    with pytest.raises(ValueError, match="valid: blend, degeneracy"):
        make_scorer(ScorerConfig(name="nope"))
    with pytest.raises(ValueError, match="other than blend"):
        make_scorer(ScorerConfig(name="blend", blend=BlendSettings(a="blend")))
