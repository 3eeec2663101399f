"""Seeing runs: a metrics log's training curves and strategies compared.

Figures are built on :class:`matplotlib.figure.Figure` with an explicit Agg canvas, so importing
this module never changes matplotlib's global backend and works on a machine without a display.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = [
    "DEFAULT_METRIC_KEYS",
    "compare_figure",
    "metrics_figure",
    "plot_compare",
    "plot_metrics",
]

DEFAULT_METRIC_KEYS: tuple[str, ...] = (
    "success_rate", "reward_mean", "loss", "kl", "entropy", "generated_tokens",
)
"""Metrics :func:`plot_metrics` draws by default (those absent from the log are skipped)."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; blank lines skipped, corrupt or non-object lines warned about."""
    records = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                warnings.warn(f"{path}:{number}: skipping corrupt line ({err.msg})",
                              stacklevel=3)
                continue
            if not isinstance(record, dict):
                warnings.warn(f"{path}:{number}: skipping a line that is not a JSON object",
                              stacklevel=3)
                continue
            records.append(record)
    return records


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _empty_figure(message: str) -> Figure:
    fig = Figure(figsize=(6, 3))
    FigureCanvasAgg(fig)
    fig.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, color="#555555")
    return fig


@dataclass(frozen=True)
class _HeldOutPoint:
    """One held-out evaluation in a metrics log (a record's ``eval`` dict), where it is drawn."""

    x: float
    """Its record's ``x``; for a record without one (the step-0 and final evaluations when
    plotting against tokens), the ``x`` of the record before it, or 0 at the start."""
    success_rate: float
    low: float
    """95% Wilson interval (``ci95_low``, ``ci95_high``; the rate itself when absent)."""
    high: float
    tasks: int | None
    final: bool


def _held_out_points(raw: list[dict[str, Any]], positions: list[float | None]
                     ) -> list[_HeldOutPoint]:
    points, last = [], 0.0
    for record, position in zip(raw, positions, strict=True):
        last = position if position is not None else last
        held_out = record.get("eval")
        rate = _number(held_out.get("success_rate")) if isinstance(held_out, dict) else None
        if rate is None or not isinstance(held_out, dict):
            continue
        low, high, tasks = (_number(held_out.get(k)) for k in ("ci95_low", "ci95_high", "tasks"))
        points.append(_HeldOutPoint(last, rate, rate if low is None else low,
                                   rate if high is None else high,
                                   None if tasks is None else int(tasks),
                                   record.get("final") is True))
    return points


def _same_tasks_points(raw: list[dict[str, Any]], positions: list[float | None]
                       ) -> list[_HeldOutPoint]:
    """The evaluations on the in-between evaluations' tasks, start to end: the start's and
    the end's ``eval_during`` (``treeroll train`` reads them on those tasks too) with the
    in-between ``eval`` records; none for a log without ``eval_during``."""
    if not any(isinstance(record.get("eval_during"), dict) for record in raw):
        return []
    keyed = []
    for record in raw:
        if isinstance(record.get("eval_during"), dict):
            keyed.append({"eval": record["eval_during"], "final": record.get("final")})
        elif record.get("step") == 0 or record.get("final") is True:
            keyed.append({})  # an end evaluation on the other task count only
        else:
            keyed.append(record)
    return _held_out_points(keyed, positions)


