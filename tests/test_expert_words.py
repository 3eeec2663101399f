"""FrozenLake's expert explains in words for a model that reads the plain view."""

from __future__ import annotations

import re

import numpy as np
import pytest

from treeroll.envs import make_frozenlake
from treeroll.training.sft import SFTDataConfig


def test_words_explanation_names_the_cells_counted_from_one_and_the_safe_moves() -> None:
    env = make_frozenlake("rllm")
    env.reset(654571)
    row, column = env.position
    goal_row, goal_column = env.goal
    text = env.expert_reply(np.random.default_rng(0), explain="words", safe_moves=True).text
    first, action = text.split("\n")
    assert first.startswith(f"I am at row {row + 1}, column {column + 1}; the goal is at row "
                            f"{goal_row + 1}, column {goal_column + 1}.")
    safe = re.search(r"Safe moves: (.*)\.$", first)
    assert safe is not None
    moves = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
    size = len(env.grid)
    expected = [name for name, (dr, dc) in moves.items()
                if 0 <= row + dr < size and 0 <= column + dc < size
                and env.grid[row + dr][column + dc] != "O"]
    assert safe.group(1).split(", ") == expected  # in the order Up, Down, Left, Right
    assert re.fullmatch(r"```(Up|Down|Left|Right)```", action)
    # the same reply in cell words is what the cell_coordinates views read
    cells = env.expert_reply(np.random.default_rng(0), explain=True, safe_moves=True).text
    assert cells.startswith(f"P@{row},{column} G@{goal_row},{goal_column} safe")
    assert cells.split("\n")[1] == action  # same decision, same rng draws


def test_an_unknown_explanation_style_is_refused() -> None:
    env = make_frozenlake("rllm")
    env.reset(3)
    with pytest.raises(ValueError, match="valid: True, 'cells', 'words'"):
        env.expert_reply(np.random.default_rng(0), explain="poetry")


def test_sft_data_passes_the_style_only_when_explaining() -> None:
    assert SFTDataConfig(explain=True, explain_style="words").expert_explain == "words"
    assert SFTDataConfig(explain=False, explain_style="words").expert_explain is False
