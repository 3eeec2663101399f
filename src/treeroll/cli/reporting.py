"""Showing progress: rich bars on a terminal, plain lines in a log file.

Both reporters implement :class:`treeroll.training.evaluation.Reporter`: ``phase(text, total)``
starts a phase, ``advance(done, info)`` says how many of its units are done, with live figures
in ``info``. :func:`make_reporter` picks one for a console: rich bars when it is a terminal,
:class:`PlainReporter` lines otherwise (``treeroll train ... > log.txt 2>&1``), where rich would
print its bars only at the end, cut at 80 columns.

The figures read from ``info``, each shown only when present (:data:`FIGURES`): ``success``
and ``reward`` (means over the step's leaves), ``tokens`` (cumulative generated tokens),
``saved`` (share 0..1 of a chain baseline's tokens the tree saved) and ``loss``.
"""

from __future__ import annotations

import datetime
import numbers
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

if TYPE_CHECKING:
    from treeroll.training.evaluation import Reporter

__all__ = ["FIGURES", "PlainReporter", "RichReporter", "format_figures", "make_reporter"]

FIGURES: dict[str, Callable[[float], str]] = {
    "success": lambda value: f"success {value:.2f}",
    "reward": lambda value: f"reward {value:.2f}",
    "tokens": lambda value: f"tokens {value:,.0f}",
    "saved": lambda value: f"saved {100 * value:.0f}%",
    "loss": lambda value: f"loss {value:.3f}",
}
"""The ``info`` keys a reporter shows, in this order, and how each is written."""


def format_figures(info: dict[str, Any]) -> str:
    """``success 0.52  reward 0.52  tokens 31,402  saved 74%  loss -0.012``: the figures of
    :data:`FIGURES` present in ``info`` as numbers (others are left out)."""
    return "  ".join(write(info[key]) for key, write in FIGURES.items()
                     if isinstance(info.get(key), numbers.Real)
                     and not isinstance(info[key], bool))


def _clock_text(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(max(seconds, 0.0))))


def _label_and_unit(text: str) -> tuple[str, str]:
    """A short label for a phase's lines and the name of its units, from its text:
    ``training with tree_grpo`` -> (``train``, ``step``); ``evaluating ... 64 held-out tasks``
    -> (``eval``, ``task``); otherwise the text's first word and ``step``."""
    words = text.split()
    first = words[0] if words else "progress"
    label = {"training": "train", "evaluating": "eval"}.get(first, first)
    unit = "task" if first == "evaluating" else "step"
    return label, unit


class PlainReporter:
    """One plain line per reported unit, at most one every ``min_interval`` seconds.

    ``phase`` prints its text; ``advance`` prints e.g. ``train  step 12/240  success 0.52
    reward 0.52  tokens 31,402  saved 74%  loss -0.012  elapsed 0:00:41  eta 0:07:30``. The
    first ``advance`` of a phase and the one that reaches its total always print; others only
    when ``min_interval`` seconds have passed since the last line. ``elapsed`` counts from the
    phase's start; ``eta`` extrapolates the rate since the phase's first ``advance`` (so a
    resumed run's earlier steps do not count). A phase started again with the same text and
    total (training again after an evaluation) continues its clock. Lines are flushed.
    """

    def __init__(self, file: IO[str] | None = None, *, min_interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.file = file if file is not None else sys.stderr
        self.min_interval = min_interval
        self.clock = clock
        self._text: str | None = None
        self._total: int | None = None
        self._label, self._unit = "progress", "step"
        self._started = 0.0
        self._first: tuple[int, float] | None = None  # (done, time) of the first advance
        self._last_line: float | None = None
        self._finished = False
        self._clocks: dict[tuple[str, int | None], tuple[float, tuple[int, float] | None]] = {}

    def _write(self, line: str) -> None:
        print(line, file=self.file, flush=True)

    def phase(self, text: str, total: int | None = None) -> None:
        """Print ``text``; the lines that follow are labelled from it."""
        if self._text is not None:
            self._clocks[(self._text, self._total)] = (self._started, self._first)
        self._started, self._first = self._clocks.get((text, total), (self.clock(), None))
        self._text, self._total = text, total
        self._label, self._unit = _label_and_unit(text)
        self._last_line, self._finished = None, False
        self._write(text)

    def advance(self, done: int, info: dict[str, Any]) -> None:
        """Print a line if this is the phase's first or last unit or one is due."""
        now = self.clock()
        if self._first is None:
            self._first = (done, now)
        last = self._total is not None and done >= self._total and not self._finished
        due = self._last_line is None or now - self._last_line >= self.min_interval
        if not (last or due):
            return
        self._finished = self._finished or last
        self._last_line = now
        count = f"{done}/{self._total}" if self._total is not None else f"{done}"
        parts = [self._label, f"{self._unit} {count}", format_figures(info),
                 f"elapsed {_clock_text(now - self._started)}"]
        first_done, first_time = self._first
        if self._total is not None and first_done < done < self._total and now > first_time:
            rate = (done - first_done) / (now - first_time)  # units per second
            parts.append(f"eta {_clock_text((self._total - done) / rate)}")
        self._write("  ".join(part for part in parts if part))


class RichReporter:
    """Progress bars with elapsed time, ETA and the live figures of :data:`FIGURES`."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self._tasks: dict[tuple[str, int | None], TaskID] = {}

    def phase(self, text: str, total: int | None = None) -> None:
        """Start a new bar; a phase started before with the same text and total (training
        again after an evaluation) continues its bar. A bar without a total (a pulsing line)
        is removed when the next phase starts."""
        previous = next((key for key, task in self._tasks.items() if task == self.task), None)
        if previous is not None and previous[1] is None and self.task is not None:
            self.progress.update(self.task, visible=False)
        if (text, total) not in self._tasks:
            self._tasks[(text, total)] = self.progress.add_task(text, total=total, info="")
        self.task = self._tasks[(text, total)]

    def advance(self, done: int, info: dict[str, Any]) -> None:
        """Move the bar and show the live figures."""
        if self.task is None:
            return
        self.progress.update(self.task, completed=done, info=format_figures(info))


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    TextColumn("{task.fields[info]}"), console=console)


@contextmanager
def make_reporter(console: Console, *, min_interval: float = 5.0) -> Iterator[Reporter]:
    """A reporter for ``console`` for the duration of a ``with`` block: rich bars when it is a
    terminal, otherwise :class:`PlainReporter` lines (at most one every ``min_interval``
    seconds) written to its file.

    >>> with make_reporter(Console(stderr=True)) as reporter:
    ...     summary = train(config, reporter)  # doctest: +SKIP
    """
    if not console.is_terminal:
        yield PlainReporter(console.file, min_interval=min_interval)
        return
    with _progress(console) as progress:
        yield RichReporter(progress)
