"""Observation views: how an environment's text is shown to a policy, before tokenisation.

A view is a function ``(text, first) -> text`` (registered as a :class:`View` record, which
also says what a from-scratch tokenizer needs for it; a plain function is taken as a view
that needs nothing) applied by
:class:`treeroll.formatting.TurnFormat` to every observation it encodes (``first`` is True for
the task's first observation, in the prompt), in supervised fine-tuning, rollouts and
evaluation alike, so SFT and RL contexts stay token-identical. The environment,
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
* ``cell_coordinates_compact`` -- ``cell_coordinates`` with every grid headed by one line that
  names the player's cell and the goal's (``P@3,3 G@5,6``); after the first observation that
  line replaces the grid, other lines kept. A FrozenLake map never changes during an
  episode, only the player moves, so the history still holds everything the full grids
  would show (a choice about how much of the history the policy reads: about a tenth of the
  tokens per turn, and where the player and the goal are stands right before the reply; the
  holes must still be read from the first grid).
* ``cell_coordinates_safe`` -- ``cell_coordinates_compact`` whose header line also lists, after
  the word ``safe``, the actions that land on ice or the goal from the player's cell
  (``P@5,3 G@5,6 safe Up Left``; a move into a hole or off the map is left out), in every
  observation. It is a function of the observation alone (the grid the environment shows),
  computed afresh each turn, and it names what the compact view leaves to a lookup into the
  first grid: a policy that acts from the list never steps into a hole next to it. The
  shipped ``frozenlake-tiny`` reads this view (``docs/sft_recipe/README.md``: with it, RL
  learns to use the list; without it, the base's failures are steps into holes it was shown
  only in the first grid).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from treeroll.registry import Registry

__all__ = ["CELL_WORD_PATTERN", "VIEWS", "GridEnv", "ObservationView", "View", "as_view",
           "cell_coordinates", "cell_coordinates_compact", "cell_coordinates_safe", "cell_words",
           "plain"]

ObservationView = Callable[[str, bool], str]
"""Maps an observation text (and whether it is the task's first) to the text the policy
reads."""


@dataclass(frozen=True)
class View:
    """An observation view's registration record: the view itself (the record is called as
    the view is) and what a from-scratch policy needs to read through it."""

    observe: ObservationView
    """The view: ``(text, first) -> text``."""
    words: Callable[[object], str] | None = None
    """Given the environment, a text of the words the view writes that the environment's own
    texts may not show (every cell word of its largest map), added to a from-scratch word
    tokenizer; None: the environment's texts seen through the view hold every word."""
    word_pattern: str | None = None
    """A regex of those words: a word-level tokenizer keeps each one whole."""
    coordinate_words: bool = False
    """Its words are ``<symbol>@<row>,<column>``: a from-scratch model starts them on
    embeddings where the row and the column are linear features
    (:func:`treeroll.policies.init_cell_embeddings`)."""

    def __call__(self, text: str, first: bool = True) -> str:
        """The text the policy reads for observation ``text``."""
        return self.observe(text, first)


@runtime_checkable
class GridEnv(Protocol):
    """What the cell views ask of an environment, optionally: the side of the largest square
    map it draws, so that a from-scratch tokenizer holds a word for every cell
    (:func:`cell_words`). FrozenLake has it; for an environment without it, 9 (rLLM's
    largest) is assumed."""

    @property
    def largest_side(self) -> int:
        """The side of the largest map the environment draws."""
        ...


_CELLS = "_POGX\u221a"
_RLLM_ROW = re.compile(rf"^[{_CELLS}](?:  [{_CELLS}])+$")
_RAGEN_ROW = re.compile(rf"^[{_CELLS}]{{2,}}$")

CELL_WORD_PATTERN = rf"[{_CELLS}]@[0-9]+,[0-9]+"
"""The words :func:`cell_coordinates` writes (a word-level tokenizer keeps each one whole)."""


def plain(text: str, first: bool = True) -> str:
    """The observation unchanged."""
    return text


