"""Static tree figures: a rollout tree drawn top-down as PNG or SVG.

Figures are built on :class:`matplotlib.figure.Figure` with an explicit Agg canvas, so importing
this module never changes matplotlib's global backend and works on a machine without a display.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from treeroll.tree import RolloutTree
from treeroll.viz.layout import (
    _CATEGORIES,
    _MAX_ID_LABELS,
    _category,
    _layout,
    _score_labelled,
    tree_headline,
)

__all__ = ["render_tree_png", "render_tree_svg"]


def _tree_figure(tree: RolloutTree) -> Figure:
    layout = _layout(tree)
    many = len(tree.nodes) > _MAX_ID_LABELS
    width = min(max(0.4 * layout.num_slots + 3.0, 8.0), 72.0)  # inches
    height = min(max(0.85 * (layout.max_depth + 1) + 2.2, 4.5), 24.0)
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    biggest = max(layout.shared[0], 1)
    marker_size = 70.0 if not many else 40.0

    for node in tree.nodes[1:]:  # edges, width ∝ leaves sharing the edge
        parent = node.parent
        assert parent is not None
        share = layout.shared[node.id]
        ax.plot([layout.x[parent.id], layout.x[node.id]], [parent.depth, node.depth],
                color="#666666", linewidth=0.6 + 5.4 * share / biggest,
                linestyle="-" if share else ":", solid_capstyle="round", zorder=1)

    branch = [n for n in tree.nodes if len(n.children) > 1]
    ax.scatter([layout.x[n.id] for n in branch], [n.depth for n in branch],
               s=marker_size * 3.2, facecolors="none", edgecolors="black", linewidths=1.6,
               zorder=2)
    present = []
    for category, (label, colour) in _CATEGORIES.items():
        members = [n for n in tree.nodes if _category(n) == category]
        if not members:
            continue
        present.append(Line2D([], [], marker="o", linestyle="none", markersize=8, label=label,
                              markerfacecolor=colour, markeredgecolor="#222222"))
        ax.scatter([layout.x[n.id] for n in members], [n.depth for n in members],
                   s=marker_size, c=colour, edgecolors="#222222", linewidths=0.7, zorder=3,
                   marker="X" if category == "dropped" else "o")
    if branch:
        present.append(Line2D([], [], marker="o", linestyle="none", markersize=13,
                              markerfacecolor="none", markeredgecolor="black",
                              markeredgewidth=1.6, label="branch point"))
    present.append(Line2D([], [], color="#666666", linewidth=3, label="edge width ∝ leaves"))

    for node_id in sorted(_score_labelled(tree)):
        score = tree.nodes[node_id].score
        ax.annotate(f"{score:.2f}", (layout.x[node_id], layout.depth[node_id]),
                    xytext=(9, 4), textcoords="offset points", fontsize=7, color="#0b3d91",
                    zorder=4)
    if not many:
        for node in tree.nodes:
            ax.annotate(str(node.id), (layout.x[node.id], node.depth), xytext=(0, -13),
                        textcoords="offset points", fontsize=6.5, color="#555555",
                        ha="center", va="top", zorder=4)

    ax.set_xlim(-0.8, layout.num_slots - 0.2)
    ax.set_ylim(layout.max_depth + 0.6, -0.6)  # root at the top
    ax.set_yticks(range(layout.max_depth + 1))
    ax.set_ylabel("depth (turn)")
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("\n".join(tree_headline(tree)), fontsize=12, loc="left")
    fig.legend(handles=present, loc="outside right upper", fontsize=8, frameon=False,
               title="status (score in blue)", title_fontsize=8)
    return fig


def render_tree_png(tree: RolloutTree, path: str | Path, *, dpi: int = 110) -> Path:
    """Draw ``tree`` top-down as a PNG and return the written path.

    Markers are coloured by status, branch points ringed, process scores printed beside scored
    nodes, edge width proportional to the number of leaves sharing the edge; the title gives
    the task seed, strategy, leaves and token accounting.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = _tree_figure(tree)
    width_inches = fig.get_figwidth()
    fig.savefig(path, format="png", dpi=min(dpi, int(8000 / width_inches)))  # <= 8000 px wide
    return path


def render_tree_svg(tree: RolloutTree, path: str | Path) -> Path:
    """Same figure as :func:`render_tree_png`, written as SVG (text kept as text)."""
    import matplotlib

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        _tree_figure(tree).savefig(path, format="svg")
    return path
