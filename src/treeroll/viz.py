"""Seeing trees and runs: static tree figures, an interactive HTML tree, training curves.

Every function here writes a file and returns its path; none opens a window. Figures are built
on :class:`matplotlib.figure.Figure` with an explicit Agg canvas, so importing this module never
changes matplotlib's global backend and works on a machine without a display.

Layout (shared by the static and the HTML renderings): leaves are placed left to right in
depth-first order one slot apart, each parent is centred over its first and last child, so
subtrees never overlap; depth grows downwards from the root at the top.
"""

from __future__ import annotations

import html
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
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from treeroll.tree import Node, NodeStatus, RolloutTree, TokenCounts, load_tree, token_counts

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

DEFAULT_METRIC_KEYS: tuple[str, ...] = (
    "success_rate", "reward_mean", "loss", "kl", "entropy", "generated_tokens",
)
"""Metrics :func:`plot_metrics` draws by default (those absent from the log are skipped)."""

# Status categories shown in legends: (label, fill colour). Okabe-Ito palette (colour-blind safe).
_CATEGORIES: dict[str, tuple[str, str]] = {
    "expanded": ("expanded / kept", "#bbbbbb"),
    "success": ("terminal: success", "#009e73"),
    "failure": ("terminal: failure", "#d55e00"),
    "truncated": ("truncated", "#e69f00"),
    "pruned": ("pruned", "#cc79a7"),
    "budget": ("budget ran out", "#0072b2"),
    "dropped": ("dropped", "#333333"),
    "failed": ("failed: env or scorer raised", "#56b4e9"),
    "active": ("active", "#ffffff"),
    "other": ("other", "#f0e442"),
}
_STATUS_TO_CATEGORY = {
    NodeStatus.EXPANDED: "expanded",
    NodeStatus.KEPT: "expanded",
    NodeStatus.TRUNCATED: "truncated",
    NodeStatus.PRUNED: "pruned",
    NodeStatus.BUDGET: "budget",
    NodeStatus.DROPPED: "dropped",
    NodeStatus.FAILED: "failed",
    NodeStatus.ACTIVE: "active",
}
_MAX_SCORE_LABELS = 150  # beyond this many scored nodes, label only branch points and leaves
_MAX_ID_LABELS = 80  # node ids are printed on the static figure only for trees this small
_TREE_FORMATS = ("png", "svg", "html")


# --------------------------------------------------------------------------------------------
# Layout and per-node facts shared by every rendering
# --------------------------------------------------------------------------------------------


@dataclass
class _Layout:
    """Positions in slot units: ``x[i]`` in [0, num_slots - 1], ``depth[i]`` downwards."""

    x: list[float]
    depth: list[int]
    num_slots: int
    max_depth: int
    shared: list[int]
    """Leaves of the group (dropped excluded) below or at each node."""


def _layout(tree: RolloutTree) -> _Layout:
    size = len(tree.nodes)
    x = [0.0] * size
    shared = [0] * size
    order: list[Node] = []  # pre-order
    stack = [tree.root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(node.children))
    slot = 0
    for node in order:  # pre-order visits leaves left to right
        if node.is_leaf:
            x[node.id] = float(slot)
            slot += 1
            in_group = node.parent is not None and node.status not in NodeStatus.OUT_OF_GROUP
            shared[node.id] = int(in_group)
    for node in reversed(order):  # children before parents
        if node.children:
            x[node.id] = (x[node.children[0].id] + x[node.children[-1].id]) / 2
            shared[node.id] = sum(shared[child.id] for child in node.children)
    depth = [node.depth for node in tree.nodes]
    return _Layout(x=x, depth=depth, num_slots=max(slot, 1), max_depth=max(depth), shared=shared)


def _category(node: Node) -> str:
    if node.status == NodeStatus.TERMINAL:
        return "success" if node.info.get("success") else "failure"
    return _STATUS_TO_CATEGORY.get(node.status, "other")


def _saved_fraction(counts: TokenCounts) -> float:
    """Share of the chain-equivalent tokens the shared prefixes avoid (unique vs chains)."""
    return 1.0 - counts.unique / counts.chain_unique if counts.chain_unique else 0.0


def tree_headline(tree: RolloutTree) -> list[str]:
    """The lines every rendering of a tree starts with (the terminal summary of
    ``treeroll rollout``, the PNG/SVG title, the HTML header), so they state the same figures.

    The saving compares like with like: ``unique`` (every token of the tree's model contexts
    once) against ``chain-equivalent`` (the same leaves as independent chains, every token of
    each chain's context once). What the backend actually ``computed`` (prefill + generated)
    also depends on its prefix cache (the scripted SWE agent has none and re-reads every
    turn's whole context), so it is a line of its own, with its parts, when recorded."""
    return _headline(tree, token_counts(tree))