def cell_coordinates(text: str, first: bool = True) -> str:
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


def cell_coordinates_compact(text: str, first: bool = True) -> str:
    """:func:`cell_coordinates`, with each grid headed by a line naming the player's cell and
    the goal's (``P@3,3 G@5,6``); in every observation after the first, that line replaces
    the grid."""
    return _compact(cell_coordinates(text), first)


def _compact(cells_text: str, first: bool) -> str:
    """:func:`cell_coordinates_compact` of a text already in cell words."""
    out: list[str] = []
    grid: list[str] = []

    def flush() -> None:
        if not grid:
            return
        cells = [cell for line in grid for cell in line.split(" ")]
        player = [c for c in cells if c[0] in _PLAYER][:1]
        goal = [c for c in cells if c[0] == "G"][:1]
        out.append(" ".join(player + goal))
        if first:
            out.extend(grid)
        grid.clear()

    for line in cells_text.split("\n"):
        cells = line.split(" ")
        if cells and all(_CELL_WORD.fullmatch(cell) for cell in cells):
            grid.append(line)
            continue
        flush()
        out.append(line)
    flush()
    return "\n".join(out)


_MOVES = (("Up", (-1, 0)), ("Down", (1, 0)), ("Left", (0, -1)), ("Right", (0, 1)))
_SAFE = ("_", "G")  # the symbols a move may land on without ending the episode in a hole


def cell_coordinates_safe(text: str, first: bool = True) -> str:
    """:func:`cell_coordinates_compact` with ``safe`` and the actions that land on ice or the
    goal (in the order Up, Down, Left, Right) appended to the header line
    (``P@5,3 G@5,6 safe Up Left``), read from the grid of this observation."""
    cells_text = cell_coordinates(text)  # converted once, for the symbols and the view
    symbols: dict[tuple[int, int], str] = {}
    for word in cells_text.replace("\n", " ").split(" "):
        if _CELL_WORD.fullmatch(word):
            cell_row, cell_column = word[2:].split(",")
            symbols[(int(cell_row), int(cell_column))] = word[0]
    lines = _compact(cells_text, first).split("\n")
    for index, line in enumerate(lines):
        words = line.split(" ")
        if len(words) <= 2 and words[0][:1] in _PLAYER and _CELL_WORD.fullmatch(words[0]):
            row, column = (int(x) for x in words[0][2:].split(","))
            safe = [name for name, (dr, dc) in _MOVES
                    if symbols.get((row + dr, column + dc), "") in _SAFE]
            lines[index] = " ".join([*words, "safe", *safe])
            break
    return "\n".join(lines)


_CELL_WORD = re.compile(CELL_WORD_PATTERN)
_PLAYER = "PX\u221a"


def cell_words(env: object) -> str:
    """Every cell word ``<symbol>@<row>,<column>`` of the largest map ``env`` draws (a
    :class:`GridEnv`'s ``largest_side``; 9 for an environment that does not say)."""
    side = int(env.largest_side) if isinstance(env, GridEnv) else 9
    return " ".join(f"{cell}@{row},{column}" for cell in _CELLS
                    for row in range(side) for column in range(side))


def as_view(view: View | ObservationView) -> View:
    """``view`` as a :class:`View` record: a plain function (a user's
    ``package.module:function``, or one registered as it is) is a view that needs nothing
    of a from-scratch tokenizer."""
    return view if isinstance(view, View) else View(view)


def _cell_view(observe: ObservationView) -> View:
    return View(observe, words=cell_words, word_pattern=CELL_WORD_PATTERN,
                coordinate_words=True)


VIEWS: Registry[View] = Registry("observation view")
"""View name -> :class:`View` (:func:`as_view` reads a plain function as one)."""
VIEWS.register("plain", View(plain))
VIEWS.register("cell_coordinates", _cell_view(cell_coordinates))
VIEWS.register("cell_coordinates_compact", _cell_view(cell_coordinates_compact))
VIEWS.register("cell_coordinates_safe", _cell_view(cell_coordinates_safe))
