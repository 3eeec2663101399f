"""The per-task budget rule every strategy runs under (used by :mod:`treeroll.engine.loop`).

A tree never generates more than its token budget nor ends with more leaves than its leaf
budget: each turn's generation cap is the tokens left shared over the entries sent together
(:func:`token_caps`); before a strategy's entries are sent, :func:`clip_order` keeps the
continuations of existing branches and lets new branches fill only the room the leaf budget
leaves (counting the finished leaves and the live branches of the tree's other units), and
records on every cut node why it stopped. An allocator's grant adds to a tree's budget
(:func:`add_budget`).
"""

from __future__ import annotations

from treeroll.base import Budget, StrategyContext
from treeroll.tree import Node, NodeStatus, RolloutTree

__all__ = ["add_budget", "clip_order", "token_caps"]


def add_budget(ctx: StrategyContext, grant: Budget) -> None:
    """Add ``grant`` to a tree's budget in ``ctx`` (a ``None`` field adds nothing; an
    unlimited budget stays unlimited)."""
    if grant.leaves is not None and ctx.max_leaves is not None:
        ctx.max_leaves += grant.leaves
    if grant.tokens is not None and ctx.tokens_left is not None:
        ctx.tokens_left += grant.tokens


def token_caps(entries: int, tokens_left: int | None, per_turn: int) -> list[int]:
    """Per-entry generation caps that never exceed the tokens left (0 = entry is cut)."""
    if tokens_left is None:
        return [per_turn] * entries
    if entries == 0:
        return []
    share, extra = divmod(max(tokens_left, 0), entries)
    return [min(per_turn, share + (1 if i < extra else 0)) for i in range(entries)]


def clip_order(tree: RolloutTree, frontier: list[Node], ctx: StrategyContext, *,
               live_elsewhere: int = 0) -> list[int]:
    """The positions in ``frontier`` the budget allows, in the order they are sent; the
    entries it drops have their status and note recorded. ``live_elsewhere``: branches of
    this tree still to end outside ``frontier``."""
    open_ = [i for i, n in enumerate(frontier) if not n.ended]
    if ctx.tokens_left is not None and ctx.tokens_left <= 0:
        for i in open_:
            if not frontier[i].children:
                frontier[i].status = NodeStatus.BUDGET
                frontier[i].note = "generated-token budget spent"
        return []
    if ctx.max_leaves is None:
        return open_
    finished = sum(1 for n in tree.nodes
                   if n.is_leaf and n.parent is not None and n.status in NodeStatus.STOPPED
                   and n.status != NodeStatus.DROPPED)
    # An entry continuing a childless node (its first) adds no leaf: that node is a leaf
    # already, kept or cut. Every other entry opens one. Continuations are always kept; new
    # branches fill the room left, distinct nodes first, then repeats, in order.
    first: list[int] = []
    extra: list[int] = []
    seen: set[int] = set()
    for i in open_:
        (extra if id(frontier[i]) in seen else first).append(i)
        seen.add(id(frontier[i]))
    continuing = {i for i in first if not frontier[i].children and frontier[i].parent is not None}
    room = ctx.max_leaves - finished - live_elsewhere - len(continuing)
    opening = [i for i in first + extra if i not in continuing]
    if len(opening) <= room:
        return open_
    allowed = set(opening[:max(room, 0)])
    kept = [i for i in first + extra if i in continuing or i in allowed]
    for i in first:
        if i not in allowed and i not in continuing and not frontier[i].children:
            frontier[i].status, frontier[i].note = NodeStatus.BUDGET, "leaf budget reached"
    return kept