def _headline(tree: RolloutTree, counts: TokenCounts) -> list[str]:
    strategy = tree.meta.get("strategy", "?")
    lines = [f"task seed {tree.task_seed} · strategy {strategy} · {counts.leaves} leaves · "
             f"{len(tree.nodes)} nodes",
             f"unique {counts.unique:,} tokens · chain-equivalent {counts.chain_unique:,} · "
             f"saved {100 * _saved_fraction(counts):.1f}%"]
    if counts.prefill:
        lines.append(f"backend computed {counts.computed:,} = prefill {counts.prefill:,} + "
                     f"generated {counts.generated:,} ({counts.cached:,} cached)")
    return lines


def _score_labelled(tree: RolloutTree) -> set[int]:
    scored = [n for n in tree.nodes if n.score is not None]
    if len(scored) > _MAX_SCORE_LABELS:
        scored = [n for n in scored if len(n.children) != 1][:_MAX_SCORE_LABELS]
    return {n.id for n in scored}


# --------------------------------------------------------------------------------------------
# Static figures (PNG / SVG)
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Interactive HTML
# --------------------------------------------------------------------------------------------

_HTML_CSS = """
body{margin:0;font:13px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;
 display:flex;flex-direction:column;height:100vh}
header{padding:8px 14px;border-bottom:1px solid #ddd;background:#fafafa}
header h1{font-size:15px;margin:0 0 4px}
header .counts span{margin-right:16px}
header .legend span{margin-right:12px;white-space:nowrap}
.sw{display:inline-block;width:11px;height:11px;border-radius:50%;border:1px solid #222;
 vertical-align:middle;margin-right:4px}
main{flex:1;display:flex;min-height:0}
#canvas{flex:1;overflow:auto;padding:8px}
#panel{width:420px;border-left:1px solid #ddd;overflow:auto;padding:10px 14px;
 background:#fcfcfc}
#panel dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;margin:0}
#panel dt{color:#666}
#panel dd{margin:0;word-break:break-word}
#panel pre{white-space:pre-wrap;word-break:break-word;background:#f3f3f3;padding:6px;
 border-radius:4px;max-height:40vh;overflow:auto;margin:4px 0 10px}
#panel h3{font-size:13px;margin:10px 0 2px}
.hint{color:#888}
svg .edge{stroke:#777;stroke-linecap:round}
svg .edge.zero{stroke-dasharray:3 3}
svg .edge.on{stroke:#0b3d91}
svg .node{stroke:#222;stroke-width:1;cursor:pointer}
svg .node.branch{stroke-width:3}
svg .node.on{stroke:#0b3d91;stroke-width:3}
svg .node.sel{stroke:#0b3d91;stroke-width:4}
svg .score{font-size:9px;fill:#0b3d91}
svg .nid{font-size:8px;fill:#666}
details pre{white-space:pre-wrap;max-height:30vh;overflow:auto}
"""

_HTML_JS = """
(function(){
const data=JSON.parse(document.getElementById('tree-data').textContent);
const byId=new Map(data.nodes.map(function(n){return [n.id,n];}));
let pinned=null;
function put(field,value){document.getElementById('f-'+field).textContent=value;}
function fmt(v){return (v===null||v===undefined)?'\\u2013':String(v);}
function markPath(id){
  document.querySelectorAll('.on').forEach(function(el){el.classList.remove('on');});
  let n=byId.get(id);
  while(n){
    document.querySelector('[data-node-id="'+n.id+'"]').classList.add('on');
    const edge=document.querySelector('[data-child="'+n.id+'"]');
    if(edge){edge.classList.add('on');}
    n=(n.parent===null)?null:byId.get(n.parent);
  }
}
function show(id){
  const n=byId.get(id);
  document.getElementById('hint').style.display='none';
  document.getElementById('fields').style.display='';
  put('id',n.id); put('depth',n.depth); put('status',n.status+' ('+n.category+')');
  put('note',n.note||'\\u2013'); put('reward',fmt(n.reward));
  put('score',fmt(n.score)); put('score_reason',n.score_reason||'\\u2013');
  put('finish_reason',n.finish_reason||'\\u2013'); put('children',n.children);
  put('shared',n.shared); put('action_tokens',n.action_tokens);
  put('observation_tokens',n.observation_tokens);
  put('action_text',n.action_text); put('observation_text',n.observation_text);
  markPath(id);
}
document.querySelectorAll('[data-node-id]').forEach(function(el){
  const id=Number(el.getAttribute('data-node-id'));
  el.addEventListener('mouseenter',function(){if(pinned===null){show(id);}});
  el.addEventListener('click',function(ev){
    ev.stopPropagation();
    document.querySelectorAll('.sel').forEach(function(e){e.classList.remove('sel');});
    if(pinned===id){pinned=null;return;}
    pinned=id; el.classList.add('sel'); show(id);
  });
});
document.getElementById('canvas').addEventListener('click',function(){
  pinned=null;
  document.querySelectorAll('.sel').forEach(function(e){e.classList.remove('sel');});
});
})();
"""

