"""The rollout engine: every branch a small state machine, no barrier between trees.

A *branch* is one frontier entry on its way to becoming a child node: it waits for the model
(``WAITING_MODEL``), then for its environment step (``WAITING_ENV``), then it is a node
(``DONE``). The engine loops::

    ready branches -> one backend call -> environment steps (inline or on a thread pool)
    -> finished steps become nodes -> the strategy sees each finished *unit* -> new branches

What a unit is (the whole tree, or a :class:`~treeroll.base.UnitStrategy`'s part of it), what
``RolloutConfig.synchronous`` and ``RolloutConfig.continuous`` change, and how request seeds
are drawn in each mode: the concepts page, *The engine* (``docs/concepts.md``). The budget
rule a tree keeps (never more tokens or leaves than its allocator grants; entries cut before a
frontier is sent, new branches first): *Budgets and allocators* there. Faults are contained
per branch (an environment or scorer that raises fails that node, left out of the group; the
rest of the batch goes on; ``BaseException`` is not caught): ``docs/faults.md``. A branch is
plain data (token ids, a node, an environment handle), so the thread pool can become remote
environment workers without the strategies changing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from treeroll.base import (
    Allocator,
    Completion,
    Env,
    ExtendableStrategy,
    FinishingStrategy,
    GenerationBackend,
    GenerationRequest,
    ProcessScorer,
    SamplingExtras,
    SamplingParams,
    SamplingStrategy,
    SnapshotStrategy,
    StepResult,
    Strategy,
    StrategyContext,
    StreamingBackend,
    UnitStrategy,
    plugin_name,
)
from treeroll.engine.allocators import UniformAllocator
from treeroll.engine.budgets import add_budget, clip_order, token_caps
from treeroll.engine.faults import (
    ENV_ERROR,
    ContainedScorer,
    contained,
    describe,
    fail,
    safe_step,
    timed_step,
)
from treeroll.engine.settings import RolloutConfig
from treeroll.formatting import TurnFormat
from treeroll.tree import Node, NodeStatus, RolloutTree

__all__ = ["run_engine"]


@dataclass(eq=False)
class _Unit:
    """Entries of one tree that the strategy sees together in one ``step``."""

    key: Hashable | None
    frontier: list[Node]
    waiting: int = 0
    back: list[_Branch] = field(default_factory=list)
    created: dict[int, Node] = field(default_factory=dict)


@dataclass(eq=False)
class _Branch:
    tree: int
    unit: _Unit
    position: int
    node: Node
    cap: int
    env: Env
    seed: int | None = None
    path: tuple[int, ...] = ()
    completion: Completion | None = None
    action_text: str = ""
    future: Future[tuple[StepResult, float]] | None = None
    result: StepResult | None = None


@dataclass(eq=False)
class _TreeRun:
    tree: RolloutTree
    ctx: StrategyContext
    contexts: dict[int, tuple[int, ...]]
    units: list[_Unit] = field(default_factory=list)
    in_flight: list[_Branch] = field(default_factory=list)
    children_asked: Counter[int] = field(default_factory=Counter)
    broken: set[int] = field(default_factory=set)
    """Ids of nodes that can no longer be continued (their fork or a scorer failed)."""
    paths: dict[int, tuple[int, ...]] = field(default_factory=lambda: {0: ()})
    """Node id -> child numbers from the root: a name that does not depend on the order in
    which units finish (node ids do)."""

    @property
    def idle(self) -> bool:
        return not self.units

    def live(self) -> int:
        """Branches of the other units still to end: in flight, or back but not yet seen by
        the strategy (each will end as one leaf or continue as one branch)."""
        return sum(unit.waiting + len(unit.back) for unit in self.units)


class _Engine:
    """One rollout of a batch of trees; see the module docstring. Built and run once."""

    def __init__(self, runs: list[_TreeRun], backend: GenerationBackend,
                 turn_format: TurnFormat, strategy: Strategy, params: SamplingParams, *,
                 config: RolloutConfig, allocator: Allocator, seed: int, rng: np.random.Generator,
                 on_turn: Callable[[int, int], None] | None, timing: dict[str, float]) -> None:
        self.runs, self.backend, self.turn_format = runs, backend, turn_format
        self.strategy, self.params, self.config = strategy, params, config
        self.allocator, self.seed, self.rng, self.on_turn = allocator, seed, rng, on_turn
        self.timing = timing
        self.sync = bool(config.synchronous)
        self.continuous = bool(config.continuous) and not self.sync
        self.waiting: dict[int, _Branch] = {}  # continuous: ticket -> branch being decoded
        self.use_units = not self.sync and isinstance(strategy, UnitStrategy)
        self.ready: list[_Branch] = []
        self.stepping: list[_Branch] = []
        self.pool = (ThreadPoolExecutor(max_workers=config.env_workers, thread_name_prefix="env")
                     if config.env_workers > 0 else None)
        self.turns = 0

    # ---------------------------------------------------------------- the loop
    def run(self) -> None:
        """Drive every tree until all are idle and the allocator grants nothing more."""
        try:
            while True:
                if self.continuous:
                    self._run_continuous()
                while self.ready or self.stepping:
                    called = bool(self.ready) and not (self.sync and self.stepping)
                    if called:
                        self._generate()
                    self._absorb(self._collect(may_wait=not self.ready))
                    if called and self.on_turn is not None:
                        self.on_turn(self.turns, len(self.ready))
                if not self._allocate():
                    return
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)

    def _run_continuous(self) -> None:
        """Continuous batching: ready branches join the backend's running decode batch; each
        decode step's finished replies start their environment steps at once."""
        backend: StreamingBackend = self.backend  # type: ignore[assignment]
        while self.ready or self.stepping or self.waiting:
            done: list[tuple[int, Completion]] = []
            if self.ready:
                batch, self.ready = self.ready, []
                tickets = backend.submit(self._requests(batch), self.params)
                self.waiting.update(zip(tickets, batch, strict=True))
            if self.waiting:
                self.turns += 1
                tick = time.perf_counter()
                done = backend.advance()
                self.timing["generate"] += time.perf_counter() - tick
                for ticket, completion in done:
                    self._start_step(self.waiting.pop(ticket), completion)
            self._absorb(self._collect(may_wait=not self.ready and not self.waiting))
            if done and self.on_turn is not None:  # live: queued or decoding
                self.on_turn(self.turns, len(self.ready) + len(self.waiting))
        if backend.busy:  # its own ledger and the engine's must agree, or stray replies follow
            raise RuntimeError(f"{type(backend).__name__} still holds requests that the engine "
                               "neither submitted nor collected (busy after the last reply)")

    def _requests(self, batch: list[_Branch]) -> list[GenerationRequest]:
        """One request per branch: its context, its token cap, its seed."""
        requests = []
        for branch in batch:
            if branch.seed is None:  # synchronous: drawn in call order, as the lockstep loop
                branch.seed = int(self.rng.integers(2**62))
            requests.append(GenerationRequest(prompt_ids=self.runs[branch.tree].contexts[
                branch.node.id], max_new_tokens=branch.cap, seed=branch.seed))
        return requests

    def _generate(self) -> None:
        """One backend call for every ready branch; start their environment steps."""
        self.turns += 1
        batch, self.ready = self.ready, []
        requests = self._requests(batch)
        tick = time.perf_counter()
        completions = self.backend.generate(requests, self.params)
        self.timing["generate"] += time.perf_counter() - tick
        if len(completions) != len(batch):
            raise RuntimeError(f"the backend returned {len(completions)} completions for "
                               f"{len(batch)} requests")
        for branch, completion in zip(batch, completions, strict=True):
            self._start_step(branch, completion)

    def _start_step(self, branch: _Branch, completion: Completion) -> None:
        """The branch's reply is in: step its environment (inline, or on the pool)."""
        branch.completion = completion
        branch.action_text = self.turn_format.decode_action(completion.token_ids)
        if self.pool is None:
            tick = time.perf_counter()
            branch.result = safe_step(branch.env, branch.action_text)
            self.timing["env"] += time.perf_counter() - tick
        else:
            branch.future = self.pool.submit(timed_step, branch.env, branch.action_text)
        self.stepping.append(branch)

    def _collect(self, may_wait: bool) -> list[_Branch]:
        """Branches whose environment step is done, in the order they were sent. Waits for
        all of them (synchronous), for at least one (``may_wait``: nothing else to do), or
        for none."""
        if self.pool is not None and self.stepping:
            futures = [b.future for b in self.stepping if b.future is not None]
            if self.sync:
                wait(futures)
            elif may_wait:
                wait(futures, return_when=FIRST_COMPLETED)
            for branch in self.stepping:
                if branch.future is not None and branch.future.done():
                    branch.result, seconds = branch.future.result()
                    self.timing["env"] += seconds
                    branch.future = None
        done = [b for b in self.stepping if b.result is not None]
        self.stepping = [b for b in self.stepping if b.result is None]
        return done

    # ---------------------------------------------------------------- nodes and units
    def _absorb(self, finished: list[_Branch]) -> None:
        """Turn finished branches into nodes; hand every completed unit to the strategy."""
        complete: dict[int, list[_Unit]] = {}
        for branch in finished:
            unit = branch.unit
            unit.waiting -= 1
            unit.back.append(branch)
            if unit.waiting == 0:  # its children are made in frontier order, once all are back
                for done in sorted(unit.back, key=lambda b: b.position):
                    self._add_child(done)
                unit.back = []
                complete.setdefault(branch.tree, []).append(unit)
        # The lockstep loop stepped the trees in order after the whole turn.
        for t in sorted(complete) if self.sync else complete:
            self._finish_units(t, complete[t])

    def _add_child(self, branch: _Branch) -> None:
        run, config = self.runs[branch.tree], self.config
        tree, node, completion = run.tree, branch.node, branch.completion
        assert completion is not None and branch.result is not None
        observation, reward, terminated, truncated, info = branch.result
        truncated = truncated or (node.depth + 1 >= config.max_depth and not terminated)
        ended = terminated or truncated
        stopped = completion.finish_reason == "stop" and bool(completion.token_ids)
        obs_ids, obs_text = ([], observation) if ended else self.turn_format.observation(
            observation, action_ended_turn=completion.finish_reason == "stop",
            ended_with=completion.token_ids[-1] if stopped else None)
        info = dict(info)
        error = info.pop(ENV_ERROR, None)
        if error is not None:
            truncated, ended, obs_ids, obs_text = True, True, [], ""
        info["cost"] = {"prefill": completion.prefill_tokens, "cached": completion.cached_tokens,
                        "shared": completion.shared_tokens,
                        "reused": completion.reused_tokens}
        if completion.top_logprobs is not None:
            info["top_logprobs"] = [[list(pair) for pair in position]
                                    for position in completion.top_logprobs]
        child = tree.add_child(
            node, action_ids=list(completion.token_ids),
            action_logprobs=list(completion.logprobs), action_text=branch.action_text,
            observation_ids=list(obs_ids), observation_text=obs_text, reward=float(reward),
            terminated=bool(terminated), truncated=bool(truncated), info=info,
            finish_reason=completion.finish_reason, entropy=completion.entropy,
            status=(NodeStatus.TERMINAL if terminated else
                    NodeStatus.TRUNCATED if truncated else NodeStatus.ACTIVE))
        if error is not None:
            fail(child, f"the environment raised {error}")
        node.status = NodeStatus.EXPANDED
        if not ended:
            child.env = branch.env
            run.contexts[child.id] = (run.contexts[node.id] + tuple(child.action_ids)
                                      + tuple(obs_ids))
        if run.ctx.tokens_left is not None:
            run.ctx.tokens_left -= len(child.action_ids)
        run.in_flight.remove(branch)
        run.paths[child.id] = branch.path
        branch.unit.created[branch.position] = child

    def _finish_units(self, t: int, units: list[_Unit]) -> None:
        """The strategy's ``step`` for each unit of tree ``t`` that is back; the frontiers
        they return are clipped and sent together (so they share the tokens left fairly)."""
        run = self.runs[t]
        frontier: list[Node] = []
        keys: list[Hashable | None] = []
        created_all: list[Node] = []
        for unit in units:
            run.units.remove(unit)
            for node in unit.frontier:
                if not node.children and node.status == NodeStatus.ACTIVE:
                    node.status, node.note = NodeStatus.BUDGET, "no tokens left for another turn"
            created = [unit.created[i] for i in sorted(unit.created)]
            created_all.extend(created)
            run.ctx.unit = unit.key
            try:
                made = self.strategy.step(run.tree, created, run.ctx)
                entries = contained(run.tree, run.ctx.scorer, run.broken, made)
                frontier.extend(entries)
                keys.extend(self._units_of(run, entries))
            finally:
                run.ctx.unit = None
        kept = self._send(t, frontier, keys)
        live = {id(n) for n in kept}
        if not self.strategy.revisits_nodes:
            for node in created_all:  # snapshots no entry will continue from
                if id(node) not in live:
                    node.env = None
        elif isinstance(self.strategy, SnapshotStrategy):
            for node in run.tree.nodes:
                if (node.env is not None and node.parent is not None and id(node) not in live
                        and not self.strategy.keeps_snapshot(run.tree, node, run.ctx)):
                    node.env = None

    def _units_of(self, run: _TreeRun, frontier: list[Node]) -> list[Hashable | None]:
        """The unit of each entry (all ``None``, one unit per tree, unless the strategy has
        units and the engine is not synchronous). Called with ``ctx.unit`` as ``step`` had."""
        if not self.use_units or not frontier:
            return [None] * len(frontier)
        keys = list(self.strategy.units(run.tree, frontier, run.ctx))  # type: ignore[attr-defined]
        if len(keys) != len(frontier):
            raise ValueError(f"{type(self.strategy).__name__}.units returned {len(keys)} units "
                             f"for {len(frontier)} frontier entries")
        return keys

    def _send(self, t: int, frontier: list[Node], keys: list[Hashable | None]) -> list[Node]:
        """Clip ``frontier`` to the tree's budget and queue its entries; returns what was kept."""
        run = self.runs[t]
        order = clip_order(run.tree, frontier, run.ctx, live_elsewhere=run.live())
        frontier, keys = [frontier[i] for i in order], [keys[i] for i in order]
        if not frontier:
            return frontier
        reserved = sum(b.cap for b in run.in_flight)
        left = None if run.ctx.tokens_left is None else run.ctx.tokens_left - reserved
        caps = token_caps(len(frontier), left, self.config.max_turn_tokens)
        units: dict[Hashable | None, _Unit] = {}
        for key, node in zip(keys, frontier, strict=True):
            units.setdefault(key, _Unit(key=key, frontier=[])).frontier.append(node)
        uses = Counter(id(node) for node, cap in zip(frontier, caps, strict=True) if cap > 0)
        for position, (key, node, cap) in enumerate(zip(keys, frontier, caps, strict=True)):
            if cap == 0 or node.id in run.broken:
                continue
            if node.env is None:
                raise RuntimeError(f"{type(self.strategy).__name__} returned node {node.id} "
                                   f"of tree {run.tree.tree_id}, which has no environment to "
                                   "continue from")
            uses[id(node)] -= 1
            # The root keeps its environment: an allocator may grant the tree more later.
            if uses[id(node)] > 0 or self.strategy.revisits_nodes or node.parent is None:
                try:
                    env = node.env.fork()
                except Exception as err:  # a plug-in environment's bug: this node only
                    fail(node, f"the environment's fork raised {describe(err)}")
                    run.broken.add(node.id)  # never asked again, whatever the strategy
                    continue
            else:
                env, node.env = node.env, None
            k = run.children_asked[node.id]
            run.children_asked[node.id] += 1
            path = (*run.paths[node.id], k)
            seed = None if self.sync else self._seed(run.tree.tree_id, path)
            branch = _Branch(tree=t, unit=units[key], position=position, node=node, cap=cap,
                             env=env, path=path, seed=seed)
            units[key].waiting += 1
            run.in_flight.append(branch)
            self.ready.append(branch)
        run.units.extend(units.values())
        cut = [unit for unit in units.values() if unit.waiting == 0]
        if cut:  # every entry of these units was cut by the token budget
            self._finish_units(t, cut)
        return frontier

    def _seed(self, tree_id: int, path: tuple[int, ...]) -> int:
        """A request seed from (rollout seed, tree, the child's path of child numbers):
        independent of the order in which branches become ready or units finish."""
        sequence = np.random.SeedSequence([self.seed, tree_id, len(path), *path])
        return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(2))

    # ---------------------------------------------------------------- budgets
    def _allocate(self) -> bool:
        """Every tree is idle: ask the allocator for more. True if some tree continues."""
        idle = [t for t, run in enumerate(self.runs) if run.idle]
        grants = self.allocator.grant([run.tree for run in self.runs], idle)
        resumed = False
        for t, grant in sorted(grants.items()):
            if t not in idle:
                raise ValueError(f"the allocator granted budget to tree {t}, which is not idle")
            run = self.runs[t]
            if run.tree.root.status == NodeStatus.FAILED:
                continue  # its reset raised: nothing to continue from
            add_budget(run.ctx, grant)
            if not isinstance(self.strategy, ExtendableStrategy):
                continue
            made = self.strategy.extend(run.tree, run.ctx, grant)
            entries = contained(run.tree, run.ctx.scorer, run.broken, made)
            resumed = bool(self._send(t, entries, self._units_of(run, entries))) or resumed
        return resumed


