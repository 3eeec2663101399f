"""The engine without barriers (issue #11): the synchronous mode reproduces the lockstep loop,
units advance on their own, allocators grant more, slow environments do not block others."""

from __future__ import annotations

import copy
import re
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from treeroll.backends.hf import HFBackend
from treeroll.base import Budget, SamplingExtras
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.envs.swe import ScriptedSWEAgent, builtin_tasks, make_swe_env
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.scorers import FrozenLakeProgress
from treeroll.strategies import PATR, Chain, RandomTree, TreeGRPO
from treeroll.tree import NodeStatus, leaves, subtree_index
from treeroll.tree_json import tree_to_dict

from ._lockstep import rollout_lockstep
from .conftest import ScriptedBackend

MOVES = ["Up", "Down", "Left", "Right"]


def _canonical(tree, scrub: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """Everything a tree records but wall times; with ``scrub`` (SWE tasks over bytes) the
    sandbox's random folder name and the durations pytest prints in its summary (``1 failed
    in 0.03s``: wall time, which made the SWE comparison flaky) are blanked in every text and
    byte-token list."""

    def clean(value, key=""):  # type: ignore[no-untyped-def]
        if isinstance(value, dict):
            return {k: clean(v, k) for k, v in value.items() if "seconds" not in k}
        if isinstance(value, list):
            if scrub and key.endswith("_ids") and all(isinstance(v, int) for v in value):
                return clean(bytes(v for v in value if v < 256).decode("utf-8", "replace"))
            return [clean(v) for v in value]
        if scrub and isinstance(value, str):
            value = re.sub(r"treeroll-swe-[A-Za-z0-9_]+", "treeroll-swe-X", value)
            return re.sub(r" in \d+\.\d\ds\b", " in T.TTs", value)
        return value

    return clean(tree_to_dict(tree))


STRATEGIES = [
    (Chain(group_size=4), None, RolloutConfig(max_turn_tokens=6)),
    (TreeGRPO(m=2, n=2, l=2, k=3, include_root=True), None,
     RolloutConfig(max_turn_tokens=6, max_generated_tokens=150)),
    (TreeGRPO(m=3, n=2, l=1), None, RolloutConfig(max_turn_tokens=6, max_leaves=7)),
    (PATR(b0=2, k_turns=2, top_k=1, m=2, theta=3), FrozenLakeProgress(),
     RolloutConfig(max_turn_tokens=6, max_leaves=6)),
    (RandomTree(b0=2, k_turns=1, top_k=2, m=2), None,
     RolloutConfig(max_turn_tokens=5, max_generated_tokens=120)),
]


@pytest.mark.parametrize("strategy,scorer,config", STRATEGIES,
                         ids=[s.name for s, _, _ in STRATEGIES])
def test_synchronous_engine_gives_the_lockstep_trees_token_for_token_on_frozenlake(
        strategy, scorer, config, tiny_model, word_tokenizer) -> None:
    fmt = TurnFormat(word_tokenizer)
    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=4)
    sync = RolloutConfig(**{**config.__dict__, "synchronous": True})
    old = rollout_lockstep([3, 4, 5], make_env, HFBackend(tiny_model), fmt,
                           copy.deepcopy(strategy), config=sync, scorer=scorer, seed=11)
    new = rollout([3, 4, 5], make_env, HFBackend(tiny_model), fmt, copy.deepcopy(strategy),
                  config=sync, scorer=scorer, seed=11)
    assert [_canonical(t) for t in new.trees] == [_canonical(t) for t in old.trees]
    assert sum(len(t.nodes) for t in new.trees) > 3 * 3  # the trees did grow


@pytest.mark.parametrize("strategy", [Chain(group_size=3), TreeGRPO(m=2, n=1, l=1)],
                         ids=["chain", "tree_grpo"])