_PANEL_FIELDS = (
    ("id", "node"), ("depth", "depth"), ("status", "status"), ("note", "note"),
    ("reward", "reward"), ("score", "score"), ("score_reason", "score reason"),
    ("finish_reason", "finish reason"), ("children", "children"),
    ("shared", "leaves sharing it"), ("action_tokens", "action tokens"),
    ("observation_tokens", "observation tokens"),
)


def _script_json(value: Any) -> str:
    """JSON safe to embed in a <script> element: no '<', '>' or '&' can close or open a tag."""
    text = json.dumps(value, ensure_ascii=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _svg_tree(tree: RolloutTree, layout: _Layout) -> str:
    slot = min(max(1000.0 / layout.num_slots, 16.0), 56.0)  # px between leaves
    level = 70.0  # px between depths
    radius = 7.0 if layout.num_slots <= 60 else 5.0
    margin = 30.0
    width = margin * 2 + slot * (layout.num_slots - 1)
    height = margin * 2 + level * layout.max_depth

    def position(node: Node) -> tuple[float, float]:
        return margin + slot * layout.x[node.id], margin + level * node.depth

    biggest = max(layout.shared[0], 1)
    labelled = _score_labelled(tree)
    parts = [f'<svg width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="rollout tree">']
    for node in tree.nodes[1:]:
        assert node.parent is not None
        (x1, y1), (x2, y2) = position(node.parent), position(node)
        share = layout.shared[node.id]
        parts.append(f'<line class="edge{"" if share else " zero"}" data-child="{node.id}" '
                     f'x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                     f'stroke-width="{0.8 + 6.0 * share / biggest:.2f}"/>')
    for node in tree.nodes:
        x, y = position(node)
        category = _category(node)
        classes = "node branch" if len(node.children) > 1 else "node"
        tooltip = html.escape(f"node {node.id} · {node.status} · {node.note}".rstrip(" ·"))
        parts.append(f'<circle class="{classes}" data-node-id="{node.id}" cx="{x:.1f}" '
                     f'cy="{y:.1f}" r="{radius:.0f}" fill="{_CATEGORIES[category][1]}">'
                     f"<title>{tooltip}</title></circle>")
        if node.id in labelled:
            parts.append(f'<text class="score" x="{x + radius + 2:.1f}" y="{y - 3:.1f}">'
                         f"{node.score:.2f}</text>")
        if len(tree.nodes) <= _MAX_ID_LABELS * 2:
            parts.append(f'<text class="nid" text-anchor="middle" x="{x:.1f}" '
                         f'y="{y + radius + 10:.1f}">{node.id}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _node_record(node: Node, layout: _Layout) -> dict[str, Any]:
    return {
        "id": node.id,
        "parent": None if node.parent is None else node.parent.id,
        "depth": node.depth,
        "status": node.status,
        "category": _CATEGORIES[_category(node)][0],
        "note": node.note,
        "reward": node.reward,
        "score": node.score,
        "score_reason": node.score_reason,
        "finish_reason": node.finish_reason,
        "children": len(node.children),
        "shared": layout.shared[node.id],
        "action_tokens": len(node.action_ids),
        "observation_tokens": len(node.observation_ids),
        "action_text": node.action_text,
        "observation_text": node.observation_text,
    }


def render_tree_html(tree: RolloutTree, path: str | Path) -> Path:
    """Write ``tree`` as one self-contained interactive HTML file and return its path.

    Inline CSS, JS and SVG only (no external resources). Each node is one SVG element carrying
    ``data-node-id``; hovering shows its details in a side panel, clicking pins them (id, depth,
    status and note, reward, score and reason, action and observation text, token counts, the
    leaves sharing it). Model and environment text is inserted as text, never as markup.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    layout = _layout(tree)
    counts = token_counts(tree)
    first = _headline(tree, counts)[0]
    saved = counts.chain_unique - counts.unique
    figures = [
        ("generated", f"{counts.generated:,}"),
        ("unique", f"{counts.unique:,}"),
        ("chain-equivalent", f"{counts.chain_unique:,}"),
        ("saved", f"{saved:,} ({100 * _saved_fraction(counts):.1f}%)"),
    ]
    if counts.prefill:
        figures += [("prefill", f"{counts.prefill:,}"), ("cached", f"{counts.cached:,}"),
                    ("backend computed", f"{counts.computed:,}")]
    counts_html = "".join(f"<span><b>{html.escape(name)}</b> {html.escape(value)}</span>"
                          for name, value in figures)
    used = {_category(n) for n in tree.nodes}
    legend_html = "".join(
        f'<span><i class="sw" style="background:{colour}"></i>{html.escape(label)}</span>'
        for category, (label, colour) in _CATEGORIES.items() if category in used)
    legend_html += ("<span>thick ring = branch point · edge width ∝ leaves sharing it · "
                    "blue numbers = process score</span>")
    fields_html = "".join(f"<dt>{html.escape(label)}</dt><dd id=\"f-{name}\"></dd>"
                          for name, label in _PANEL_FIELDS)
    meta_text = html.escape(json.dumps(tree.meta, indent=1, default=str, ensure_ascii=False))
    data = {"nodes": [_node_record(node, layout) for node in tree.nodes]}
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(f"treeroll tree {tree.tree_id} (task seed {tree.task_seed})")}</title>
<style>{_HTML_CSS}</style>
</head>
<body>
<header>
<h1>{html.escape(first)}</h1>
<div class="counts">{counts_html}</div>
<div class="legend">{legend_html}</div>
<details><summary>tree meta</summary><pre>{meta_text}</pre></details>
</header>
<main>
<div id="canvas">
{_svg_tree(tree, layout)}
</div>
<aside id="panel">
<p id="hint" class="hint">Hover over a node to see its turn; click to pin it.</p>
<div id="fields" style="display:none">
<dl>{fields_html}</dl>
<h3>action</h3><pre id="f-action_text"></pre>
<h3>observation</h3><pre id="f-observation_text"></pre>
</div>
</aside>
</main>
<script id="tree-data" type="application/json">{_script_json(data)}</script>
<script>{_HTML_JS}</script>
</body>
</html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def show(path_to_tree_json: str | Path, out_dir: str | Path,
         formats: Sequence[str] = ("png", "html")) -> list[Path]:
    """Load a tree file and render it into ``out_dir`` as ``<stem>.<format>`` for each format.

    ``formats`` are any of ``png``, ``svg``, ``html``. Returns the written paths in order.
    """
    unknown = [f for f in formats if f not in _TREE_FORMATS]
    if unknown:
        raise ValueError(f"unknown format(s) {unknown}; choose from {list(_TREE_FORMATS)}")
    source = Path(path_to_tree_json)
    tree = load_tree(source)
    out = Path(out_dir)
    renderers = {"png": render_tree_png, "svg": render_tree_svg, "html": render_tree_html}
    return [renderers[fmt](tree, out / f"{source.stem}.{fmt}") for fmt in formats]


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


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


def _moving_average(values: Sequence[float]) -> tuple[int, list[float]]:
    """Trailing mean over ``window`` steps (an eighth of the run, 3 to 50), from the first full
    window on; no average for a run no longer than one window."""
    window = min(50, max(3, len(values) // 8))
    if len(values) <= window:
        return window, []
    sums = list(itertools.accumulate(values, initial=0.0))
    return window, [(sums[i] - sums[i - window]) / window for i in range(window, len(sums))]


def _draw_success(ax: Any, series: list[tuple[float, float]],
                  held_out: list[_HeldOutPoint]) -> None:
    """Training success per step, its moving average, and the held-out evaluations with their
    Wilson intervals, each labelled with its task count where that count changes."""
    if series:
        xs, ys = [p[0] for p in series], [p[1] for p in series]
        ax.plot(xs, ys, marker="." if len(xs) < 60 else "", linewidth=0.9, alpha=0.45,
                color="#56b4e9", label="training (per step)")
        window, averaged = _moving_average(ys)
        if averaged:
            ax.plot(xs[window - 1:], averaged, linewidth=1.8, color="#0072b2",
                    label=f"training ({window}-step mean)")
    if held_out:
        ex = [p.x for p in held_out]
        ey = [p.success_rate for p in held_out]
        below = [max(0.0, p.success_rate - p.low) for p in held_out]
        above = [max(0.0, p.high - p.success_rate) for p in held_out]
        ax.errorbar(ex, ey, yerr=[below, above], fmt="o", markersize=4, capsize=3,
                    color="#d55e00", label="held-out (95% Wilson interval)")
        previous = None
        for index, point in enumerate(held_out):
            if point.tasks is not None and (point.tasks != previous
                                            or index == len(held_out) - 1):
                ax.annotate(f"n={point.tasks}", (point.x, point.high), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=7,
                            color="#d55e00")
            previous = point.tasks
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
    held_out = _held_out_points(raw, [by_record.get(id(r)) for r in raw])
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
            _draw_success(ax, series, held_out)
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
