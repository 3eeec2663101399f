"""The rollout engine: grows every task's tree of a batch turn by turn, without barriers.

:func:`rollout` is the entry (:mod:`treeroll.engine.rollout`); the loop it runs
(:mod:`treeroll.engine.loop`), the token budgets (:mod:`~treeroll.engine.budgets`), contained
faults (:mod:`~treeroll.engine.faults`) and the allocators that move budget between tasks
(:mod:`~treeroll.engine.allocators`, with their registry) live beside it.
"""

from treeroll.engine.allocators import ALLOCATORS, AllocatorConfig, make_allocator
from treeroll.engine.loop import run_engine
from treeroll.engine.rollout import RolloutBatch, RolloutConfig, rollout

__all__ = ["ALLOCATORS", "AllocatorConfig", "RolloutBatch", "RolloutConfig", "make_allocator",
           "rollout", "run_engine"]