def test_synchronous_engine_gives_the_lockstep_trees_token_for_token_on_swe_tasks(
        strategy) -> None:
    tasks = builtin_tasks()
    agent = ScriptedSWEAgent(tasks)
    fmt = TurnFormat(ByteTokenizer())
    make_env = lambda: make_swe_env("mini", tasks, step_limit=4)
    config = RolloutConfig(max_turn_tokens=4000, synchronous=True)
    old = rollout_lockstep([0, 1], make_env, agent, fmt, copy.deepcopy(strategy),
                           config=config, seed=2)
    new = rollout([0, 1], make_env, agent, fmt, copy.deepcopy(strategy), config=config, seed=2)
    assert [_canonical(t, True) for t in new.trees] == [_canonical(t, True) for t in old.trees]
    assert all(len(leaves(t)) >= 2 for t in new.trees)


class _LengthByFirstReply:
    """The first reply decides the episode: ``short`` lasts 2 turns, anything else 6."""

    system_prompt = "len"

    def __init__(self) -> None:
        self.turn, self.limit = 0, 0

    def reset(self, seed: int) -> str:
        self.turn, self.limit = 0, 0
        return "go"

    def step(self, action: str):  # type: ignore[no-untyped-def]
        self.turn += 1
        self.limit = self.limit or (2 if action.strip() == "short" else 6)
        done = self.turn >= self.limit
        return f"turn {self.turn}", float(done), done, False, {"success": done}

    def fork(self):  # type: ignore[no-untyped-def]
        return copy.deepcopy(self)


class _RecordingScripted(ScriptedBackend):
    """A scripted backend that records the prompts of every call."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies)
        self.prompts: list[list[tuple[int, ...]]] = []

    def generate(self, requests, params):  # type: ignore[no-untyped-def]
        self.prompts.append([r.prompt_ids for r in requests])
        return super().generate(requests, params)


def test_tree_grpo_expands_each_tree_as_soon_as_its_own_chain_ends(byte_format) -> None:
    """Tree 0's chain lasts 2 turns, tree 1's 6. Synchronised, tree 0 is expanded after
    tree 1's chain has ended (call 7); unsynchronised, in the call right after its own chain
    ended (call 3), beside tree 1's chain. Either way each tree gets its 1 + L*N leaves."""
    expanded_at = {}
    for synchronous in (True, False):
        backend = _RecordingScripted(["short", "long"])  # call 1: chain 0 short, chain 1 long
        batch = rollout([0], _LengthByFirstReply, backend, byte_format, TreeGRPO(m=2, n=1, l=2),
                        config=RolloutConfig(synchronous=synchronous), seed=0)
        tree = batch.trees[0]
        groups: dict[int, int] = {}
        for leaf in leaves(tree):
            groups[subtree_index(tree, leaf)] = groups.get(subtree_index(tree, leaf), 0) + 1
        assert groups == {0: 3, 1: 3}
        # Tree 0's only node to branch from is its first turn: its prompt in call 2, again
        # when tree 0 is expanded.
        short = next(p for p in backend.prompts[1] if b"short" in bytes(i for i in p if i < 256))
        calls = [i + 1 for i, prompts in enumerate(backend.prompts) if short in prompts]
        expanded_at[synchronous] = calls[1]
    assert expanded_at == {True: 7, False: 3}


def _shape(node):  # type: ignore[no-untyped-def]
    """A node and its subtree with what the policy and the environment produced, children
    sorted (node ids and child order follow the order in which units finish)."""
    children = sorted(_shape(child) for child in node.children)
    return (tuple(node.action_ids), tuple(node.action_logprobs), tuple(node.observation_ids),
            node.reward, node.status, node.tree_index, tuple(children))


