"""Observation views: how an environment's text is shown to a policy, before tokenisation.

A view is a function ``text -> text`` applied by :class:`treeroll.formatting.TurnFormat` to
every observation it encodes (the first one and every later one), in supervised fine-tuning,
rollouts and evaluation alike, so SFT and RL contexts stay token-identical. The environment,
its rewards and its parsing are untouched: a view changes what the *policy* reads, and a
policy folder records the view it was trained with (``treeroll.json``), so loading the policy
brings its view along.

* ``plain`` -- the environment's text as it is (the default; what a real model should see).
* ``cell_coordinates`` -- every cell of a FrozenLake grid becomes one word naming the cell and
  its coordinates (``P@2,3`` = the player in row 2, column 3), so that one token says where
  the player, the goal or a hole is. The shipped ``frozenlake-tiny`` policy reads grids this
  way: per-cell coordinate tokens make a maze linearly decodable in small transformers
  (Ivanitskiy et al., arXiv 2312.02566), where the flattened grid has to be counted out.
  Both conventions' grids are recognised: rLLM rows (cells joined by two spaces) and RAGEN
  rows (cells side by side).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from treeroll.registry import Registry

__all__ = ["CELL_WORD_PATTERN", "VIEWS", "ObservationView", "cell_coordinates", "plain"]

ObservationView = Callable[[str], str]
"""Maps an observation text to the text the policy reads."""

_CELLS = "_POGX\u221a"
_RLLM_ROW = re.compile(rf"^[{_CELLS}](?:  [{_CELLS}])+$")
_RAGEN_ROW = re.compile(rf"^[{_CELLS}]{{2,}}$")

CELL_WORD_PATTERN = rf"[{_CELLS}]@[0-9]+,[0-9]+"
"""The words :func:`cell_coordinates` writes (a word-level tokenizer keeps each one whole)."""


def plain(text: str) -> str:
    """The observation unchanged."""
    return text


def cell_coordinates(text: str) -> str:
    """Every grid cell as ``<symbol>@<row>,<column>`` (0-based, rows counted from the top of
    each grid), cells of a row joined by one space; other lines unchanged.

    A grid is a run of consecutive lines that are all rLLM rows or all RAGEN rows of one
    width; any other line ends it (so the next grid starts again at row 0)."""
    out: list[str] = []
    row, width = 0, -1
    for line in text.split("\n"):
        if _RLLM_ROW.match(line):
            cells = line.split("  ")
        elif _RAGEN_ROW.match(line):
            cells = list(line)
        else:
            row, width = 0, -1
            out.append(line)
            continue
        if len(cells) != width:  # a grid of another width starts here
            row, width = 0, len(cells)
        out.append(" ".join(f"{cell}@{row},{column}" for column, cell in enumerate(cells)))
        row += 1
    return "\n".join(out)


VIEWS: Registry[ObservationView] = Registry("observation view")
VIEWS.register("plain", plain)
VIEWS.register("cell_coordinates", cell_coordinates)
