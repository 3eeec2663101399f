"""Training, validation and held-out task pools: disjoint, stable, and chosen by ``eval.pool``.

Settings are chosen on the validation pool and figures reported on the held-out pool, so no
held-out task can influence a choice; the held-out pool is the same as before the validation
pool existed (every stored figure's tasks)."""

from __future__ import annotations

import numpy as np
import pytest

from treeroll.checks import ConfigError, validate
from treeroll.config import HELD_OUT_RESERVED, EvalConfig
from treeroll.envs import EnvConfig
from treeroll.training.evaluation import task_pools


def test_the_three_pools_share_no_task() -> None:
    env = EnvConfig()
    train, held_out = task_pools(env, EvalConfig(tasks=HELD_OUT_RESERVED))
    _, validation = task_pools(env, EvalConfig(tasks=HELD_OUT_RESERVED, pool="validation"))
    train_set, held_set, valid_set = (set(a.tolist()) for a in (train, held_out, validation))
    assert len(held_set) == len(valid_set) == HELD_OUT_RESERVED
    assert not train_set & held_set and not train_set & valid_set and not held_set & valid_set


def test_the_held_out_pool_is_the_one_every_earlier_figure_used() -> None:
    """The first held-out seeds drawn from seed 42 skipping the training pool, as before."""
    env = EnvConfig()
    train, held_out = task_pools(env, EvalConfig(tasks=256))
    rng, taken, expected = np.random.default_rng(42), set(train.tolist()), []
    while len(expected) < 256:
        seed = int(rng.integers(1_000_000))
        if seed not in taken:
            taken.add(seed)
            expected.append(seed)
    assert held_out.tolist() == expected


def test_a_pool_is_a_prefix_of_its_larger_self() -> None:
    env = EnvConfig()
    for pool in ("held_out", "validation"):
        small = task_pools(env, EvalConfig(tasks=64, pool=pool))[1]
        large = task_pools(env, EvalConfig(tasks=512, pool=pool))[1]
        assert small.tolist() == large[:64].tolist()


def test_an_evaluation_larger_than_the_reserved_held_out_pool_is_refused() -> None:
    with pytest.raises(ConfigError, match=rf"--eval\.tasks .*<= {HELD_OUT_RESERVED}"):
        validate(EvalConfig(tasks=HELD_OUT_RESERVED + 1), "eval")
    with pytest.raises(ConfigError, match=r"--eval\.pool .*'validation'"):
        validate(EvalConfig(pool="test"), "eval")