def test_unsynchronised_rollout_does_not_depend_on_env_workers_or_repeats(byte_format) -> None:
    """Request seeds come from (seed, tree, node, child number): stepping environments on a
    thread pool, in whatever order they finish, gives the same trees."""
    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=4)
    results = []
    for workers in (0, 3, 3):
        for strategy in (Chain(group_size=3), TreeGRPO(m=2, n=2, l=1)):
            batch = rollout([1, 2, 3], make_env, ScriptedBackend(MOVES, choose_by_seed=True),
                            byte_format, strategy,
                            config=RolloutConfig(env_workers=workers, synchronous=False),
                            seed=5)
            results.append([_shape(t.root) for t in batch.trees])
    assert results[0] == results[2] == results[4]
    assert results[1] == results[3] == results[5]



def test_an_unsynchronised_tree_does_not_depend_on_the_other_trees_of_its_batch() -> None:
    """Strategy seeds come from (seed, tree id): a task rolled out alone, with its tree id,
    grows the tree it grows in a batch (what spreading a batch over workers needs). The
    random tree's branch choices come from that seed, so a batch-dependent seed would show."""
    import torch

    from treeroll.policies.model import ModelConfig, build_model

    model = build_model(ByteTokenizer.vocab_size, ModelConfig(hidden_size=32, num_layers=1,
                        num_heads=2, intermediate_size=64, seed=0), pad_token_id=0,
                        eos_token_id=ByteTokenizer.eos_token_id).eval()
    torch.manual_seed(0)
    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=4)
    config = RolloutConfig(synchronous=False, max_turn_tokens=6, max_leaves=6)
    turns = TurnFormat(ByteTokenizer())
    strategy = RandomTree(b0=2, k_turns=1, top_k=1, m=2)
    batch = rollout([11, 12, 13], make_env, HFBackend(model), turns, strategy, config=config,
                    seed=3, first_group_id=7)
    alone = rollout([12], make_env, HFBackend(model), turns, strategy, config=config, seed=3,
                    first_group_id=8)
    alone_tree, batch_tree = tree_to_dict(alone.trees[0]), tree_to_dict(batch.trees[1])
    # The same tokens and structure exactly; logprobs to float tolerance, since a decode batch
    # of one and of three take different matmul shapes (on some CPUs, different kernels).
    alone_logprobs = [n.pop("action_logprobs") for n in alone_tree["nodes"]]
    batch_logprobs = [n.pop("action_logprobs") for n in batch_tree["nodes"]]
    assert alone_tree == batch_tree
    for mine, theirs in zip(alone_logprobs, batch_logprobs, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-4)

class _OneMoreTo:
    """Grants tree ``index`` ``extra`` more leaves once, when every tree is idle."""

    def __init__(self, index: int, extra: int) -> None:
        self.index, self.extra, self.asked, self.given = index, extra, 0, False

    def start(self, trees):  # type: ignore[no-untyped-def]
        return [Budget(leaves=3) for _ in trees]

    def grant(self, trees, idle):  # type: ignore[no-untyped-def]
        self.asked += 1
        assert sorted(idle) == list(range(len(trees)))  # asked when all are idle
        if self.given:
            return {}
        self.given = True
        return {self.index: Budget(leaves=self.extra)}


@pytest.mark.parametrize("synchronous", [True, False])
def test_allocator_grants_more_budget_to_a_finished_tree_and_it_continues(
        byte_format, synchronous) -> None:
    allocator = _OneMoreTo(index=1, extra=2)
    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=3)
    batch = rollout([1, 2, 3], make_env, ScriptedBackend(MOVES, choose_by_seed=True),
                    byte_format, Chain(group_size=3),
                    config=RolloutConfig(synchronous=synchronous), allocator=allocator, seed=0)
    assert [len(leaves(t)) for t in batch.trees] == [3, 5, 3]
    assert allocator.asked == 2
    extra = batch.trees[1].root.children[3:]
    assert len(extra) == 2 and all(n.parent is batch.trees[1].root for n in extra)
    assert all(leaf.status in NodeStatus.STOPPED for leaf in leaves(batch.trees[1]))


