"""Statistics of the comparisons: t-intervals over seeds, and sample efficiency.

:func:`t_interval`: the mean over seeds and its 95% Student-t interval (the quantile by
bisection on the exact CDF: treeroll does not depend on scipy).

Sample efficiency: the generated tokens a training run needs to reach a held-out success.

A run's *curve* is its held-out success at each evaluation against the generated tokens
spent by then: ``[(tokens, success), ...]``, starting at ``(0, start success)``. The tokens
to reach a target are read off it by linear interpolation between the last evaluation below
the target and the first at or above it (a curve is known only at its evaluations, so the
crossing between them is an estimate; the report says so). A run that never reaches the
target has no such number: it is *never*, not its total.

Over seeds, :func:`tokens_to_target` gives the mean over seeds with a percentile bootstrap 95%
interval (seeds resampled with replacement; a resample holding a seed that never reached the
target has no mean, and counts as above every number: the interval's upper end is then
*never* when more than 2.5% of resamples hold one). :func:`ratio_to` does the same for the
ratio of two strategies' means, their seeds resampled independently. Written here rather than
taken from ``scipy.stats.bootstrap``: treeroll does not depend on scipy, and that function has
no notion of a run that never reaches the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Reach", "crossing", "ratio_to", "t_interval", "t_quantile", "target_section",
           "tokens_to_target"]

NEVER = math.inf
RESAMPLES = 4000


def crossing(curve: Sequence[tuple[float, float]], target: float) -> float:
    """Tokens at which ``curve`` first reaches ``target``, interpolated linearly between the
    two evaluations around the crossing; ``inf`` if it never does."""
    previous: tuple[float, float] | None = None
    for tokens, success in curve:
        if success >= target - 1e-12:
            if previous is None or previous[1] >= target:
                return float(tokens)
            (t0, s0), (t1, s1) = previous, (tokens, success)
            return float(t0 + (target - s0) * (t1 - t0) / (s1 - s0))
        previous = (tokens, success)
    return NEVER


@dataclass(frozen=True)
class Reach:
    """Tokens to a target over seeds: the mean (``inf``: some seed never reached it), its
    bootstrap 95% interval (``inf`` ends: never; ``nan`` for one seed: no interval), and how
    many seeds reached it. With two or three seeds the percentile bootstrap is crude (its
    ends are near the seeds' extremes)."""

    tokens: float
    low: float
    high: float
    reached: int
    seeds: int

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: ``None`` for never."""
        def shown(x: float) -> float | None:
            return None if math.isinf(x) else round(x, 1)
        interval = None if self.seeds < 2 else [shown(self.low), shown(self.high)]
        return {"tokens": shown(self.tokens), "ci95": interval, "reached": self.reached,
                "seeds": self.seeds}

    def text(self) -> str:
        """``95,270 [81,000, 120,300]`` or ``never (3 of 8 seeds)``."""
        def shown(x: float) -> str:
            return "never" if math.isinf(x) else f"{x:,.0f}"
        if math.isinf(self.tokens):
            return f"never ({self.reached} of {self.seeds} seeds reached it)"
        if self.seeds < 2:
            return f"{shown(self.tokens)} (one seed)"
        return f"{shown(self.tokens)} [{shown(self.low)}, {shown(self.high)}]"


def _bootstrap_means(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return values[picks].mean(axis=1)  # inf where a never was drawn


def _interval(samples: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(samples, [2.5, 97.5], method="lower")  # inf-safe
    return float(low), float(high)


def tokens_to_target(curves: Sequence[Sequence[tuple[float, float]]], target: float,
                     seed: int = 0) -> Reach:
    """:class:`Reach` of ``target`` over the seeds' ``curves`` (at least one)."""
    if not curves:
        raise ValueError("tokens_to_target needs the curve of at least one run")
    values = np.array([crossing(c, target) for c in curves], dtype=float)
    reached = int(np.isfinite(values).sum())
    low, high = _interval(_bootstrap_means(values, np.random.default_rng(seed)))
    return Reach(float(values.mean()), low, high, reached, len(values))


def ratio_to(curves: Sequence[Sequence[tuple[float, float]]],
             reference: Sequence[Sequence[tuple[float, float]]], target: float,
             seed: int = 0) -> tuple[float, float, float]:
    """The ratio of the mean tokens to ``target`` of ``curves`` over those of ``reference``
    (``(ratio, low, high)``, a bootstrap 95% interval, seeds resampled independently on each
    side); ``inf`` where ``curves`` never reach it, ``nan`` where the reference never does
    (or either side has no run)."""
    if not curves or not reference:
        return math.nan, math.nan, math.nan
    mine = np.array([crossing(c, target) for c in curves], dtype=float)
    theirs = np.array([crossing(c, target) for c in reference], dtype=float)
    if not np.isfinite(theirs).all() or theirs.mean() <= 0:  # never, or at the start
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample of starts only
        samples = _bootstrap_means(mine, rng) / _bootstrap_means(theirs, rng)
    samples = np.where(np.isnan(samples), math.inf, samples)
    low, high = _interval(samples)
    return float(mine.mean() / theirs.mean()), low, high


def target_section(results: dict[str, list[dict[str, object]]], targets: Sequence[float],
                   reference: str = "chain") -> tuple[list[str], dict[str, object]]:
    """The report's *tokens to target* table (markdown lines) and its JSON: per strategy and
    target, :func:`tokens_to_target` of its runs' ``curve`` and, beside ``reference``'s runs,
    :func:`ratio_to`."""
    if not targets:
        return [], {}
    curves = {arm: [list(map(tuple, run["curve"]))  # type: ignore[call-overload]
                    for run in runs] for arm, runs in results.items()}
    lines = ["", "## Generated tokens to reach a held-out success", "",
             "Mean over seeds with a bootstrap 95% interval (seeds resampled; *never*: a seed "
             "did not reach it in its run); each run's crossing interpolated linearly between "
             "the two evaluations around it." + (f" Ratio: over {reference}'s mean, seeds "
                                                 "resampled on both sides." if reference in
                                                 curves else ""), "",
             "| strategy | " + " | ".join(f"to {t:.2f}" for t in targets) + " |",
             "|---|" + "---|" * len(targets)]
    found: dict[str, object] = {}
    for arm, arm_curves in curves.items():
        cells, per_target = [], {}
        for target in targets:
            reach = tokens_to_target(arm_curves, target)
            entry = reach.as_dict()
            cell = reach.text()
            if reference in curves and arm != reference:
                ratio, low, high = ratio_to(arm_curves, curves[reference], target)
                entry["ratio_to_" + reference] = None if not math.isfinite(ratio) else [
                    round(ratio, 3), round(low, 3), None if math.isinf(high) else round(high, 3)]
                if math.isfinite(ratio):
                    top = "never" if math.isinf(high) else f"{high:.2f}"
                    cell += f"; x{ratio:.2f}" + (f" [{low:.2f}, {top}]" if reach.seeds > 1
                                                 else "")
            cells.append(cell)
            per_target[f"{target:g}"] = entry
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        found[arm] = per_target
    return lines, found


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds (Student's t with ``n - 1`` degrees of freedom)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, mean, mean
    half = t_quantile(len(values) - 1) * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided Student-t quantile: ``t`` with ``P(|T| <= t) = level`` for ``df``
    degrees of freedom (a positive integer), by bisection on the exact CDF."""
    if df < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"need df >= 1 and 0 < level < 1, got df={df}, level={level}")
    low, high = 0.0, 1.0
    while _t_within(high, df) < level:
        low, high = high, 2 * high
    for _ in range(100):  # halves [low, high] far below float resolution
        middle = (low + high) / 2
        low, high = (middle, high) if _t_within(middle, df) < level else (low, middle)
    return (low + high) / 2


def _t_within(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with integer ``df``: the finite series of Abramowitz &
    Stegun 26.7.3 (odd df) and 26.7.4 (even df), with ``theta = atan(t / sqrt(df))``."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    term = total = 1.0
    if df % 2 == 1:  # (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * cos2
            total += term
        series = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2 / math.pi * (theta + series)
    for k in range(1, df // 2):  # sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term *= (2 * k - 1) / (2 * k) * cos2
        total += term
    return math.sin(theta) * total
