"""The terminal summary of ``treeroll rollout`` and the tree's pictures state one set of
token figures, in the same words."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from tests.test_viz import small_tree
from treeroll.cli.one_tree import describe_tree
from treeroll.tree import token_counts
from treeroll.viz import render_tree_html, render_tree_svg, tree_headline


def _terminal_text(tree) -> str:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(describe_tree(tree))
    return out.getvalue()


def test_summary_and_pictures_state_the_same_token_figures(tmp_path: Path) -> None:
    tree = small_tree()
    for number, node in enumerate(tree.nodes[1:]):  # a backend without a prefix cache
        node.info["cost"] = {"prefill": 30 + number, "cached": 0}
    counts = token_counts(tree)
    lines = tree_headline(tree)
    saved = 100 * (1 - counts.unique / counts.chain_unique)
    assert lines[1] == (f"unique {counts.unique:,} tokens · chain-equivalent "
                        f"{counts.chain_unique:,} · saved {saved:.1f}%")
    assert lines[2] == (f"backend computed {counts.prefill + counts.generated:,} = prefill "
                        f"{counts.prefill:,} + generated {counts.generated:,} (0 cached)")

    terminal = _terminal_text(tree)
    svg = render_tree_svg(tree, tmp_path / "t.svg").read_text()
    svg_text = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
    page = render_tree_html(tree, tmp_path / "t.html").read_text()
    for line in lines:
        assert line in terminal
        assert line in svg_text or line in svg, line
    assert f"<b>saved</b> {counts.chain_unique - counts.unique:,} ({saved:.1f}%)" in page
    assert f"<b>backend computed</b> {counts.computed:,}" in page
    assert "chains would compute" not in terminal


def test_headline_leaves_out_backend_figures_it_does_not_have() -> None:
    tree = small_tree()  # no node recorded what the backend prefilled
    lines = tree_headline(tree)
    assert len(lines) == 2 and "backend" not in _terminal_text(tree)