def run_engine(tasks: Sequence[int] | np.ndarray, make_env: Callable[[], Env],
               backend: GenerationBackend, turn_format: TurnFormat, strategy: Strategy, *,
               config: RolloutConfig, scorer: ProcessScorer | None, seed: int, first_group_id: int,
               on_turn: Callable[[int, int], None] | None, allocator: Allocator | None,
               timing: dict[str, float]) -> tuple[list[RolloutTree], list[StrategyContext], int]:
    """Grow one tree per task seed; returns the trees, their contexts and the number of
    backend calls. :func:`treeroll.engine.batch.rollout` is the entry point that wraps this."""
    extras = (strategy.sampling_extras() if isinstance(strategy, SamplingStrategy)
              else SamplingExtras())
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                            max_new_tokens=config.max_turn_tokens,
                            stop_token_ids=turn_format.stop_token_ids,
                            entropy_window=max(config.entropy_window, extras.entropy_window),
                            top_logprobs=extras.top_logprobs)
    rng = np.random.default_rng(seed)
    runs: list[_TreeRun] = []
    for i, task_seed in enumerate(tasks):
        tree, prompt_ids = _new_tree(int(task_seed), first_group_id + i, make_env, turn_format,
                                     strategy, timing)
        # Unsynchronised, a tree's strategy seed comes from (seed, tree id) alone, so a tree
        # grows the same whichever batch or worker it is in (treeroll.distributed relies on
        # it); synchronous rounds draw it in task order, as the lockstep loop did.
        ctx_seed = int(rng.integers(2**63)) if config.synchronous else \
            int(np.random.SeedSequence([seed, first_group_id + i, 0x7EE]).generate_state(
                2, np.uint64)[0] >> np.uint64(1))
        ctx = StrategyContext(rng=np.random.default_rng(ctx_seed), max_leaves=None,
                              tokens_left=None, seed=ctx_seed,
                              scorer=None if scorer is None else ContainedScorer(scorer))
        runs.append(_TreeRun(tree=tree, ctx=ctx, contexts={0: tuple(prompt_ids)}))
    allocator = allocator or UniformAllocator(config.max_leaves, config.max_generated_tokens)
    budgets = allocator.start([run.tree for run in runs])
    if len(budgets) != len(runs):
        raise ValueError(f"the allocator gave {len(budgets)} budgets for {len(runs)} tasks")
    for run, budget in zip(runs, budgets, strict=True):
        run.ctx.max_leaves, run.ctx.tokens_left = budget.leaves, budget.tokens
    engine = _Engine(runs, backend, turn_format, strategy, params, config=config,
                     allocator=allocator, seed=seed, rng=rng, on_turn=on_turn, timing=timing)
    for t, run in enumerate(runs):
        if run.tree.root.status == NodeStatus.FAILED:
            continue
        entries = contained(run.tree, run.ctx.scorer, run.broken, strategy.start(run.tree, run.ctx))
        engine._send(t, entries, engine._units_of(run, entries))
    engine.run()
    for run in runs:
        _close(run, strategy, engine)
    return [run.tree for run in runs], [run.ctx for run in runs], engine.turns


