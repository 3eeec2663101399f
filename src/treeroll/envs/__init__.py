"""Text environments that fork: FrozenLake in two conventions, any Gymnasium text env, and
``check_env`` for users' own environments."""

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

__all__ = [
    "EnvCheckError",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "GymTextEnv",
    "check_env",
    "distance_to_goal",
    "frozenlake_corpus",
    "make_frozenlake",
    "start_distance",
]
