"""Rollout strategies: where a task's tree branches, continues and stops.

Each strategy is a small dataclass (its hyper-parameters are its fields, so the class is its own
config block) implementing :class:`treeroll.base.Strategy`, one module each. They differ only in
the frontier they return (:mod:`treeroll.engine.loop` runs it):

* ``chain`` -- G independent trajectories from the root (the GRPO / RLOO baseline).
* ``tree_grpo`` -- Tree-GRPO: M chains, then L rounds of N random expansions per subtree.
* ``patr`` -- PATR: branch from the best-scored partial trajectories, prune degenerate ones.
* ``random_tree`` -- PATR's schedule with random scores (the PATR paper's random tree).
* ``arpo`` -- ARPO / AEPO: branch after an observation when the policy's entropy rises.
* ``rtpo`` -- RTPO's planner-style forks at the first turns.
* ``igrpo`` -- IGRPO: branch where the expected information gain is highest.

Adding one: a module here with the dataclass, and one ``STRATEGIES.register`` line below
(docs/architecture.md walks through it); or, from a package of your own, the module and one
``treeroll.strategies`` entry point. Its settings then appear as ``strategy.<name>.*``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from treeroll.base import Strategy
from treeroll.registry import Registry, build_user_plugin, plugin_section
from treeroll.strategies.arpo import ARPO
from treeroll.strategies.chain import Chain
from treeroll.strategies.common import action_key, continue_or_open, repeated_action
from treeroll.strategies.early_forks import EarlyForks
from treeroll.strategies.igrpo import IGRPO
from treeroll.strategies.patr import PATR
from treeroll.strategies.random_tree import RandomTree
from treeroll.strategies.rtpo import RTPO
from treeroll.strategies.tree_grpo import TreeGRPO

__all__ = ["ARPO", "IGRPO", "PATR", "RTPO", "STRATEGIES", "Chain", "EarlyForks", "RandomTree",
           "StrategyConfig", "TreeGRPO", "action_key", "continue_or_open", "make_strategy",
           "repeated_action"]

STRATEGIES: Registry[type[Strategy]] = Registry("strategy")
"""Strategy name -> its dataclass (which is also its config block)."""
STRATEGIES.register("chain", Chain)
STRATEGIES.register("tree_grpo", TreeGRPO)
STRATEGIES.register("patr", PATR)
STRATEGIES.register("random_tree", RandomTree)
STRATEGIES.register("arpo", ARPO)
STRATEGIES.register("rtpo", RTPO)
STRATEGIES.register("igrpo", IGRPO)
STRATEGIES.register("early_forks", EarlyForks)


def _usable(obj: Any) -> str | None:
    """Why an entry point's object cannot be a registered strategy (its class is its config
    block: a dataclass that builds with its defaults)."""
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        return "a registered strategy is a dataclass (its fields are its settings)"
    try:
        obj()
    except Exception as err:  # its own validation, or a field without a default
        return f"it does not build with its defaults ({type(err).__name__}: {err})"
    return None


STRATEGIES.load_entry_points("treeroll.strategies", check=_usable)  # installed packages' own


@dataclass
class StrategySection:
    """Which rollout strategy builds each task's tree, and every strategy's settings."""

    name: str = "chain"
    """``chain``, ``tree_grpo``, ``patr``, ``random_tree``, ``arpo``, ``rtpo``, ``igrpo``,
    ``early_forks`` or ``package.module:object``."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own strategy (``package.module:object``): its config block, ``KEY VALUE``
    pairs on the command line or a mapping in YAML, each value read as YAML; a dataclass gets
    them as its fields, a builder as keywords."""


if TYPE_CHECKING:  # what plugin_section makes, as the type checker sees the built-ins
    @dataclass
    class StrategyConfig(StrategySection):
        chain: Chain = field(default_factory=Chain)
        tree_grpo: TreeGRPO = field(default_factory=TreeGRPO)
        patr: PATR = field(default_factory=PATR)
        random_tree: RandomTree = field(default_factory=RandomTree)
        arpo: ARPO = field(default_factory=ARPO)
        rtpo: RTPO = field(default_factory=RTPO)
        igrpo: IGRPO = field(default_factory=IGRPO)
        early_forks: EarlyForks = field(default_factory=EarlyForks)
else:
    StrategyConfig = plugin_section(StrategySection, {n: STRATEGIES.get(n) for n in STRATEGIES},
                                    "StrategyConfig")


def make_strategy(strategy_config: StrategyConfig) -> Strategy:
    """The configured strategy named by ``strategy_config.name``: the registered strategy's
    block of ``strategy_config``, or a user's ``package.module:object`` built from
    ``options``."""
    name = strategy_config.name
    if name in STRATEGIES:
        strategy: Strategy = getattr(strategy_config, name)  # the block of that name
        return strategy
    obj: Any = STRATEGIES.get(name)  # an import path, or raises listing the valid names
    made: Strategy = build_user_plugin(obj, strategy_config.options, "strategy")
    return made
