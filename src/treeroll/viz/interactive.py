"""The interactive HTML tree: one self-contained page, an SVG tree and a details panel."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from treeroll.tree import Node, RolloutTree, token_counts
from treeroll.viz.layout import (
    _CATEGORIES,
    _MAX_ID_LABELS,
    _category,
    _headline,
    _Layout,
    _layout,
    _saved_fraction,
    _score_labelled,
)

__all__ = ["render_tree_html"]

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
