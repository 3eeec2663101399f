"""An environment in one file (ARCHITECTURE.md, *Adding an environment*): FrozenLake in rLLM's
convention on maps of one side, with its own settings block ``env.tiny_lake.*`` and a check
of its own. One entry-point line registers it: ``[treeroll.envs] tiny_lake =
tiny_lake:SPEC``. ``PLAIN`` is the same lake with a settings block that has no check across
its fields (no ``problems()``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from treeroll.base import Env
from treeroll.checks import checked
from treeroll.envs import EnvSpec, make_frozenlake


@dataclass
class TinyLakeSettings:
    """``env.tiny_lake``: the side of every map."""

    side: int = checked(3, ge=2)
    """Map side (at most 4: a tiny lake)."""

    def problems(self) -> list[tuple[str, str]]:
        """A side above 4 is not tiny."""
        return [] if self.side <= 4 else [("side", f"is {self.side}; a tiny lake is at most 4")]


def build(env_config: Any) -> Callable[[], Env]:
    """The constructor of a tiny lake of ``env.tiny_lake.side``."""
    side = env_config.tiny_lake.side
    return lambda: make_frozenlake("rllm", size_min=side, size_max=side)


SPEC = EnvSpec(build, block="tiny_lake", settings=TinyLakeSettings, scorer="frozenlake_progress")


@dataclass
class PlainLakeSettings:
    """``env.plain_lake``: the side of every map, checked field by field only."""

    side: int = checked(3, ge=2)
    """Map side."""


def build_plain(env_config: Any) -> Callable[[], Env]:
    """The constructor of a lake of ``env.plain_lake.side``."""
    side = env_config.plain_lake.side
    return lambda: make_frozenlake("rllm", size_min=side, size_max=side)


PLAIN = EnvSpec(build_plain, block="plain_lake", settings=PlainLakeSettings)
