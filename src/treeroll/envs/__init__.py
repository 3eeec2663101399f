"""Text environments that fork: FrozenLake in two conventions, any Gymnasium text env, and
``check_env`` for users' own environments."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from treeroll.base import Env
from treeroll.checks import checked
from treeroll.envs.check import EnvCheckError, check_env
from treeroll.envs.frozenlake import (
    FrozenLakeConfig,
    FrozenLakeEnv,
    distance_to_goal,
    frozenlake_corpus,
    make_frozenlake,
    start_distance,
)
from treeroll.envs.gym_text import GymTextEnv
from treeroll.registry import Registry, build_user_plugin, parse_options, plugin_section

__all__ = [
    "ENVS",
    "ENV_BLOCKS",
    "ENV_SCORERS",
    "EnvCheckError",
    "EnvConfig",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "FrozenLakeSettings",
    "GymTextEnv",
    "SWESettings",
    "check_env",
    "distance_to_goal",
    "frozenlake_corpus",
    "make_env_factory",
    "make_frozenlake",
    "start_distance",
]


@dataclass
class FrozenLakeSettings:
    """``env.frozenlake``: FrozenLake's settings over its convention's (``frozenlake_rllm``,
    ``frozenlake_ragen``); None keeps the convention's."""

    size_min: int | None = checked(None, ge=2)
    """Smallest map side."""
    size_max: int | None = checked(None, ge=2)
    """Largest map side."""
    slippery: bool | None = None
    """Slippery dynamics."""
    format_penalty: float | None = checked(None, ge=0)
    """Subtracted from a turn's reward when its reply held no valid action (the conventions':
    rLLM 0, RAGEN 0.1). Success is unchanged; only the reward RL ranks trajectories by sees
    it."""


@dataclass
class SWESettings:
    """``env.swe``: which instances the SWE environment (``--env.name swe``) serves."""

    instances: str | None = None
    """A SWE-bench-format JSONL file of instances, validated before any work (None = the 240
    built-in tasks); a task seed picks instance ``seed mod count``."""
    repos: str | None = None
    """The folder holding the instances' git checkouts (``owner__name``, ``name`` or
    ``owner/name``, or the checkout itself); an instance's own ``repo_path`` wins."""


ENV_BLOCKS: dict[str, type] = {"frozenlake": FrozenLakeSettings, "swe": SWESettings}
"""Each environment family's settings block, ``env.<family>.*``."""


@dataclass
class EnvSection:
    """Which environment the tasks come from."""

    name: str = "frozenlake_rllm"
    """``frozenlake_rllm`` (PATR's benchmark), ``frozenlake_ragen``, ``swe``, ``gym:<env id>``,
    or ``package.module:factory`` (a callable returning an Env, called with ``options``)."""
    options: dict[str, str] = field(default_factory=dict)
    """A user's own environment factory (``package.module:object``): its config block, ``KEY
    VALUE`` pairs on the command line or a mapping in YAML, each value read as YAML; a
    dataclass gets them as its fields, a builder as keywords. For ``swe``: ``SWEEnvConfig``
    and ``SandboxLimits`` fields (``tools "[/opt/conda]"``, ``memory_mb 2048``, ``isolation
    copy``)."""
    max_turns: int | None = checked(None, ge=1)
    """Cap on turns per episode (None = the environment's)."""
    train_tasks: int = checked(10_000, ge=1)
    """Task seeds in the training pool (rLLM: 10,000)."""
    task_seed: int = checked(0, ge=0)
    """Seed of the generator that draws the training pool's task seeds."""

    if TYPE_CHECKING:  # the environments' blocks, added by plugin_section
        def __getattr__(self, name: str) -> Any: ...


if TYPE_CHECKING:
    EnvConfig = EnvSection
else:
    EnvConfig = plugin_section(EnvSection, ENV_BLOCKS, "EnvConfig")


EnvFactoryBuilder = Callable[[Any], Callable[[], Env]]
ENVS: Registry[EnvFactoryBuilder] = Registry("environment")


def _frozenlake(convention: str) -> EnvFactoryBuilder:
    def build(env_config: Any) -> Callable[[], Env]:
        from treeroll.envs.frozenlake import make_frozenlake

        settings = {**dataclasses.asdict(env_config.frozenlake),
                    "max_turns": env_config.max_turns}
        overrides = {key: value for key, value in settings.items() if value is not None}
        make_frozenlake(convention, **overrides)  # validate now, not in a worker
        return lambda: make_frozenlake(convention, **overrides)
    return build


ENVS.register("frozenlake_rllm", _frozenlake("rllm"))
ENVS.register("frozenlake_ragen", _frozenlake("ragen"))


def _swe(env_config: Any) -> Callable[[], Env]:
    from treeroll.envs.swe import builtin_tasks, load_swebench_jsonl, make_swe_env

    swe = env_config.swe
    tasks = (builtin_tasks() if swe.instances is None
             else load_swebench_jsonl(swe.instances, swe.repos))
    settings = parse_options(env_config.options)  # SWEEnvConfig / SandboxLimits fields
    if "tools" in settings:
        settings["tools"] = tuple(settings["tools"])
    if env_config.max_turns is not None:
        settings["step_limit"] = env_config.max_turns
    try:  # a bad setting fails before work
        make_swe_env("mini", tasks, **settings).close()
    except (TypeError, ValueError) as err:
        raise ValueError(f"--env.options for swe: {err}") from None
    return lambda: make_swe_env("mini", tasks, **settings)


ENVS.register("swe", _swe)


def make_env_factory(env_config: Any) -> Callable[[], Env]:
    """A zero-argument environment constructor for ``env_config.name``."""
    name: str = env_config.name
    if name.startswith("gym:"):
        from treeroll.envs.gym_text import GymTextEnv

        env_id = name[4:]
        return lambda: GymTextEnv(env_id)
    if name in ENVS:
        return ENVS.get(name)(env_config)
    factory: Any = ENVS.get(name)  # raises with the valid names unless an import path
    if not env_config.options:
        return factory
    options = parse_options(env_config.options)  # read once, not at every environment made
    build_user_plugin(factory, options, "env", parsed=True)  # a bad option fails before work
    return functools.partial(build_user_plugin, factory, options, "env", parsed=True)


ENV_SCORERS: dict[str, str] = {"frozenlake_rllm": "frozenlake_progress",
                               "frozenlake_ragen": "frozenlake_progress", "swe": "swe"}
"""Environment name -> its own process scorer, used when a scoring strategy names none."""
