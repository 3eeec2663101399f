"""A plug-in environment or process scorer that raises fails its branch, not the batch."""

from __future__ import annotations

from typing import ClassVar

import pytest

from treeroll.base import Score
from treeroll.engine import RolloutConfig, rollout
from treeroll.engine.batch import count_status
from treeroll.envs import make_frozenlake
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.strategies import PATR, Chain, TreeGRPO
from treeroll.tree import NodeStatus, leaves

from .conftest import ScriptedBackend

MOVES = ["Right", "Down", "Left", "Up"]


class Flaky:
    """FrozenLake that raises in ``step``, ``fork`` or ``reset`` when told to."""

    def __init__(self, *, step_on: str | None = None, reset_on: int | None = None,
                 fork_raises: bool = False, error: type[BaseException] = RuntimeError) -> None:
        self.inner = make_frozenlake("rllm", size_min=3, size_max=4)
        self.step_on, self.reset_on, self.fork_raises = step_on, reset_on, fork_raises
        self.error = error
        self.system_prompt = self.inner.system_prompt
        self.seed = -1

    def reset(self, seed: int) -> str:
        self.seed = seed
        if seed == self.reset_on:
            raise self.error(f"reset of task {seed} broke")
        return self.inner.reset(seed)

    def step(self, action: str):  # type: ignore[no-untyped-def]
        if self.step_on is not None and self.step_on in action and self.seed == 2:
            raise self.error("step broke on " + self.step_on)
        return self.inner.step(action)

    def fork(self) -> Flaky:
        if self.fork_raises:
            raise self.error("fork broke")
        twin = Flaky(step_on=self.step_on, reset_on=self.reset_on, error=self.error)
        twin.inner, twin.seed = self.inner.fork(), self.seed
        return twin


def _backend() -> ScriptedBackend:
    return ScriptedBackend([f"```{m}```" for m in MOVES], choose_by_seed=True)


def _run(make_env, strategy, scorer=None, **config):  # type: ignore[no-untyped-def]
    return rollout([1, 2, 3], make_env, _backend(), TurnFormat(ByteTokenizer()), strategy,
                   config=RolloutConfig(max_turn_tokens=12, **config), scorer=scorer, seed=5)


def _failed(tree):  # type: ignore[no-untyped-def]
    return [n for n in tree.nodes if n.status == NodeStatus.FAILED]


def test_a_step_that_raises_fails_that_branch_and_the_batch_goes_on():
    batch = _run(lambda: Flaky(step_on="Down"), Chain(group_size=4))
    broken, *fine = [t for t in batch.trees if t.task_seed == 2] + \
        [t for t in batch.trees if t.task_seed != 2]
    failed = _failed(broken)
    assert failed and all("the environment raised RuntimeError: step broke on Down" in n.note
                          for n in failed)
    assert all(not n.children and n not in leaves(broken) for n in failed)
    assert count_status([broken])["failed"] == len(failed)
    assert len(leaves(broken)) == 4 - len(failed)  # the other chains are trajectories
    assert all(not _failed(t) and len(leaves(t)) == 4 for t in fine)


def test_a_reset_that_raises_fails_that_task_only():
    batch = _run(lambda: Flaky(reset_on=3), TreeGRPO(m=2, n=1, l=1), max_leaves=8)
    by_seed = {t.task_seed: t for t in batch.trees}
    root = by_seed[3].root
    assert root.status == NodeStatus.FAILED and "reset raised RuntimeError" in root.note
    assert len(by_seed[3].nodes) == 1 and not leaves(by_seed[3])
    assert all(leaves(by_seed[s]) for s in (1, 2))


def test_a_fork_that_raises_skips_that_branch():
    batch = _run(lambda: Flaky(fork_raises=True), Chain(group_size=3))
    for tree in batch.trees:  # every chain needs a fork of the root: none can start
        assert "fork raised RuntimeError: fork broke" in tree.root.note
        assert not leaves(tree)