def test_allocator_budgets_are_per_task(byte_format) -> None:
    class Uneven:
        def start(self, trees):  # type: ignore[no-untyped-def]
            return [Budget(leaves=i + 1) for i in range(len(trees))]

        def grant(self, trees, idle):  # type: ignore[no-untyped-def]
            return {}

    batch = rollout([1, 2, 3], lambda: make_frozenlake("rllm", size_min=3, size_max=3),
                    ScriptedBackend(MOVES, choose_by_seed=True), byte_format,
                    Chain(group_size=8), allocator=Uneven(), seed=0)
    assert [len(leaves(t)) for t in batch.trees] == [1, 2, 3]


def test_allocator_granting_to_a_busy_tree_is_an_error(byte_format) -> None:
    class Wrong:
        def start(self, trees):  # type: ignore[no-untyped-def]
            return [Budget() for _ in trees]

        def grant(self, trees, idle):  # type: ignore[no-untyped-def]
            return {len(trees) + 5: Budget(leaves=1)}

    with pytest.raises(ValueError, match="not idle"):
        rollout([1], lambda: make_frozenlake("rllm", size_min=3, size_max=3),
                ScriptedBackend(MOVES, choose_by_seed=True), byte_format, Chain(group_size=1),
                allocator=Wrong(), seed=0)


class _Sleepy:
    """FrozenLake whose task 0 sleeps ``delay`` seconds in every step; records when each
    step of each task finished."""

    finished: ClassVar[dict[int, list[float]]] = {}

    def __init__(self, delay: float) -> None:
        self.env, self.delay, self.task = make_frozenlake("rllm", size_min=3, size_max=3), delay, 0
        self.system_prompt = self.env.system_prompt

    def reset(self, seed: int) -> str:
        self.task = seed
        return self.env.reset(seed)

    def step(self, action: str):  # type: ignore[no-untyped-def]
        if self.task == 0:
            time.sleep(self.delay)
        result = self.env.step(action)
        _Sleepy.finished.setdefault(self.task, []).append(time.perf_counter())
        return result

    def fork(self):  # type: ignore[no-untyped-def]
        twin = copy.copy(self)
        twin.env = self.env.fork()
        return twin


@pytest.mark.parametrize("synchronous", [False, True])
def test_a_slow_environment_does_not_block_other_branches_generation(
        byte_format, synchronous) -> None:
    """Task 0's steps sleep 0.4 s each. With env workers the other tasks' branches keep
    generating meanwhile: all their turns end before task 0's first step does. The
    synchronous engine (control) waits for task 0 at every turn."""
    _Sleepy.finished = {}
    batch = rollout([0, 1, 2], lambda: _Sleepy(0.4), ScriptedBackend(["idle"]), byte_format,
                    Chain(group_size=2),
                    config=RolloutConfig(env_workers=4, synchronous=synchronous), seed=0)
    turns_of_others = len(_Sleepy.finished[1])
    assert turns_of_others >= 4  # idle replies: every chain runs to FrozenLake's turn limit
    first_slow = min(_Sleepy.finished[0])
    others_done = max(_Sleepy.finished[1] + _Sleepy.finished[2])
    if synchronous:
        assert others_done > first_slow
    else:
        assert others_done < first_slow
    assert all(len(leaves(t)) == 2 for t in batch.trees)
    assert threading.active_count() < 20  # the pool was shut down


def test_unit_strategy_units_must_match_the_frontier(byte_format) -> None:
    class Broken(Chain):
        def units(self, tree, frontier, ctx):  # type: ignore[no-untyped-def]
            return [0]

    with pytest.raises(ValueError, match="units returned 1 units for 2"):
        rollout([1], lambda: make_frozenlake("rllm", size_min=3, size_max=3),
                ScriptedBackend(MOVES), byte_format, Broken(group_size=2),
                config=RolloutConfig(synchronous=False), seed=0)


