"""Observation views: what they write, and that the turn format applies them everywhere."""

from __future__ import annotations

import pytest

from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.policies import build_policy
from treeroll.policies.model import ModelConfig
from treeroll.views import (
    VIEWS,
    cell_coordinates,
    cell_coordinates_compact,
    cell_coordinates_safe,
    plain,
)

RLLM = ("Current observation (turn 0):\n_  P  O\nO  _  G\n_  _  _\n"
        "You have 6 turns to reach the goal.")


def test_cell_coordinates_names_every_cell_and_leaves_other_lines() -> None:
    assert cell_coordinates(RLLM) == (
        "Current observation (turn 0):\n_@0,0 P@0,1 O@0,2\nO@1,0 _@1,1 G@1,2\n"
        "_@2,0 _@2,1 _@2,2\nYou have 6 turns to reach the goal.")
    # RAGEN rows (cells side by side), and a second grid starts again at row 0
    assert cell_coordinates("State:\nG_\nP_\nnext\n_P\nG_") == (
        "State:\nG@0,0 _@0,1\nP@1,0 _@1,1\nnext\n_@0,0 P@0,1\nG@1,0 _@1,1")
    assert plain(RLLM) == RLLM


def test_compact_view_heads_the_first_grid_and_replaces_later_ones() -> None:
    first = cell_coordinates_compact(RLLM, True)
    assert first.splitlines()[1] == "P@0,1 G@1,2"
    assert first.splitlines()[2:5] == cell_coordinates(RLLM).splitlines()[1:4]
    later = cell_coordinates_compact(RLLM.replace("turn 0", "turn 1"), False)
    assert later == ("Current observation (turn 1):\nP@0,1 G@1,2\n"
                     "You have 6 turns to reach the goal.")


def test_safe_view_lists_the_moves_that_land_on_ice_or_the_goal_in_every_observation() -> None:
    # P@0,1: Up is off the map, Down lands on ice, Left on ice, Right on a hole
    first = cell_coordinates_safe(RLLM, True)
    assert first.splitlines()[1] == "P@0,1 G@1,2 safe Down Left"
    assert first.splitlines()[2:] == cell_coordinates_compact(RLLM, True).splitlines()[2:]
    # later turns: the list is recomputed from that observation's grid
    moved = RLLM.replace("turn 0", "turn 1").replace("_  P  O\nO  _  G", "_  _  O\nO  P  G")
    assert cell_coordinates_safe(moved, False) == (
        "Current observation (turn 1):\nP@1,1 G@1,2 safe Up Down Right\n"
        "You have 6 turns to reach the goal.")
    # no grid: the text is unchanged
    assert cell_coordinates_safe("You reached the goal.", False) == "You reached the goal."


def test_turn_format_applies_the_view_to_every_observation() -> None:
    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=3)
    policy = build_policy(None, ModelConfig(hidden_size=16, num_layers=1, num_heads=2,
                                            intermediate_size=32),
                          "cell_coordinates_compact", make_env)
    turn_format = policy.turn_format()
    env = make_env()
    prompt_ids, prompt_text = turn_format.prompt(env.system_prompt, env.reset(4))
    assert "@" in prompt_text and "_  " not in prompt_text
    tokens = policy.tokenizer.convert_ids_to_tokens(prompt_ids)
    assert "<unk>" not in tokens and sum("@" in t for t in tokens) == 9 + 2  # cells + header
    observation = env.step("```Up```")[0]
    ids, text = turn_format.observation(observation, action_ended_turn=True)
    assert text.count("@") == 2 and "<unk>" not in policy.tokenizer.convert_ids_to_tokens(ids)
    plain_format = TurnFormat(policy.tokenizer)
    assert plain_format.prompt(env.system_prompt, env.reset(4))[1].count("@") == 0


def test_unknown_view_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="cell_coordinates_compact"):
        VIEWS.get("nope")
