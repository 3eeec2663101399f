"""The run config's cross-field checks: plug-in names against their registries, settings
that do not go together, a ``--policy.init`` that names nothing: every problem of a config,
each naming its option and what is valid, raised together before any work starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from treeroll.config import OptimConfig, TrainConfig
from treeroll.credit.objectives import POLICY_LOSSES
from treeroll.registry import Registry

__all__ = ["check_config", "name_problems"]


def name_problems(config: Any) -> list[tuple[str, str]]:  # Any: see check_config
    """Problems of the plug-in names and cross-field settings of a :class:`TrainConfig` (or
    of any config with the same sections): each ``(option, message)`` names what is valid.
    Nothing is imported or built; ``package.module:object`` names are checked when made."""
    sections = {f.name for f in dataclasses.fields(config)}
    found = _registered_names(config, sections)
    if "env" in sections:
        from treeroll.checks import option_name
        from treeroll.envs import env_problems

        found += [(option_name(where), message) for where, message in env_problems(config.env)]
    if "wandb" in sections and config.wandb.project is not None:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            found.append(("--wandb.project", f"is {config.wandb.project!r}, but wandb is not "
                          "installed: pip install 'treeroll[wandb]' (or leave it unset)"))
    if "policy" in sections:
        from treeroll.views import VIEWS

        view = config.policy.view
        if view is not None and view not in VIEWS:
            found.append(("--policy.view", f"is {view!r}; valid: {', '.join(VIEWS.names())}"))
        found += _init_problems(config.policy.init)
    if "optim" in sections and "advantage" in sections:
        found += _optim_problems(config)
    if "rollout" in sections and "backend" in sections:
        from treeroll.backends import backend_streams
        from treeroll.engine.batch import continuous_problems

        backend = config.backend.name
        found += continuous_problems(config.rollout, backend, backend_streams(backend),
                                     "--rollout.")
    if "policy" in sections and isinstance(getattr(config, "optim", None), OptimConfig) \
            and config.policy.lora.rank:
        found.append(("--policy.lora.rank", f"is {config.policy.lora.rank}; treeroll train "
                      "updates every weight of the policy (an adapter folder as "
                      "--policy.init is merged first); adapters are trained by treeroll sft: "
                      "set it to 0"))
    if {"optim", "env"} <= sections and isinstance(config.optim, OptimConfig):  # not SFT's
        per_step = config.optim.tasks_per_step
        if per_step > config.env.train_tasks:
            found.append(("--optim.tasks-per-step", f"is {per_step}, more than the training "
                          f"pool's {config.env.train_tasks} tasks (--env.train-tasks)"))
    return found


def _registered_names(config: Any,  # Any: see check_config
                      sections: set[str]) -> list[tuple[str, str]]:
    """Each section's ``name`` against its package's registry (an allocator is also built:
    that is cheap and runs its own checks)."""
    from treeroll.backends import BACKENDS
    from treeroll.checks import option_name
    from treeroll.credit import ADVANTAGES
    from treeroll.engine import ALLOCATORS, make_allocator
    from treeroll.scorers import SCORERS
    from treeroll.strategies import STRATEGIES

    registries: dict[str, Registry[Any]] = {
        "strategy": STRATEGIES, "advantage": ADVANTAGES, "allocator": ALLOCATORS,
        "scorer": SCORERS, "backend": BACKENDS}  # env: env_problems (name families)
    found: list[tuple[str, str]] = []
    for section, registry in registries.items():
        if section not in sections:
            continue
        value, valid = getattr(config, section).name, registry.names()
        if value is not None and ":" not in value and value not in valid:
            found.append((option_name(f"{section}.name"), f"is {value!r}; valid: "
                          f"{', '.join(valid)} or 'package.module:object' for your own"))
    if {"allocator", "rollout"} <= sections and config.allocator.name in ALLOCATORS:
        try:
            make_allocator(config.allocator, config.rollout)
        except ValueError as e:
            found.append(("--allocator.name", f"is {config.allocator.name!r}: {e}"))
    return found


def _optim_problems(config: TrainConfig) -> list[tuple[str, str]]:
    """Settings that do not go together: SAO's batch baseline with dropping one-leaf groups,
    a lagged sampler on a server backend, one objective's keys with the other objective."""
    import inspect

    from treeroll.backends import BACKENDS
    from treeroll.base import BatchAdvantageEstimator
    from treeroll.credit import ADVANTAGES

    found = []
    optim, loss = config.optim, config.optim.loss
    name = config.advantage.name
    estimator = ADVANTAGES.get(name) if name in ADVANTAGES else None
    if (inspect.isclass(estimator) and issubclass(estimator, BatchAdvantageEstimator)
            and optim.drop_zero_variance):
        found.append(("--optim.drop-zero-variance", f"is on, but the {name!r} baseline is for "
                      "one rollout per task, whose every group has zero variance: nothing "
                      "would train"))
    backend = config.backend.name  # only a TrainConfig has both optim and advantage
    in_process = backend in BACKENDS and BACKENDS.get(backend).in_process
    if optim.behaviour_lag and not in_process:
        found.append(("--optim.behaviour-lag", f"is {optim.behaviour_lag}, which needs the "
                      f"in-process 'hf' backend (a second copy of the model), not {backend!r}"))
    if loss.objective not in POLICY_LOSSES:
        found.append(("--optim.loss.objective", f"is {loss.objective!r}; valid: "
                      f"{', '.join(POLICY_LOSSES.names())}"))
        return found
    defaults = type(loss)()
    reads = POLICY_LOSSES.get(loss.objective).reads
    for other in POLICY_LOSSES:
        for key in POLICY_LOSSES.get(other).reads:
            if key not in reads and getattr(loss, key) != getattr(defaults, key):
                found.append((f"--optim.loss.{key.replace('_', '-')}", f"is "
                              f"{getattr(loss, key)}, which only {other} reads (the objective "
                              f"is {loss.objective}: --optim.loss.objective)"))
    return found


def _init_problems(init: str | None) -> list[tuple[str, str]]:
    from treeroll.policies import SHIPPED, has_policy
    from treeroll.policies.fetch import REAL_POLICIES

    if init is None or init in SHIPPED or init in REAL_POLICIES:
        return []
    folder = Path(init)
    if has_policy(folder) or has_policy(folder / "policy"):
        return []
    what = ("a run folder without an exported policy" if (folder / "config.yaml").is_file()
            else "no such folder" if not folder.exists() else "a folder without config.json")
    return [("--policy.init", f"is {init!r} ({what}); valid: a named policy "
             f"({', '.join([*SHIPPED, *REAL_POLICIES])}), a folder written by save_pretrained, "
             "a finished treeroll train / sft run, or null for a from-scratch build")]


def check_config(config: Any,  # Any: a TrainConfig, an SFTConfig (training/, a layer up)...
                 extra: list[tuple[str, str]] | None = None) -> None:
    """Raise one :class:`treeroll.checks.ConfigError` listing every invalid value of
    ``config`` (ranges declared on its fields, plug-in names, cross-field limits, and the
    caller's ``extra`` problems), before any work starts. ``config`` is any config dataclass
    with some of :class:`TrainConfig`'s sections (``treeroll sft``'s, ``compare``'s base):
    each check runs for the sections it has."""
    from treeroll.checks import validate

    validate(config, extra=name_problems(config) + list(extra or []))