def test_request_seeds_differ_between_children_of_one_node(byte_format) -> None:
    """The derived seeds give k different samples for a node listed k times."""
    batch = rollout([1], lambda: make_frozenlake("rllm", size_min=3, size_max=3),
                    ScriptedBackend(MOVES, choose_by_seed=True), byte_format,
                    Chain(group_size=12),
                    config=RolloutConfig(max_depth=1, synchronous=False), seed=0)
    first_moves = {n.action_text for n in batch.trees[0].root.children}
    assert len(first_moves) >= 3
    assert np.isfinite([n.reward for n in batch.trees[0].nodes]).all()


@dataclass
class _EntropyChain(Chain):
    """A chain that asks for each turn's entropy and top-3 logprobs (as ARPO would)."""

    def sampling_extras(self) -> SamplingExtras:
        return SamplingExtras(entropy_window=4, top_logprobs=3)


def test_a_strategy_that_asks_for_entropy_gets_it(tiny_model, word_tokenizer) -> None:
    fmt = TurnFormat(word_tokenizer)
    make_env = lambda: make_frozenlake("rllm", size_min=3, size_max=3)
    config = RolloutConfig(max_turn_tokens=5)  # entropy_window 0 in the config
    asked = rollout([2], make_env, HFBackend(tiny_model), fmt, _EntropyChain(group_size=2),
                    config=config, seed=1).trees[0]
    plain = rollout([2], make_env, HFBackend(tiny_model), fmt, Chain(group_size=2),
                    config=config, seed=1).trees[0]
    turns = asked.nodes[1:]
    assert turns and all(n.entropy is not None and 0 < n.entropy <= 1 for n in turns)
    for node in turns:
        top = node.info["top_logprobs"]
        assert len(top) == len(node.action_ids) and all(len(p) == 3 for p in top)
        for (best_id, best), logprob in zip((p[0] for p in top), node.action_logprobs,
                                            strict=True):
            assert best >= logprob - 1e-6  # the sampled id is never more probable than the top
            assert 0 <= best_id < len(word_tokenizer)
    assert all(n.entropy is None and "top_logprobs" not in n.info for n in plain.nodes[1:])


class _Counted:
    """FrozenLake that counts its live snapshots (CPython frees them when dropped)."""

    live = 0

    def __init__(self, env=None) -> None:  # type: ignore[no-untyped-def]
        self.env = env or make_frozenlake("rllm", size_min=3, size_max=3)
        self.system_prompt = self.env.system_prompt
        _Counted.live += 1

    def __del__(self) -> None:
        _Counted.live -= 1

    def reset(self, seed: int) -> str:
        return self.env.reset(seed)

    def step(self, action: str):  # type: ignore[no-untyped-def]
        return self.env.step(action)

    def fork(self) -> _Counted:
        return _Counted(self.env.fork())


class _KeepsAll(TreeGRPO):
    """Tree-GRPO without the snapshot hint: every node keeps its snapshot to the end."""

    def keeps_snapshot(self, tree, node, ctx) -> bool:  # type: ignore[no-untyped-def]
        return True


def test_snapshots_are_dropped_once_no_round_can_branch_from_them(byte_format) -> None:
    """With l=1, once the expansion round has picked its nodes no other node will be branched
    from: their snapshots go, so fewer environments are alive during the expansion."""
    peaks = {}
    for strategy in (TreeGRPO(m=2, n=1, l=1), _KeepsAll(m=2, n=1, l=1)):
        seen: list[int] = []
        _Counted.live = 0
        rollout([1], _Counted, ScriptedBackend(["idle"]), byte_format, strategy,
                config=RolloutConfig(synchronous=True), seed=0,
                on_turn=lambda turns, ready, seen=seen: seen.append(_Counted.live))
        peaks[type(strategy).__name__] = seen[-1]  # during the last expansion turn
    assert peaks["TreeGRPO"] < peaks["_KeepsAll"], peaks
