"""The lockstep rollout loop treeroll had before :mod:`treeroll.engine.loop`, frozen as the
reference the engine's synchronous mode must reproduce token for token (issue #11). Do not
change it: it is what every figure measured before the engine was measured with."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from treeroll.base import (
    Env,
    FinishingStrategy,
    GenerationBackend,
    GenerationRequest,
    ProcessScorer,
    SamplingParams,
    Strategy,
    StrategyContext,
)
from treeroll.engine import RolloutBatch, RolloutConfig
from treeroll.engine.batch import TimedScorer
from treeroll.formatting import TurnFormat
from treeroll.tree import Node, NodeStatus, RolloutTree


def rollout_lockstep(
    tasks: Sequence[int] | np.ndarray,
    make_env: Callable[[], Env],
    backend: GenerationBackend,
    turn_format: TurnFormat,
    strategy: Strategy,
    *,
    config: RolloutConfig = RolloutConfig(),  # noqa: B008
    scorer: ProcessScorer | None = None,
    seed: int = 0,
    first_group_id: int = 0,
    on_turn: Callable[[int, int], None] | None = None,
) -> RolloutBatch:
    """Grow one tree per task seed in ``tasks``; see the module docstring."""
    start = time.perf_counter()
    timing = {"generate": 0.0, "env": 0.0, "score": 0.0}
    timed = TimedScorer(scorer) if scorer is not None else None
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                            max_new_tokens=config.max_turn_tokens,
                            stop_token_ids=turn_format.stop_token_ids,
                            entropy_window=config.entropy_window)
    rng = np.random.default_rng(seed)
    trees: list[RolloutTree] = []
    contexts_of: list[dict[int, tuple[int, ...]]] = []
    ctxs: list[StrategyContext] = []
    frontiers: list[list[Node]] = []
    for i, task_seed in enumerate(tasks):
        env = make_env()
        tick = time.perf_counter()
        first_observation = env.reset(int(task_seed))
        timing["env"] += time.perf_counter() - tick
        prompt_ids, prompt_text = turn_format.prompt(env.system_prompt, first_observation)
        tree = RolloutTree.new(int(task_seed), tree_id=first_group_id + i,
                               group_id=first_group_id + i, prompt_ids=prompt_ids,
                               prompt_text=prompt_text)
        tree.root.env = env
        tree.meta["strategy"] = getattr(strategy, "name", type(strategy).__name__)
        trees.append(tree)
        contexts_of.append({0: tuple(prompt_ids)})
        ctx = StrategyContext(rng=np.random.default_rng(rng.integers(2**63)),
                              max_leaves=config.max_leaves,
                              tokens_left=config.max_generated_tokens, scorer=timed)
        ctxs.append(ctx)
        frontiers.append(_clip(tree, strategy.start(tree, ctx), ctx, config))

    turn = 0
    while any(frontiers):
        turn += 1
        requests: list[GenerationRequest] = []
        owners: list[tuple[int, Node]] = []
        for t, frontier in enumerate(frontiers):
            caps = _token_caps(len(frontier), ctxs[t].tokens_left, config.max_turn_tokens)
            for node, cap in zip(frontier, caps, strict=True):
                if cap == 0:
                    continue
                requests.append(GenerationRequest(prompt_ids=contexts_of[t][node.id],
                                                  max_new_tokens=cap,
                                                  seed=int(rng.integers(2**62))))
                owners.append((t, node))
        tick = time.perf_counter()
        completions = backend.generate(requests, params) if requests else []
        timing["generate"] += time.perf_counter() - tick

        uses = Counter(id(node) for _, node in owners)
        created: list[list[Node]] = [[] for _ in trees]
        tick = time.perf_counter()
        for (t, node), completion in zip(owners, completions, strict=True):
            tree = trees[t]
            uses[id(node)] -= 1
            assert node.env is not None, f"node {node.id} has no environment to continue from"
            if uses[id(node)] > 0 or strategy.revisits_nodes:
                env = node.env.fork()
            else:
                env, node.env = node.env, None
            action_text = turn_format.decode_action(completion.token_ids)
            observation, reward, terminated, truncated, info = env.step(action_text)
            truncated = truncated or (node.depth + 1 >= config.max_depth and not terminated)
            ended = terminated or truncated
            ended_turn = completion.finish_reason == "stop"
            obs_ids, obs_text = ([], observation) if ended else turn_format.observation(
                observation, action_ended_turn=ended_turn)
            info = dict(info)
            info["cost"] = {"prefill": completion.prefill_tokens,
                            "cached": completion.cached_tokens,
                            "shared": completion.shared_tokens,
                            "reused": completion.reused_tokens}
            child = tree.add_child(
                node, action_ids=list(completion.token_ids),
                action_logprobs=list(completion.logprobs), action_text=action_text,
                observation_ids=list(obs_ids), observation_text=obs_text, reward=float(reward),
                terminated=bool(terminated), truncated=bool(truncated), info=info,
                finish_reason=completion.finish_reason, entropy=completion.entropy,
                status=(NodeStatus.TERMINAL if terminated else
                        NodeStatus.TRUNCATED if truncated else NodeStatus.ACTIVE))
            node.status = NodeStatus.EXPANDED
            if not ended:
                child.env = env
                contexts_of[t][child.id] = (contexts_of[t][node.id] + tuple(child.action_ids)
                                            + tuple(obs_ids))
            left = ctxs[t].tokens_left
            if left is not None:
                ctxs[t].tokens_left = left - len(child.action_ids)
            created[t].append(child)
        timing["env"] += time.perf_counter() - tick

        for t, tree in enumerate(trees):
            before = len(frontiers[t])
            for node in frontiers[t]:
                if not node.children and node.status == NodeStatus.ACTIVE:
                    node.status, node.note = NodeStatus.BUDGET, "no tokens left for another turn"
            if not created[t] and before == 0:
                frontiers[t] = []
                continue
            frontier = strategy.step(tree, created[t], ctxs[t])
            frontiers[t] = _clip(tree, frontier, ctxs[t], config)
            if not strategy.revisits_nodes:
                live = {id(n) for n in frontiers[t]}
                for node in created[t]:
                    if id(node) not in live:
                        node.env = None
        if on_turn is not None:
            on_turn(turn, sum(len(f) for f in frontiers))

    for tree, ctx in zip(trees, ctxs, strict=True):
        for node in tree.nodes:
            node.env = None
            if node.status == NodeStatus.ACTIVE:
                node.status = NodeStatus.BUDGET
                node.note = node.note or "stopped with the rollout (budget)"
        if isinstance(strategy, FinishingStrategy):  # e.g. Tree-GRPO keeps k leaves per tree
            strategy.finish(tree, ctx)
        tree.meta["config"] = {"max_leaves": config.max_leaves,
                               "max_generated_tokens": config.max_generated_tokens,
                               "max_turn_tokens": config.max_turn_tokens,
                               "temperature": config.temperature}
        tree.meta["turns"] = turn
    if timed is not None:
        timing["score"] = timed.seconds
        timing["generate_and_env"] = timing["generate"] + timing["env"]  # scoring is in neither
        for tree in trees:
            tree.meta["scorer_seconds_batch"] = timed.seconds
            tree.meta["scorer_calls_batch"] = timed.calls
            tree.meta["scored_nodes_batch"] = timed.nodes
    timing["total"] = time.perf_counter() - start
    return RolloutBatch(trees=trees, timing=timing)


def _token_caps(entries: int, tokens_left: int | None, per_turn: int) -> list[int]:
    """Per-entry generation caps that never exceed the tokens left (0 = entry is cut)."""
    if tokens_left is None:
        return [per_turn] * entries
    if entries == 0:
        return []
    share, extra = divmod(max(tokens_left, 0), entries)
    return [min(per_turn, share + (1 if i < extra else 0)) for i in range(entries)]


def _clip(tree: RolloutTree, frontier: list[Node], ctx: StrategyContext,
          config: RolloutConfig) -> list[Node]:
    """Drop frontier entries the budget does not allow; record why on the nodes."""
    frontier = [n for n in frontier if not n.ended]
    if ctx.tokens_left is not None and ctx.tokens_left <= 0:
        for node in frontier:
            if not node.children:
                node.status, node.note = NodeStatus.BUDGET, "generated-token budget spent"
        return []
    if ctx.max_leaves is None:
        return frontier
    finished = sum(1 for n in tree.nodes
                   if n.is_leaf and n.parent is not None and n.status in NodeStatus.STOPPED
                   and n.status != NodeStatus.DROPPED)
    room = ctx.max_leaves - finished
    if len(frontier) <= room:
        return frontier
    # Keep one continuation of every distinct node first, then extra branches, in order.
    first: list[Node] = []
    extra: list[Node] = []
    seen: set[int] = set()
    for node in frontier:
        (extra if id(node) in seen else first).append(node)
        seen.add(id(node))
    kept = (first + extra)[:max(room, 0)]
    for node in first[max(room, 0):]:
        if not node.children:
            node.status, node.note = NodeStatus.BUDGET, "leaf budget reached"
    return kept