def _moving_average(values: Sequence[float]) -> tuple[int, list[float]]:
    """Trailing mean over ``window`` steps (an eighth of the run, 3 to 50), from the first full
    window on; no average for a run no longer than one window."""
    window = min(50, max(3, len(values) // 8))
    if len(values) <= window:
        return window, []
    sums = list(itertools.accumulate(values, initial=0.0))
    return window, [(sums[i] - sums[i - window]) / window for i in range(window, len(sums))]


def _with_intervals(points: list[_HeldOutPoint]
                    ) -> tuple[list[float], list[float], list[list[float]]]:
    """``x``, ``y`` and ``yerr`` (below, above) of evaluation points for ``errorbar``."""
    return ([p.x for p in points], [p.success_rate for p in points],
            [[max(0.0, p.success_rate - p.low) for p in points],
             [max(0.0, p.high - p.success_rate) for p in points]])


def _draw_success(ax: Any, series: list[tuple[float, float]],
                  held_out: list[_HeldOutPoint], same_tasks: list[_HeldOutPoint]) -> None:
    """Training success per step, its moving average, and the held-out evaluations with their
    Wilson intervals, each labelled with its task count where that count changes; with
    ``same_tasks``, the evaluations on the in-between tasks joined start to end."""
    if series:
        xs, ys = [p[0] for p in series], [p[1] for p in series]
        ax.plot(xs, ys, marker="." if len(xs) < 60 else "", linewidth=0.9, alpha=0.45,
                color="#56b4e9", label="training (per step)")
        window, averaged = _moving_average(ys)
        if averaged:
            ax.plot(xs[window - 1:], averaged, linewidth=1.8, color="#0072b2",
                    label=f"training ({window}-step mean)")
    if held_out:
        ax.errorbar(*_with_intervals(held_out), fmt="o", markersize=4, capsize=3,
                    color="#d55e00", label="held-out (95% Wilson interval)")
        previous = None
        for index, point in enumerate(held_out):
            if point.tasks is not None and (point.tasks != previous
                                            or index == len(held_out) - 1):
                ax.annotate(f"n={point.tasks}", (point.x, point.high), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=7,
                            color="#d55e00")
            previous = point.tasks
    if same_tasks:
        ax.errorbar(*_with_intervals(same_tasks), fmt="s--", markersize=3, capsize=2,
                    linewidth=0.9, color="#009e73",
                    label=f"the same {same_tasks[0].tasks} tasks throughout")
    ax.set_ylim(-0.03, 1.08)
    ax.legend(fontsize=7, loc="best")


def metrics_figure(metrics_jsonl_path: str | Path, keys: Sequence[str] = DEFAULT_METRIC_KEYS,
                   *, x: str = "step") -> Figure:
    """The figure :func:`plot_metrics` saves (see there); for a caller who wants to inspect
    or restyle it."""
    source = Path(metrics_jsonl_path)
    raw = _read_jsonl(source)
    records = [r for r in raw if _number(r.get(x)) is not None]
    xs = [float(r[x]) for r in records]
    if any(later < earlier for earlier, later in itertools.pairwise(xs)):
        xs = list(itertools.accumulate(xs))  # per-step counts -> cumulative
    by_record = {id(r): px for r, px in zip(records, xs, strict=True)}
    positions = [by_record.get(id(r)) for r in raw]
    held_out = _held_out_points(raw, positions)
    same_tasks = _same_tasks_points(raw, positions)
    panels: dict[str, list[tuple[float, float]]] = {}  # key -> its (x, value) series
    aliases: dict[str, list[str]] = {}  # key -> later keys with the identical series
    for key in keys:
        if key == x or key in panels:
            continue
        series = [(px, value) for px, r in zip(xs, records, strict=True)
                  if (value := _number(r.get(key))) is not None]
        same = next((earlier for earlier, drawn in panels.items() if series and drawn == series),
                    None)
        if same is not None:
            aliases[same].append(key)
        elif series or (key == "success_rate" and held_out):
            panels[key], aliases[key] = series, []
    if not panels:
        warnings.warn(f"{source}: no records with both {x!r} and any of {list(keys)}",
                      stacklevel=2)
        return _empty_figure(f"{source.name}: nothing to plot against {x!r}")
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(4.2 * columns, 3.0 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False)
    for index, (key, series) in enumerate(panels.items()):
        ax = axes[index // columns][index % columns]
        if key == "success_rate":
            _draw_success(ax, series, held_out, same_tasks)
            ax.set_ylim(-0.03, 1.03)  # a rate: never an axis past 1
        else:
            ax.plot([p[0] for p in series], [p[1] for p in series],
                    marker="." if len(series) < 60 else "", linewidth=1.4, color="#0072b2")
        same = f" (= {', '.join(aliases[key])})" if aliases[key] else ""
        ax.set_title(f"{key}{same}", fontsize=10)
        ax.set_xlabel(x.replace("_", " "))
        if x == "step":  # steps are whole numbers: no ticks at half steps
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    fig.suptitle(f"{source.name} ({len(records)} records)", fontsize=11)
    return fig


def plot_metrics(metrics_jsonl_path: str | Path, out_png: str | Path,
                 keys: Sequence[str] = DEFAULT_METRIC_KEYS, *, x: str = "step") -> Path:
    """Plot each of ``keys`` present in a metrics JSONL log against ``x``; return the PNG path.

    One subplot per key found in at least one record, except a key whose series is identical
    to an earlier panel's (on FrozenLake ``reward_mean`` is ``success_rate``): that panel's
    title names it instead. The ``success_rate`` panel shows training success per step with
    its moving average and the held-out evaluations (records with an ``eval`` dict: the
    step-0, periodic and final ones) as points with their 95% Wilson intervals, labelled with
    their task counts. ``x`` is a record key, ``step`` (default) or e.g. ``generated_tokens``;
    it should be cumulative; if it ever decreases it is taken to be a per-step count and
    summed. Blank lines and records lacking ``x`` are skipped (an evaluation in such a record
    is drawn at the ``x`` of the record before it); corrupt lines are skipped with a warning.
    A log with nothing to plot gives a PNG saying so.
    """
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    metrics_figure(metrics_jsonl_path, keys, x=x).savefig(out, format="png", dpi=110)
    return out


_STRATEGY_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
                     "#000000", "#f0e442")


def plot_compare(results: Mapping[str, Sequence[tuple[float, float, float, float]]],
                 out_png: str | Path, xlabel: str = "generated tokens",
                 ylabel: str = "held-out success") -> Path:
    """One line per strategy of ``(x, mean, lo, hi)`` points with a shaded 95% band; return
    the PNG path (:func:`compare_figure` draws it)."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    compare_figure(results, xlabel, ylabel).savefig(out, format="png", dpi=110)
    return out


def compare_figure(results: Mapping[str, Sequence[tuple[float, float, float, float]]],
                   xlabel: str = "generated tokens", ylabel: str = "held-out success"
                   ) -> Figure:
    """:func:`plot_compare`'s figure. Points are sorted by x; a strategy with no points is
    left out. A success rate's bands are clipped to [0, 1] and so is its axis; where no point
    has an interval (one seed) the legend says so instead of naming a band."""
    drawn = {name: sorted(points) for name, points in results.items() if points}
    if not drawn:
        return _empty_figure("no results to compare")
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    rate = "success" in ylabel  # a rate: bands and axis inside [0, 1]
    banded = any(p[2] != p[3] for points in drawn.values() for p in points)
    for index, (name, points) in enumerate(drawn.items()):
        colour = _STRATEGY_COLOURS[index % len(_STRATEGY_COLOURS)]
        xs = [p[0] for p in points]
        low = [max(p[2], 0.0) if rate else p[2] for p in points]
        high = [min(p[3], 1.0) if rate else p[3] for p in points]
        ax.fill_between(xs, low, high, color=colour, alpha=0.18, linewidth=0)
        ax.plot(xs, [p[1] for p in points], marker="o", markersize=3.5, color=colour,
                linewidth=1.6, label=name)
    if rate:
        ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(title="strategy (band: 95% CI)" if banded else "strategy (one seed: no "
              "interval)", fontsize=9, title_fontsize=9)
    return fig
