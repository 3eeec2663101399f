"""EarlyForks: a tree of exactly ``group_size`` leaves with its sharing in the early turns,
for trainers that take exactly G rows per prompt (TRL, verl; ``treeroll.adapters``), and a
strategy like any other (``--strategy.name early_forks``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from treeroll.base import StrategyContext, tree_state
from treeroll.tree import Node, NodeStatus, RolloutTree

__all__ = ["REPEATS", "EarlyForks", "EarlyForksState"]

REPEATS = "repeats"
"""``Node.info`` key: how many more rows repeat this leaf (:class:`EarlyForks`' ``repeat``)."""


@dataclass
class EarlyForksState:
    """EarlyForks' state of one task's tree."""

    plan: dict[int, list[tuple[int, int | None]]] = field(default_factory=dict)
    """Node id -> one ``(leaves owed, depth to split at or None)`` per frontier entry of
    that node, in order."""


@dataclass
class EarlyForks:
    """A tree of exactly ``group_size`` leaves with its sharing in the early turns, grown by
    halving: each of ``chains`` chains owes ``group_size / chains`` leaves; a branch owing
    ``k > 1`` splits once it has run a number of turns drawn uniformly from 1 to ``within``
    since it started, into its own continuation owing ``ceil(k / 2)`` and a fork owing
    ``floor(k / 2)``, each splitting again the same way. A branch that ends owing ``k > 1``
    before its split hands its other ``k - 1`` on as ``on_end`` says:

    - ``"fork_last"`` (the default): to a fork from its last turn before the end (a chain that
      ended at its first turn has nothing to share: that fork is a fresh chain). Every row is
      an episode, but a biased sample of the policy's: the fork's turn is chosen because the
      branch ended right after it, so a group over-represents episodes that go on past a turn
      that ended another (a second chance at that move);
    - ``"repeat"``: to ``k - 1`` repeats of the ended branch's own row (decoding nothing).
      Every split turn is then fixed before the turns it splits are sampled, so each row is,
      on its own, a sample of the policy's episodes, as a chain is (rows are correlated, as in
      any tree); the price is fewer distinct rows, and a group of one repeated row when the
      chain ends before its first split. treeroll's own credit (``tree_credit``) is computed
      over the distinct leaves; a trainer normalising rewards over its G rows counts repeats.
      A failed branch (its environment raised) is not repeated: the adapter's top-up replaces
      its rows with fresh chains. Under a token budget that binds, a branch it cuts keeps one
      row and the top-up's fresh chains replace the rows it owed, so long episodes are then
      under-weighted: the claim holds without failures and with a budget that does not bind.

    Written for trainers that take exactly G rows per prompt (TRL, verl): nothing is grown to
    be thrown away, and forks run beside their branch as soon as it passes their turn, so a
    tree takes about as long as its longest branch (Tree-GRPO waits for its chains to end, then
    expands). treeroll's choices where the papers are silent: halving (a fork of a fork shares
    the turns of both, so the average row shares more than with every fork taken from one
    chain), split turns uniform over ``1..within`` after a branch's start.
    """

    group_size: int = 4
    chains: int = 1
    within: int = 4
    on_end: Literal["fork_last", "repeat"] = "fork_last"

    name: ClassVar[str] = "early_forks"
    ON_END: ClassVar[tuple[str, ...]] = ("fork_last", "repeat")
    revisits_nodes: ClassVar[bool] = True  # a branch's last turn is forked after it ended

    def __post_init__(self) -> None:
        if (self.group_size < 1 or self.chains < 1 or self.group_size % self.chains
                or self.within < 1):
            raise ValueError(f"early_forks needs group_size >= 1, chains >= 1 dividing it and "
                             f"within >= 1; got group_size={self.group_size}, "
                             f"chains={self.chains}, within={self.within}")
        if self.on_end not in self.ON_END:
            raise ValueError(f"early_forks on_end is {self.on_end!r}; valid: "
                             f"{', '.join(map(repr, self.ON_END))}")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """``chains`` chains from the root, each owing ``group_size / chains`` leaves."""
        ctx.state = EarlyForksState({tree.root.id: [(self.group_size // self.chains, None)]
                                            * self.chains})
        return [tree.root] * self.chains

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """Never: a fork is taken from the newest turn of a branch whose next turn just
        ended, and that turn is then in the frontier (never asked about); a turn asked about
        is one no entry will come back to."""
        return False

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue every live branch; split the branches whose turn has come; hand what an
        ended branch still owes to repeats of it or to a fork from its last turn (``on_end``)."""
        state = tree_state(ctx, EarlyForksState)
        plan = state.plan
        ahead: dict[int, list[tuple[int, int | None]]] = {}  # this frontier's entries only
        frontier: list[Node] = []

        def enter(node: Node, owed: int, split_at: int | None) -> None:
            ahead.setdefault(node.id, []).append((owed, split_at))
            frontier.append(node)

        for node in created:
            parent = node.parent
            assert parent is not None
            owed, split_at = plan[parent.id].pop(0)  # entries of one node run in order
            if split_at is None:  # a new branch: it splits within its first turns
                split_at = parent.depth + int(ctx.rng.integers(1, self.within + 1))
            if node.ended or node.status != NodeStatus.ACTIVE:
                # this branch is one leaf (a failed one drops out of the group, and the
                # adapter's top-up replaces it); what it still owes forks from its last turn
                # (fork_last, a failed move retried there) or repeats it
                if owed == 1:
                    continue
                if self.on_end == "fork_last":
                    enter(parent, owed - 1, None)
                elif node.status not in NodeStatus.OUT_OF_GROUP:
                    node.info[REPEATS] = node.info.get(REPEATS, 0) + owed - 1
                continue  # repeat, failed: the top-up's fresh chains replace all it owed
            if owed > 1 and node.depth >= split_at:
                keep = (owed + 1) // 2
                enter(node, keep, node.depth + int(ctx.rng.integers(1, self.within + 1)))
                enter(node, owed - keep, None)
            else:
                enter(node, owed, split_at)
        state.plan = ahead  # entries the budget cut are gone with the old plan
        return frontier
