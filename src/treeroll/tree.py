"""The rollout tree: turns are nodes, trajectories are root-to-leaf paths.

A :class:`Node` is one turn: the model's action tokens (as sampled, with their sampling
logprobs) followed by the environment's observation tokens. The root holds the task's prompt
(system prompt + first observation) as its observation and no action. A trajectory is the
path from the root to a leaf; its token sequence is the concatenation of the path's tokens,
so every prefix shared by several leaves is stored once.

Token-in/token-out: the ids stored here are exactly the ids the backend sampled or was fed.
:func:`context_ids` rebuilds a node's model context by concatenation, never by decoding and
re-encoding text.

Algorithms over trees (export, accounting) are functions in this module, not methods; the
tree's JSON file is :mod:`treeroll.tree_json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from treeroll.environment import Env

__all__ = [
    "Node",
    "NodeStatus",
    "RolloutTree",
    "TokenCounts",
    "Trajectory",
    "context_ids",
    "export_trajectories",
    "leaves",
    "leaves_below",
    "path_to",
    "token_counts",
    "trajectory_reward",
]


class NodeStatus:
    """Why a node was expanded or stopped (sentinels stored in :attr:`Node.status`)."""

    ACTIVE = "active"  # on the frontier, will be extended
    EXPANDED = "expanded"  # has children (branch point if more than one)
    TERMINAL = "terminal"  # the environment ended the episode (goal, hole, submit)
    TRUNCATED = "truncated"  # the environment's step / turn limit ended it
    PRUNED = "pruned"  # a strategy stopped it early (score or repetition)
    BUDGET = "budget"  # the token or leaf budget ran out while it was active
    DROPPED = "dropped"  # pruned and excluded from the group (PATR option)
    FAILED = "failed"  # its environment or process scorer raised (the error is in ``note``)
    STOPPED = frozenset({TERMINAL, TRUNCATED, PRUNED, BUDGET, DROPPED, FAILED})
    OUT_OF_GROUP = frozenset({DROPPED, FAILED})
    """Leaf statuses that are not trajectories of the group (never trained on)."""


@dataclass(eq=False)
class Node:
    """One turn of a rollout tree.

    Invariants: ``len(action_ids) == len(action_logprobs)``; the root has ``parent is None``,
    ``depth == 0`` and no action; ``depth == parent.depth + 1`` otherwise; ``reward`` is the
    environment reward of this turn only (a trajectory's reward is the sum along its path).
    """

    id: int
    parent: Node | None
    depth: int
    action_ids: list[int] = field(default_factory=list)
    action_logprobs: list[float] = field(default_factory=list)
    action_text: str = ""
    observation_ids: list[int] = field(default_factory=list)
    observation_text: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)
    status: str = NodeStatus.ACTIVE
    note: str = ""
    """Free text: why the node was expanded, kept or stopped (e.g. the prune rule that fired)."""
    score: float | None = None
    """Process score in [0, 1] when a scorer looked at this node."""
    score_reason: str = ""
    finish_reason: str = ""
    """The backend's finish reason for this node's action (``stop`` / ``length``)."""
    entropy: float | None = None
    tree_index: int | None = None
    """First-level nodes only: which of the task's trees (Tree-GRPO's M) this branch belongs
    to, when a strategy says so (a root pick joins the tree it was picked for); ``None``: the
    node's own position among the root's children (see :func:`subtree_index`)."""
    env: Env | None = field(default=None, repr=False)
    """The environment as it stands after this node's observation (to branch from); dropped
    once no strategy can branch here any more. Never serialised."""

    @property
    def ended(self) -> bool:
        """True when the environment ended the episode at this node."""
        return self.terminated or self.truncated

    @property
    def is_leaf(self) -> bool:
        """True when the node has no children."""
        return not self.children


@dataclass(eq=False)
class RolloutTree:
    """All trajectories sampled for one task: ``root`` and every node below it."""

    task_seed: int
    tree_id: int
    group_id: int
    root: Node
    nodes: list[Node] = field(default_factory=list)
    """Every node, in creation order (``nodes[0] is root``); ``nodes[i].id == i``."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Strategy name, budget, backend accounting, scorer cost, ..."""

    @classmethod
    def new(
        cls, task_seed: int, tree_id: int, group_id: int, prompt_ids: list[int], prompt_text: str
    ) -> RolloutTree:
        """Make a tree holding only its root (the task prompt)."""
        root = Node(id=0, parent=None, depth=0, observation_ids=list(prompt_ids),
                    observation_text=prompt_text)
        return cls(task_seed=task_seed, tree_id=tree_id, group_id=group_id, root=root, nodes=[root])

    def add_child(self, parent: Node, **fields: Any) -> Node:
        """Append a child to ``parent`` and return it."""
        child = Node(id=len(self.nodes), parent=parent, depth=parent.depth + 1, **fields)
        parent.children.append(child)
        self.nodes.append(child)
        return child


