"""treeroll: shared-prefix tree rollouts for multi-turn LLM-agent reinforcement learning.

The public API, one short path per name: ``from treeroll import rollout, TreeGRPO, ...``.
Each name lives in one module (``treeroll.engine.batch.rollout``, ...), which the API
reference documents; this package imports that module only when the name is first used, so
``import treeroll`` stays cheap (no PyTorch) and installs nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_HOMES: dict[str, tuple[str, ...]] = {
    "treeroll.engine.batch": ("RolloutBatch", "RolloutConfig", "rollout"),
    "treeroll.tree": ("Node", "NodeStatus", "RolloutTree", "TokenCounts", "Trajectory",
                      "export_trajectories", "leaves", "path_to", "token_counts"),
    "treeroll.tree_json": ("load_tree", "save_tree"),
    "treeroll.base": ("Completion", "Env", "GenerationBackend", "GenerationRequest",
                      "SamplingParams", "Strategy", "StrategyContext", "tree_state"),
    "treeroll.strategies": ("ARPO", "IGRPO", "PATR", "RTPO", "STRATEGIES", "Chain", "RandomTree",
                            "TreeGRPO"),
    "treeroll.credit.estimators": ("dr_grpo", "grpo", "rloo", "token_credit"),
    "treeroll.envs": ("make_frozenlake",),
    "treeroll.envs.check": ("check_env",),
    "treeroll.envs.gym_text": ("GymTextEnv",),
    "treeroll.backends.hf": ("HFBackend",),
    "treeroll.formatting": ("TurnFormat",),
    "treeroll.policies": ("Policy", "load_policy", "save_policy"),
    "treeroll.config": ("TrainConfig", "load_config"),
    # not ``assemble``: the name of its own submodule, which importing it sets here
    "treeroll.assemble": ("RunParts",),
    "treeroll.training.trainer": ("train",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'treeroll' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
