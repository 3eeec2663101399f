"""Seeing trees and runs: static tree figures, an interactive HTML tree, training curves.

Every function here writes a file and returns its path; none opens a window. Figures are built
on :class:`matplotlib.figure.Figure` with an explicit Agg canvas, so importing this package never
changes matplotlib's global backend and works on a machine without a display.

The parts: the layout and headline every tree rendering shares (:mod:`treeroll.viz.layout`),
PNG and SVG figures (:mod:`~treeroll.viz.static`), the interactive HTML page
(:mod:`~treeroll.viz.interactive`), a saved tree rendered into several formats at once
(:mod:`~treeroll.viz.render`), and a run's training curves and strategy comparisons
(:mod:`~treeroll.viz.runs`).
"""

from __future__ import annotations

from treeroll.viz.interactive import render_tree_html
from treeroll.viz.layout import tree_headline
from treeroll.viz.render import show
from treeroll.viz.runs import (
    DEFAULT_METRIC_KEYS,
    compare_figure,
    metrics_figure,
    plot_compare,
    plot_metrics,
)
from treeroll.viz.static import render_tree_png, render_tree_svg

__all__ = [
    "DEFAULT_METRIC_KEYS",
    "compare_figure",
    "metrics_figure",
    "plot_compare",
    "plot_metrics",
    "render_tree_html",
    "render_tree_png",
    "render_tree_svg",
    "show",
    "tree_headline",
]