def leaves(tree: RolloutTree) -> list[Node]:
    """The group: every leaf except those dropped from it or failed, in creation order.

    The root is never a leaf of the group (a tree that generated nothing has no trajectory).
    """
    return [n for n in tree.nodes if n.is_leaf and n.parent is not None
            and n.status not in NodeStatus.OUT_OF_GROUP]


def leaves_below(tree: RolloutTree, group: Sequence[Node] | None = None) -> dict[int, list[int]]:
    """Node id -> indices (into ``group``, default :func:`leaves`) of the group's leaves whose
    path runs through that node; nodes no leaf of the group passes are absent."""
    below: dict[int, list[int]] = {}
    for index, leaf in enumerate(leaves(tree) if group is None else group):
        for node in path_to(leaf):
            below.setdefault(node.id, []).append(index)
    return below


def path_to(node: Node) -> list[Node]:
    """Nodes from the root to ``node``, both included."""
    path = []
    current: Node | None = node
    while current is not None:
        path.append(current)
        current = current.parent
    return path[::-1]


def context_ids(node: Node) -> list[int]:
    """The exact token context the model continues from at ``node`` (root prompt, then each
    turn's action and observation along the path)."""
    ids: list[int] = []
    for n in path_to(node):
        ids.extend(n.action_ids)
        ids.extend(n.observation_ids)
    return ids


