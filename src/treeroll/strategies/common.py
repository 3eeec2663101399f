"""Helpers the built-in strategies share: live branches, subtrees, the action a turn took."""

from __future__ import annotations

from collections.abc import Sequence

from treeroll.tree import Node, NodeStatus, RolloutTree, leaves, path_to, subtree_index

__all__ = ["action_key", "active_branches", "by_tree", "continue_or_open", "repeated_action",
           "subtree"]


def active_branches(created: Sequence[Node]) -> list[Node]:
    """The nodes of ``created`` still running: not ended and not stopped by the strategy."""
    return [n for n in created if not n.ended and n.status == NodeStatus.ACTIVE]


def continue_or_open(tree: RolloutTree, created: list[Node], m: int) -> tuple[list[Node], int]:
    """A round-based strategy's first question each step: the branches still running (to
    continue), and, once none is, how many leaves of the ``m`` are left to open."""
    frontier = active_branches(created)
    return frontier, (0 if frontier else m - len(leaves(tree)))


def by_tree(tree: RolloutTree) -> dict[int, list[Node]]:
    """Every node but the root, grouped by the tree it belongs to (:func:`subtree_index`),
    trees in the order of their first chain."""
    groups: dict[int, list[Node]] = {}
    for first in tree.root.children:
        groups.setdefault(subtree_index(tree, first), []).extend(subtree(first))
    return groups


def subtree(node: Node) -> list[Node]:
    """``node`` and every node below it."""
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(current.children)
    return out


def action_key(node: Node) -> str:
    """The action a turn took: ``info["action_key"]``, else the moves the environment reports
    it executed (``info["action_names"]``, FrozenLake), else the stripped reply text."""
    if "action_key" in node.info:
        return str(node.info["action_key"])
    names = node.info.get("action_names")
    if names and not node.info.get("format_error", False):
        return "|".join(str(name) for name in names)
    return node.action_text.strip()


def repeated_action(node: Node, theta: int) -> bool:
    """True if the last ``theta`` actions on the path to ``node`` are the same action."""
    if theta < 1:
        return False
    actions = [action_key(n) for n in path_to(node)[1:]]
    return len(actions) >= theta and len(set(actions[-theta:])) == 1
