"""ARPO / AEPO: branch after an observation when the policy grows uncertain (docs/methods.md).

ARPO (agentic reinforced policy optimisation) starts ``initial`` full trajectories out of a
per-task budget of ``m`` and spends the rest, the *partial* budget, on branches: after every
observation the entropy of the next generated tokens is measured, and a branch fires with
probability ``alpha + beta * dH``, ``dH`` the rise of that entropy over the trajectory's
initial entropy (its first turn's). A fired branch samples ``beam - 1`` more continuations
from the same observation. When everything has ended before the budget is spent, fresh
chains from the root top it up. The update is plain GRPO over the leaves (ARPO's "soft"
advantage). AEPO multiplies the probability by ``1 - aepo_gamma * l``, ``l`` the number of
consecutive branch points right above the observation, to stop branching in runs.

treeroll's reading, where the papers leave it open:

* a turn is the unit: the entropy is the mean normalised entropy of the first
  ``entropy_window`` tokens of the turn generated right after the observation (the backend's
  full-distribution entropy over ``log |V|``; ARPO's script uses its top-10 logprobs), and a
  branch re-samples that turn from the observation (its parent node), so the new branches are
  siblings of the turn whose entropy rose;
* the first turn, which follows the task rather than an observation, never branches;
* a draw of ``u < p`` per eligible turn from the task's seeded generator, in the order the
  turns were created; branches stop once the partial budget is spent;
* the top-up adds as many root chains as the budget has leaves left, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from treeroll.base import SamplingExtras, StrategyContext, tree_state
from treeroll.checks import checked
from treeroll.tree import Node, NodeStatus, RolloutTree, leaves

__all__ = ["ARPO", "ARPOState"]


@dataclass
class ARPOState:
    """ARPO's state of one task's tree."""

    partial_left: int = 0
    """Leaves the entropy branches may still add."""
    topped_up: bool = False
    """Whether the missing leaves were started as root chains (once, at the end)."""


@dataclass
class ARPO:
    """Entropy-guided branching after observations (ARPO; AEPO with ``aepo_gamma > 0``).
    Defaults: ARPO's released scripts (initial rollouts m/2, beam 2, branch probability 0.5,
    entropy weight 0.2, entropy of the first 20 tokens)."""

    m: int = checked(8, ge=1)
    """Trajectories (leaves) per task in all: the global budget M."""
    initial: int | None = checked(None, ge=1)
    """Full trajectories started from the root (None: ``m // 2``, at least 1)."""
    beam: int = checked(2, ge=2)
    """Continuations from a branching observation, the running one included."""
    alpha: float = checked(0.5, ge=0, le=1)
    """Branch probability when the entropy has not risen."""
    beta: float = checked(0.2, ge=0)
    """Weight of the entropy rise in the branch probability."""
    entropy_window: int = checked(20, ge=1)
    """Tokens at the start of a turn whose mean normalised entropy is measured."""
    aepo_gamma: float = checked(0.0, ge=0)
    """AEPO's penalty for consecutive branching (0: ARPO)."""

    name: ClassVar[str] = "arpo"
    revisits_nodes: ClassVar[bool] = True

    def sampling_extras(self) -> SamplingExtras:
        """Every turn records the entropy of its first ``entropy_window`` tokens."""
        return SamplingExtras(entropy_window=self.entropy_window)

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """``initial`` chains from the root; the rest of ``m`` is the partial budget."""
        first = self.initial if self.initial is not None else max(1, self.m // 2)
        first = min(first, self.m)
        ctx.state = ARPOState(partial_left=self.m - first)
        return [tree.root] * first

    def branch_probability(self, node: Node) -> float:
        """``alpha + beta * dH`` (times AEPO's ``1 - aepo_gamma * l``), clipped to [0, 1];
        ``dH`` is ``node``'s entropy minus its trajectory's first turn's (0 if unrecorded)."""
        first = node
        while first.parent is not None and first.parent.parent is not None:
            first = first.parent
        rise = 0.0
        if node.entropy is not None and first.entropy is not None:
            rise = node.entropy - first.entropy
        probability = self.alpha + self.beta * rise
        if self.aepo_gamma:
            run, above = 0, node.parent
            while above is not None and above.parent is not None and len(above.children) > 1:
                run += 1
                above = above.parent
            probability *= max(0.0, 1.0 - self.aepo_gamma * run)
        return min(1.0, max(0.0, probability))

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue every live branch; after an observation, branch with the probability
        above while the partial budget lasts; top up with root chains once all have ended."""
        state = tree_state(ctx, ARPOState)
        frontier: list[Node] = []
        for node in created:
            if not node.ended and node.status == NodeStatus.ACTIVE:
                frontier.append(node)
            extra = self.beam - 1
            if node.depth < 2 or state.partial_left < extra:
                continue
            p = self.branch_probability(node)
            if ctx.rng.random() < p:
                assert node.parent is not None
                frontier.extend([node.parent] * extra)
                state.partial_left -= extra
                node.parent.note = f"ARPO branch: p = {p:.2f}"
        if not frontier and not state.topped_up:
            state.topped_up = True
            missing = self.m - len(leaves(tree))
            if missing > 0:
                state.partial_left = 0
                frontier = [tree.root] * missing
        return frontier

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """Only the root is branched from later (the top-up); a turn branches at once."""
        return node.parent is None
