"""FrozenLake in the rLLM and RAGEN conventions: maps, text, parsing, dynamics, forks."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from treeroll.base import Env
from treeroll.envs import (
    FrozenLakeConfig,
    FrozenLakeEnv,
    distance_to_goal,
    frozenlake_corpus,
    make_frozenlake,
    start_distance,
)
from treeroll.envs.frozenlake import WORD_PATTERN
from treeroll.envs.frozenlake_maps import ACTION_NAMES, shortest_path_length

RAGEN_FORMAT = ("Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
                "with no extra text. Strictly follow this format. Max response length: 100 words.")


def set_map(env: FrozenLakeEnv, grid: tuple[str, ...], position: tuple[int, int],
            goal: tuple[int, int]) -> None:
    """Put a reset environment on a hand-made map (rows of ``_``, ``O``, ``G``)."""
    env.grid, env.start, env.position, env.goal = grid, position, position, goal


def open_ragen(**overrides: object) -> FrozenLakeEnv:
    """A non-slippery RAGEN-format env on an open 4x4 map, player top-left, goal bottom-right."""
    env = make_frozenlake("ragen", slippery=False, **overrides)
    env.reset(0)
    set_map(env, ("____", "____", "____", "___G"), (0, 0), (3, 3))
    return env


# ------------------------------------------------------------------------------ configs


def test_named_configs_follow_environments_md() -> None:
    rllm = FrozenLakeConfig.rllm()
    assert (rllm.size_min, rllm.size_max, rllm.slippery, rllm.actions_per_turn) == (2, 9, False, 1)
    assert (rllm.frozen_prob_min, rllm.frozen_prob_max, rllm.format_penalty) == (0.6, 0.85, 0.0)
    assert [rllm.turn_limit(n) for n in (2, 5, 9)] == [4, 10, 18]
    ragen = FrozenLakeConfig.ragen()
    assert (ragen.size_min, ragen.size_max, ragen.frozen_prob_min, ragen.slippery) == (4, 4, 0.8,
                                                                                      True)
    assert (ragen.max_turns, ragen.max_actions, ragen.actions_per_turn) == (5, 10, 5)
    assert ragen.format_penalty == 0.1 and ragen.turn_limit(4) == 5
    assert FrozenLakeConfig.rllm(size_max=12).max_turns == 24


@pytest.mark.parametrize(("overrides", "field"), [
    ({"size_min": 1}, "size_min"),
    ({"size_min": 6, "size_max": 5}, "size_max"),
    ({"frozen_prob_min": 0.0}, "frozen_prob_min"),
    ({"max_turns": 0}, "max_turns"),
    ({"max_actions": 0}, "max_actions"),
    ({"format_penalty": -0.1}, "format_penalty"),
    ({"turn_limit_per_size": 0}, "turn_limit_per_size"),
    ({"actions_per_turn": 2}, "actions_per_turn"),
])
def test_config_validation_names_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FrozenLakeConfig.rllm(**overrides)  # type: ignore[arg-type]


def test_make_frozenlake_rejects_unknown_convention() -> None:
    with pytest.raises(ValueError, match="rllm"):
        make_frozenlake("babyai")


# ------------------------------------------------------------------------------ maps


def test_reset_is_deterministic_and_implements_env() -> None:
    for convention in ("rllm", "ragen"):
        env = make_frozenlake(convention)
        assert isinstance(env, Env)
        texts = [env.reset(seed) for seed in range(20)]
        assert texts == [make_frozenlake(convention).reset(seed) for seed in range(20)]
        assert len(set(texts)) > 15


def test_rllm_maps_sizes_and_paths() -> None:
    env = make_frozenlake("rllm")
    sizes = set()
    for seed in range(300):
        env.reset(seed)
        sizes.add(env.size)
        assert env.start != env.goal
        assert env.grid[env.start[0]][env.start[1]] == "_"
        assert env.grid[env.goal[0]][env.goal[1]] == "G"
        distance = start_distance(env)
        assert distance is not None and distance >= 1
        assert env.turn_limit == 2 * env.size
    assert sizes == set(range(2, 10))


def test_ragen_maps_are_4x4_with_a_path() -> None:
    env = make_frozenlake("ragen")
    for seed in range(100):
        env.reset(seed)
        assert env.size == 4 and start_distance(env) is not None


def test_shortest_path_length() -> None:
    grid = ("_O_", "_O_", "__G")
    assert shortest_path_length(grid, (0, 0), (2, 2)) == 4
    assert shortest_path_length(grid, (0, 2), (2, 2)) == 2
    assert shortest_path_length(grid, (0, 1), (2, 2)) is None
    assert shortest_path_length(("_O", "OG"), (0, 0), (1, 1)) is None


# ------------------------------------------------------------------------------ golden texts


def test_rllm_golden_text() -> None:
    env = make_frozenlake("rllm")
    assert env.reset(21) == (
        "Current observation (turn 0):\n"
        "_  _  _  O\n"
        "_  _  O  G\n"
        "_  _  O  P\n"
        "O  _  _  _\n"
        "You have 8 turns to reach the goal."
    )
    assert env.step("I go ```down```")[0] == (
        "Current observation (turn 1):\n"
        "_  _  _  O\n"
        "_  _  O  G\n"
        "_  _  O  _\n"
        "O  _  _  P\n"
        "You have 7 turns left."
    )
    assert "```Up```" in env.system_prompt and "last triple backtick block" in env.system_prompt


def test_ragen_golden_text() -> None:
    env = make_frozenlake("ragen")
    assert env.reset(10000) == (
        "Turn 1:\nState:\n___P\n____\n__O_\n__G_\nYou have 10 actions left. " + RAGEN_FORMAT
    )
    observation, reward, *_ = env.step("<think>x</think><answer>Left || Jump</answer>")
    assert reward == pytest.approx(-0.1)
    assert re.fullmatch(r"Reward:\n-0\.1\nTurn 2:\nState:\n(.{4}\n){4}You have 9 actions left\. "
                        + re.escape(RAGEN_FORMAT), observation)
    assert "up to 10 actions, separated by ' || '" in env.system_prompt


def test_ragen_symbols_for_hole_and_goal() -> None:
    env = open_ragen()
    set_map(env, ("_O__", "____", "____", "___G"), (0, 0), (3, 3))
    observation = env.step("<think></think><answer>Right</answer>")[0]
    assert "_X__" in observation and observation.endswith("You fell into a hole.")
    env = open_ragen()
    set_map(env, ("_G__", "____", "____", "____"), (0, 0), (0, 1))
    observation = env.step("<think></think><answer>Right</answer>")[0]
    assert "_\u221a__" in observation and observation.endswith("You reached the goal.")


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(("reply", "moved_to", "format_error"), [
    ("```Up```", (1, 3), False),
    ("I think Down.\n```Down```", (3, 3), False),
    ("```Up``` no wait ```down```", (3, 3), False),  # the last block counts
    ("```Down``` no wait ```Jump```", (2, 3), True),  # ... even when invalid
    ("```dOwN```", (3, 3), False),
    ("```\nDown\n```", (3, 3), False),
    ("Down", (2, 3), True),  # no backticks
    ("```", (2, 3), True),
    ("", (2, 3), True),
    ("x" * 10_000, (2, 3), True),
    ("```" * 3_333, (2, 3), True),
    ("\x00\u2603\U0001f600", (2, 3), True),
])
def test_rllm_parsing(reply: str, moved_to: tuple[int, int], format_error: bool) -> None:
    env = make_frozenlake("rllm")
    env.reset(21)  # player (2, 3), goal (1, 3), hole (2, 2)
    observation, reward, _, truncated, info = env.step(reply)
    assert info["format_error"] is format_error and info["position"] == moved_to
    assert info["turn"] == 1 and not truncated
    assert observation.startswith("Invalid action.") is format_error
    assert info["action_names"] == ([] if format_error else [{(1, 3): "Up", (3, 3): "Down"}[
        moved_to]])
    assert reward == (1.0 if moved_to == (1, 3) else 0.0)
    assert isinstance(info["success"], bool)


@pytest.mark.parametrize(("answer", "executed", "penalised"), [
    ("Down", ["Down"], False),
    ("down || RIGHT", ["Down", "Right"], False),
    ("Down || Jump || Fly", ["Down"], True),  # invalid pieces: penalty once
    ("Jump", [], True),
    ("", [], True),
    ("Down || Down || Right || Right || Up || Up || Left", ["Down", "Down", "Right", "Right",
                                                            "Up"], False),
])
def test_ragen_parsing(answer: str, executed: list[str], penalised: bool) -> None:
    env = open_ragen()
    _, reward, _, _, info = env.step(f"<think>plan</think>\n<answer>{answer}</answer>")
    assert info["action_names"] == executed and info["actions_used"] == len(executed)
    assert info["format_error"] is penalised
    assert reward == pytest.approx(-0.1 if penalised else 0.0)


@pytest.mark.parametrize("reply", [
    "Down", "<answer>Down</answer>", "<think>Down</think>", "<think>a</think> hi <answer>Down"
    "</answer>", "", "x" * 10_000, "<think>" * 2_000,
])
def test_ragen_missing_tags_is_an_invalid_turn(reply: str) -> None:
    env = open_ragen()
    _, reward, terminated, truncated, info = env.step(reply)
    assert info["format_error"] and info["action_names"] == [] and info["turn"] == 1
    assert reward == pytest.approx(-0.1) and not terminated and not truncated


def test_ragen_action_budget_caps_a_turn() -> None:
    env = open_ragen()
    five = "<think></think><answer>" + " || ".join(["Up"] * 5) + "</answer>"
    env.step(five)
    env.step("<think></think><answer>Up || Up || Up</answer>")
    _, _, _, truncated, info = env.step(five)
    assert info["action_names"] == ["Up", "Up"] and info["actions_used"] == 10 and truncated


# ------------------------------------------------------------------------------ dynamics


def test_goal_and_hole_terminate() -> None:
    env = make_frozenlake("rllm")
    env.reset(21)
    _, reward, terminated, truncated, info = env.step("```Up```")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    with pytest.raises(RuntimeError, match="ended"):
        env.step("```Up```")
    env.reset(21)
    assert distance_to_goal(env) == 1
    observation, reward, terminated, truncated, info = env.step("```Left```")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert observation.startswith("You fell into a hole.") and distance_to_goal(env) is None


def test_rllm_truncates_at_two_turns_per_side() -> None:
    env = make_frozenlake("rllm")
    env.reset(21)
    for turn in range(1, 9):
        observation, reward, terminated, truncated, info = env.step("```Right```" if turn % 2
                                                                    else "nonsense")
        assert truncated is (turn == 8) and not terminated and reward == 0.0
    assert "You ran out of turns.\nCurrent observation (turn 8):" in observation
    assert info["success"] is False


def test_anchor_state_names_the_cell_whatever_the_turn() -> None:
    """A cell revisited two turns later: the observation names another turn, the reported
    anchor state (GiGPO's ``env_state``) is the same cell."""
    env = make_frozenlake("rllm")
    env.reset(0)
    set_map(env, ("____", "____", "____", "___G"), (1, 1), (3, 3))
    first, _, _, _, info = env.step("```Right```")
    assert info["anchor_state"] == "1,2"
    env.step("```Left```")
    again, _, _, _, later = env.step("```Right```")
    assert later["anchor_state"] == "1,2" and later["position"] == (1, 2)
    assert first != again  # "(turn 1)" against "(turn 3)"


def test_ragen_truncates_at_five_turns() -> None:
    env = open_ragen()
    for turn in range(1, 6):
        observation, _, terminated, truncated, info = env.step(
            "<think></think><answer>Left</answer>")
        assert truncated is (turn == 5) and not terminated
    assert observation.endswith("You ran out of turns.") and info["success"] is False


def test_ragen_goal_reward_sums_with_penalty_and_stops_the_turn() -> None:
    env = open_ragen()
    set_map(env, ("_G__", "____", "____", "____"), (0, 0), (0, 1))
    _, reward, terminated, _, info = env.step("<think></think><answer>Right || Jump || Left"
                                              "</answer>")
    assert reward == pytest.approx(0.9) and terminated and info["success"]
    assert info["action_names"] == ["Right"]


def test_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        make_frozenlake("rllm").step("```Up```")


# ------------------------------------------------------------------------------ forks


def ragen_outcomes(env: FrozenLakeEnv, replies: list[str]) -> list[tuple[object, ...]]:
    out = []
    for reply in replies:
        if env.done:
            break
        observation, reward, terminated, truncated, info = env.step(reply)
        out.append((observation, reward, terminated, truncated, info))
    return out


def test_forked_slippery_frozenlake_continues_identically() -> None:
    rng = np.random.default_rng(0)
    differs_with_other_rng = 0
    for seed in range(60):
        env = make_frozenlake("ragen")
        env.reset(seed)
        replies = [env.example_reply(rng) for _ in range(5)]
        fork = env.fork()
        reseeded = env.fork()
        reseeded._rng = np.random.default_rng(10**6 + seed)
        assert ragen_outcomes(fork, replies) == ragen_outcomes(env, replies)
        differs_with_other_rng += ragen_outcomes(make_reset(seed), replies) != ragen_outcomes(
            reseeded, replies)
    assert differs_with_other_rng > 20  # the slips matter, so the equality above is a real test


def make_reset(seed: int) -> FrozenLakeEnv:
    env = make_frozenlake("ragen")
    env.reset(seed)
    return env


def test_fork_is_independent() -> None:
    rng = np.random.default_rng(1)
    for seed in range(30):
        env = make_reset(seed)
        env.step("<think></think><answer>Up</answer>")
        if env.done:
            continue
        before = copy.deepcopy(env.__dict__)
        fork = env.fork()
        ragen_outcomes(fork, [fork.example_reply(rng) for _ in range(4)])
        assert fork.turn > env.turn
        assert env.__dict__.keys() == before.keys()
        for name, value in before.items():
            if name == "_rng":
                assert env._rng.bit_generator.state == value.bit_generator.state
            else:
                assert getattr(env, name) == value, name


# ------------------------------------------------------------------------------ helpers


def test_example_replies_are_valid_and_uniform() -> None:
    rng = np.random.default_rng(0)
    for convention in ("rllm", "ragen"):
        counts = dict.fromkeys(ACTION_NAMES, 0)
        env = make_frozenlake(convention)
        env.reset(3)
        for _ in range(400):
            info = env.fork().step(env.example_reply(rng))[4]
            assert not info["format_error"]
        for _ in range(400):
            reply = env.example_reply(rng)
            for name in ACTION_NAMES:
                counts[name] += reply.count(name)
        assert min(counts.values()) > 0.6 * max(counts.values())


def test_corpus_covers_every_word_the_env_emits() -> None:
    def words(text: str) -> set[str]:
        return set(re.findall(WORD_PATTERN, text))

    rng = np.random.default_rng(5)
    for convention in ("rllm", "ragen"):
        config = getattr(FrozenLakeConfig, convention)()
        vocabulary = set().union(*map(words, frozenlake_corpus(config, n_seeds=20)))
        env = FrozenLakeEnv(config)
        emitted = words(env.system_prompt)
        for seed in range(1000, 1100):
            emitted |= words(env.reset(seed))
            while not env.done:
                reply = env.example_reply(rng)
                emitted |= words(reply) | words(env.step(reply if rng.random() < 0.7
                                                         else "junk")[0])
        assert emitted <= vocabulary, emitted - vocabulary


# ------------------------------------------------------------------------------ baselines


def bfs_reply(env: FrozenLakeEnv) -> str:
    distance = distance_to_goal(env)
    assert distance is not None
    for name, (d_row, d_col) in zip(ACTION_NAMES, ((0, -1), (1, 0), (0, 1), (-1, 0)),
                                    strict=True):
        row, col = env.position[0] + d_row, env.position[1] + d_col
        if 0 <= row < env.size and 0 <= col < env.size and shortest_path_length(
                env.grid, (row, col), env.goal) == distance - 1:
            return f"```{name}```"
    raise AssertionError("no move shortens the path")


def success_rate(policy: str, seeds: range) -> float:
    rng = np.random.default_rng(0)
    env = make_frozenlake("rllm")
    successes = 0
    for seed in seeds:
        env.reset(seed)
        info: dict[str, object] = {}
        while not env.done:
            reply = env.example_reply(rng) if policy == "random" else bfs_reply(env)
            info = env.step(reply)[4]
        successes += bool(info["success"])
    return successes / len(seeds)


def test_rllm_random_and_optimal_success_rates() -> None:
    random_rate = success_rate("random", range(300))
    optimal_rate = success_rate("optimal", range(300))
    assert 0.08 <= random_rate <= 0.30, random_rate  # ENVIRONMENTS.md: roughly one in six
    assert optimal_rate >= 0.95, optimal_rate


def test_expert_reply_with_full_skill_always_solves_rllm_maps() -> None:
    rng = np.random.default_rng(0)
    env = make_frozenlake("rllm")
    for seed in range(30):
        env.reset(seed)
        done = False
        while not done:
            reply = env.expert_reply(rng, skill=1.0)
            assert reply.is_expert
            _, _, terminated, truncated, info = env.step(reply.text)
            assert not info["format_error"]
            done = terminated or truncated
        assert info["success"], seed


def test_expert_reply_skill_zero_is_random_and_bad_skill_is_rejected() -> None:
    rng = np.random.default_rng(1)
    env = make_frozenlake("rllm")
    env.reset(3)
    replies = [env.expert_reply(rng, skill=0.0) for _ in range(200)]
    assert {r.text for r in replies} == {f"```{a}```" for a in ACTION_NAMES}
    best = {f"```{ACTION_NAMES[i]}```" for i in env.planner_actions(env.position)}
    # is_expert marks exactly the replies that are a planner's best move here
    assert all(r.is_expert == (r.text in best) for r in replies)
    assert any(r.is_expert for r in replies) and not all(r.is_expert for r in replies)
    with pytest.raises(ValueError, match="skill"):
        env.expert_reply(rng, skill=1.5)
    ragen = make_frozenlake("ragen")
    ragen.reset(0)
    assert re.fullmatch(r"<think>.*</think><answer>.+</answer>", ragen.expert_reply(rng, 0.5).text)


def test_expert_explanation_with_safe_moves_is_the_safe_views_header_line() -> None:
    from treeroll.views import cell_coordinates_safe

    env = make_frozenlake("rllm")
    rng = np.random.default_rng(0)
    listed = set()
    for seed in range(40):
        observation = env.reset(seed)
        while not env.done:
            reply = env.expert_reply(rng, 0.7, explain=True, safe_moves=True).text
            line = reply.split("\n")[0]
            assert line == cell_coordinates_safe(observation, False).split("\n")[1]
            assert env.expert_reply(rng, 1.0, explain=True).text.split("\n")[0] == \
                " ".join(line.split(" ")[:2])  # without safe_moves: the two cells only
            listed.add(len(line.split(" safe")[1].split()))
            observation = env.step(reply)[0]
    assert {1, 2, 3} <= listed  # lists of several lengths were checked
