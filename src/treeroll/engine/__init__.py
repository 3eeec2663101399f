"""The rollout engine: grows every task's tree of a batch turn by turn.

By default (``rollout.synchronous: true``) in rounds, every backend call waiting for every
environment step of the last one, as the papers' released code does; unsynchronised, without
barriers: a branch's next request goes out as soon as its own observation is ready
(docs/concepts.md, *The engine*).

:func:`rollout` is the entry (:mod:`treeroll.engine.batch`); the loop it runs
(:mod:`treeroll.engine.loop`), the token budgets (:mod:`~treeroll.engine.budgets`), contained
faults (:mod:`~treeroll.engine.faults`) and the allocators that move budget between tasks
(:mod:`~treeroll.engine.allocators`, with their registry) and its settings
(:class:`RolloutConfig`, :mod:`~treeroll.engine.settings`) live beside it.
"""

from treeroll.engine.allocators import (
    ALLOCATORS,
    AllocatorConfig,
    UniformAllocator,
    make_allocator,
)
from treeroll.engine.batch import RolloutBatch, rollout
from treeroll.engine.loop import run_engine
from treeroll.engine.settings import RolloutConfig

__all__ = ["ALLOCATORS", "AllocatorConfig", "RolloutBatch", "RolloutConfig", "UniformAllocator",
           "make_allocator",
           "rollout", "run_engine"]