def _new_tree(task_seed: int, tree_id: int, make_env: Callable[[], Env],
              turn_format: TurnFormat, strategy: Strategy, timing: dict[str, float]
              ) -> tuple[RolloutTree, list[int]]:
    """A task's tree with its root's environment reset (a reset that raises fails this task
    only: its root is FAILED) and the first prompt's ids."""
    env = make_env()
    tick = time.perf_counter()
    error = None
    try:
        first_observation = env.reset(task_seed)
        prompt_ids, prompt_text = turn_format.prompt(env.system_prompt, first_observation)
    except Exception as err:  # a plug-in environment's bug: this task only
        error, prompt_ids, prompt_text = describe(err), [], ""
    timing["env"] += time.perf_counter() - tick
    tree = RolloutTree.new(task_seed, tree_id=tree_id, group_id=tree_id, prompt_ids=prompt_ids,
                           prompt_text=prompt_text)
    tree.root.env = env
    if error is not None:
        tree.root.status, tree.root.env = NodeStatus.FAILED, None
        tree.root.note = f"the environment's reset raised {error}"
    tree.meta["strategy"] = plugin_name(strategy)
    return tree, prompt_ids


def _close(run: _TreeRun, strategy: Strategy, engine: _Engine) -> None:
    """After the rollout: environments dropped, what still ran marked stopped by the budget,
    the strategy's last word (a :class:`FinishingStrategy`), late scorer failures applied."""
    for node in run.tree.nodes:
        node.env = None
        if node.status == NodeStatus.ACTIVE:
            node.status = NodeStatus.BUDGET
            node.note = node.note or "stopped with the rollout (budget)"
    if isinstance(strategy, FinishingStrategy):  # e.g. Tree-GRPO keeps k leaves per tree
        strategy.finish(run.tree, run.ctx)
    contained(run.tree, run.ctx.scorer, run.broken, [])  # scorer failures during finish
