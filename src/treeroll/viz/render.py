"""Rendering a saved tree file into several formats at once (``treeroll show``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from treeroll.tree_json import load_tree
from treeroll.viz.interactive import render_tree_html
from treeroll.viz.static import render_tree_png, render_tree_svg

__all__ = ["show"]

_TREE_FORMATS = ("png", "svg", "html")


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