@dataclass
class Trajectory:
    """One leaf's root-to-leaf path, flattened for a trainer (TRL / verl field names).

    ``response_mask[i]`` is 1 for a model-generated token and 0 for an environment token;
    ``response_logprobs[i]`` is the sampling logprob for model tokens and 0.0 otherwise. The
    leaf's own trailing observation is not included (no model decision reads it).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    group_id: int
    tree_id: int
    node_path: list[int]
    leaf_status: str
    success: bool
    num_turns: int


def export_trajectories(tree: RolloutTree) -> list[Trajectory]:
    """One :class:`Trajectory` per leaf of the group, in :func:`leaves` order."""
    out = []
    for leaf in leaves(tree):
        path = path_to(leaf)
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for n in path[1:]:
            response.extend(n.action_ids)
            mask.extend([1] * len(n.action_ids))
            logprobs.extend(n.action_logprobs)
            if n is not leaf:
                response.extend(n.observation_ids)
                mask.extend([0] * len(n.observation_ids))
                logprobs.extend([0.0] * len(n.observation_ids))
        out.append(Trajectory(
            prompt_ids=list(tree.root.observation_ids),
            response_ids=response,
            response_mask=mask,
            response_logprobs=logprobs,
            reward=sum(n.reward for n in path),
            group_id=tree.group_id,
            tree_id=tree.tree_id,
            node_path=[n.id for n in path],
            leaf_status=leaf.status,
            success=bool(leaf.info.get("success", False)),
            num_turns=len(path) - 1,
        ))
    return out


def trajectory_reward(leaf: Node) -> float:
    """Sum of the turn rewards from the root to ``leaf``."""
    return sum(n.reward for n in path_to(leaf))


# --------------------------------------------------------------------------------------------
# Accounting
# --------------------------------------------------------------------------------------------


@dataclass
class TokenCounts:
    """Token accounting of a tree (or a sum of trees), and of the equivalent independent chains.

    ``generated``: tokens decoded; ``prefill``: prompt/observation tokens the backend actually
    forwarded; ``cached``: prompt tokens served from a prefix cache; ``unique``: tokens of the
    token trie of all model contexts (every token that enters some context, counted once,
    identical sibling turns merged; the lower bound of computation). ``chain_*``: the same leaves
    sampled as independent chains, each paying for its whole path (with the usual multi-turn KV
    reuse inside one chain, none across chains).

    ``unique`` merges identical sibling turns. A backend that decodes requests with the same
    context in one batch row until their samples part (the HF backend) computes an identical
    sibling turn once: ``shared`` counts the sampled tokens an earlier request of the same
    call had already sampled in the same context (``Completion.shared_tokens``), and
    ``duplicates`` the turns whose whole reply was shared; a backend that cannot tell reports
    none, and a low-entropy policy then keeps ``computed_over_unique`` above 1 with a perfect
    cache. The engine's own redundancy is ``forwarded_over_needed``: ``held`` counts the tokens
    the tree's nodes hold (the prompt, then every turn's action and observation, each node
    once), ``turns`` the nodes (one request each), ``ends`` the nodes without children (their
    last token is never fed back). ``unique_ends``: trie tokens nothing follows (never fed);
    ``replayed``: sampled tokens an earlier turn of the tree had sampled in the same context
    (within one call they are ``shared``; across calls the HF backend replays them from kept
    logits, ``reused``: the sampled tokens, not a reply's last, that no forward produced).
    """

    generated: int = 0
    prefill: int = 0
    cached: int = 0
    unique: int = 0
    leaves: int = 0
    env_steps: int = 0
    chain_generated: int = 0
    chain_prefill: int = 0
    chain_unique: int = 0
    held: int = 0
    turns: int = 0
    ends: int = 0
    shared: int = 0
    duplicates: int = 0
    unique_ends: int = 0
    replayed: int = 0
    reused: int = 0

    @property
    def forwarded(self) -> int:
        """Tokens the backend fed through the model: every prefilled token, and every
        generated one but each request's last (its first is sampled from the prefill's
        logits, its last is never fed in that request), less the shared ones (fed once, for
        the earlier request; a wholly shared reply's last token was not fed either way)."""
        return (self.prefill + self.generated - self.turns - self.shared + self.duplicates
                - self.reused)

    @property
    def needed(self) -> int:
        """Tokens that must be fed at least once: what the nodes hold, minus the last token
        of every node without children."""
        return self.held - self.ends

    @property
    def forwarded_over_needed(self) -> float:
        """Redundancy of the engine and its cache: 1.0 means every token the tree holds was
        fed exactly once (below 1: the cache also merged identical sibling turns)."""
        return self.forwarded / max(self.needed, 1)

    @property
    def computed(self) -> int:
        """Tokens the backend computed: prefilled plus generated, less the shared ones and
        those it sampled from kept logits (``reused``)."""
        return self.prefill + self.generated - self.shared - self.reused

    @property
    def computed_over_unique(self) -> float:
        """Generated plus prefilled tokens (less shared and reused) over the trie's tokens.
        Above 1.0 even for a perfect engine: a turn's last sampled token counts once as
        generated and again as prefilled in the next turn, where it is fed once
        (``computed - forwarded``)."""
        return self.computed / max(self.unique, 1)

    @property
    def forwarded_over_unique(self) -> float:
        """Tokens fed through the model over the trie tokens that must be fed (the trie's
        tokens less those nothing follows): 1.0 means every position the trees' contexts
        hold was fed exactly once across the whole batch; an excess means repeated turns
        (``replayed``) that the backend neither shared in one call nor reused from kept
        logits."""
        return self.forwarded / max(self.unique - self.unique_ends, 1)

    @property
    def saved_tokens(self) -> int:
        """Tokens the independent chains would have computed beyond this tree."""
        return self.chain_generated + self.chain_prefill - self.computed

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(**{k: getattr(self, k) + getattr(other, k)
                              for k in self.__dataclass_fields__})

    def as_dict(self) -> dict[str, float]:
        """Plain dict with the derived ratios, for logging."""
        d: dict[str, float] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["computed"] = self.computed
        d["computed_over_unique"] = self.computed_over_unique
        d["forwarded_over_needed"] = self.forwarded_over_needed
        d["forwarded_over_unique"] = self.forwarded_over_unique
        d["saved_tokens"] = self.saved_tokens
        return d


def _trie_size(tree: RolloutTree) -> tuple[int, int, int]:
    """The token trie of every model context of the tree: ``(tokens, ends, replayed)``.

    Sibling turns that happen to hold identical tokens share trie entries (a prefix cache
    computes them once). ``ends``: trie tokens nothing follows (a leaf's last token, never fed
    to the model); ``replayed``: sampled tokens that were already in the trie when their node
    was made (creation order), i.e. a turn that repeats, token for token, what an earlier turn
    of the tree sampled in the same context."""
    trie: dict[int, Any] = {}
    size = replayed = 0
    end_of: dict[int, dict[int, Any]] = {}
    for node in tree.nodes:  # creation order: parents first
        current = trie if node.parent is None else end_of[node.parent.id]
        tokens = node.action_ids + ([] if node.is_leaf and node.parent is not None
                                    else node.observation_ids)
        for i, token in enumerate(tokens):
            following = current.get(token)
            if following is None:
                following = current[token] = {}
                size += 1
            elif i < len(node.action_ids):
                replayed += 1
            current = following
        end_of[node.id] = current
    ends, stack = 0, [trie]
    while stack:
        children = stack.pop()
        for following in children.values():
            ends += not following
            stack.append(following)
    return size, ends, replayed


def token_counts(tree: RolloutTree) -> TokenCounts:
    """Accounting of one tree from what its nodes recorded (``node.info['cost']``)."""
    counts = TokenCounts()
    group = leaves(tree)
    counts.leaves = len(group)
    counts.unique, counts.unique_ends, counts.replayed = _trie_size(tree)
    counts.held = len(tree.root.observation_ids)
    for node in tree.nodes[1:]:
        cost = node.info.get("cost", {})
        counts.held += len(node.action_ids) + len(node.observation_ids)
        counts.turns += 1
        counts.ends += not node.children
        counts.generated += len(node.action_ids)
        counts.prefill += int(cost.get("prefill", 0))
        counts.cached += int(cost.get("cached", 0))
        shared = int(cost.get("shared", 0))
        counts.shared += shared
        reused = int(cost.get("reused", 0))
        counts.reused += reused
        # A reply none of whose tokens this request fed: wholly shared, or replayed up to a
        # context an earlier request of the call fed, then shared (its last token's "never
        # fed" is already in ``shared``).
        counts.duplicates += bool(node.action_ids) and shared + reused == len(node.action_ids)
        counts.env_steps += 1
    for leaf in group:
        path = path_to(leaf)
        generated = sum(len(n.action_ids) for n in path)
        fed = len(tree.root.observation_ids) + sum(len(n.observation_ids) for n in path[1:-1])
        counts.chain_generated += generated
        counts.chain_prefill += fed
        counts.chain_unique += generated + fed
    return counts


def subtree_index(tree: RolloutTree, node: Node) -> int:
    """Which of the task's trees (Tree-GRPO's M per task) ``node`` lies in: the
    ``tree_index`` of its first-level ancestor when a strategy set one, else that ancestor's
    position among the root's children; -1 for the root."""
    path = path_to(node)
    if len(path) < 2:
        return -1
    first = path[1]
    return first.tree_index if first.tree_index is not None else tree.root.children.index(first)


def leaf_rewards(tree: RolloutTree, group: Sequence[Node] | None = None) -> list[float]:
    """Trajectory rewards of the group's leaves, in :func:`leaves` order."""
    return [trajectory_reward(leaf) for leaf in (group if group is not None else leaves(tree))]
