"""Layout and per-node facts shared by every rendering of a tree, and its headline.

Layout (shared by the static and the HTML renderings): leaves are placed left to right in
depth-first order one slot apart, each parent is centred over its first and last child, so
subtrees never overlap; depth grows downwards from the root at the top.
"""

from __future__ import annotations

from dataclasses import dataclass

from treeroll.tree import Node, NodeStatus, RolloutTree, TokenCounts, token_counts

__all__ = ["tree_headline"]

# Status categories shown in legends: (label, fill colour). Okabe-Ito palette (colour-blind safe).
_CATEGORIES: dict[str, tuple[str, str]] = {
    "expanded": ("expanded", "#bbbbbb"),
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
    NodeStatus.TRUNCATED: "truncated",
    NodeStatus.PRUNED: "pruned",
    NodeStatus.BUDGET: "budget",
    NodeStatus.DROPPED: "dropped",
    NodeStatus.FAILED: "failed",
    NodeStatus.ACTIVE: "active",
}
_MAX_SCORE_LABELS = 150  # beyond this many scored nodes, label only branch points and leaves
_MAX_ID_LABELS = 80  # node ids are printed on the static figure only for trees this small


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