def test_a_scorer_that_raises_fails_the_scored_nodes_and_they_are_never_continued():
    calls = {"n": 0}

    def scorer(tree, nodes):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if tree.task_seed == 2:
            raise ValueError("scorer broke")
        return [Score(0.5, "ok")] * len(nodes)

    batch = _run(lambda: make_frozenlake("rllm", size_min=3, size_max=4),
                 PATR(b0=2, k_turns=1, top_k=1, m=2, theta=3), scorer=scorer, max_leaves=6)
    by_seed = {t.task_seed: t for t in batch.trees}
    failed = _failed(by_seed[2])
    assert calls["n"] > 0 and failed
    assert all("the process scorer raised ValueError: scorer broke" in n.note for n in failed)
    assert all(not n.children for n in failed)
    assert all(not _failed(by_seed[s]) and leaves(by_seed[s]) for s in (1, 3))


def test_a_scorer_returning_too_few_scores_is_contained():
    batch = _run(lambda: make_frozenlake("rllm", size_min=3, size_max=4),
                 PATR(b0=2, k_turns=1, top_k=1, m=2, theta=3),
                 scorer=lambda tree, nodes: [Score(0.5, "one")], max_leaves=6)
    notes = [n.note for t in batch.trees for n in _failed(t)]
    assert notes and all("returned 1 scores for 2 nodes" in note for note in notes)


def test_keyboard_interrupt_is_not_contained():
    with pytest.raises(KeyboardInterrupt):
        _run(lambda: Flaky(step_on="Down", error=KeyboardInterrupt), Chain(group_size=2))


class ForksTwice:
    """Four steps per episode, any reply; forks twice per task, then every fork raises (a
    plug-in leaking a resource, say)."""

    left: ClassVar[dict[int, int]] = {}
    system_prompt = "Say anything."

    def __init__(self, seed: int = -1, steps: int = 0) -> None:
        self.seed, self.steps = seed, steps

    def reset(self, seed: int) -> str:
        self.seed, self.steps = seed, 0
        return f"task {seed}"

    def step(self, action: str):  # type: ignore[no-untyped-def]
        self.steps += 1
        done = self.steps >= 4
        return f"step {self.steps}", float(done and "Right" in action), done, False, {}

    def fork(self) -> ForksTwice:
        left = ForksTwice.left.setdefault(self.seed, 2)
        if left <= 0:
            raise RuntimeError("out of forks")
        ForksTwice.left[self.seed] = left - 1
        return ForksTwice(self.seed, self.steps)


@pytest.mark.parametrize("strategy", ["igrpo", "tree_grpo", "rtpo"])
def test_forks_that_start_failing_end_the_tree_not_the_batch(strategy):
    from treeroll.strategies.igrpo import IGRPO
    from treeroll.strategies.rtpo import RTPO

    ForksTwice.left = {}
    made = {"igrpo": IGRPO(m=6, per_round=1), "tree_grpo": TreeGRPO(m=2, n=2, l=1),
            "rtpo": RTPO(m=6)}[strategy]
    batch = _run(lambda: ForksTwice(), made, max_leaves=8)
    for tree in batch.trees:
        noted = [n for n in tree.nodes if "fork raised RuntimeError: out of forks" in n.note]
        assert noted  # the third fork of every task failed, and it was said where
        assert all(not n.children or n.status != NodeStatus.FAILED for n in tree.nodes)
        assert len(leaves(tree)) <= 2  # only what the two forks grew


class AlwaysRoot:
    """Asks to branch from the root again after every unit (a strategy that revisits)."""

    name = "always_root"
    revisits_nodes = True

    def start(self, tree, ctx):  # type: ignore[no-untyped-def]
        return [tree.root, tree.root]

    def step(self, tree, created, ctx):  # type: ignore[no-untyped-def]
        return [tree.root] if len(tree.nodes) < 50 else []


def test_a_node_whose_fork_fails_is_never_asked_again():
    ForksTwice.left = {}
    batch = _run(lambda: ForksTwice(), AlwaysRoot())  # without the guard: RecursionError
    for tree in batch.trees:
        assert "fork raised RuntimeError: out of forks" in tree.root.note
        assert len(tree.root.children) == 2 and tree.root.env is None
