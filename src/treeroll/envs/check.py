"""``check_env``: test that an environment keeps the :class:`treeroll.base.Env` invariants.

Run it in your own CI on a factory of your environment::

    from treeroll.envs import check_env
    check_env(lambda: MyEnv(my_config))

It raises :class:`EnvCheckError` naming the broken invariant and how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from treeroll.base import Env, ExampleEnv, StepResult

__all__ = ["MALFORMED_REPLIES", "EnvCheckError", "check_env"]

MALFORMED_REPLIES: tuple[str, ...] = (
    "",
    "asdf",
    "```",
    "``````",
    "<think>",
    "<answer></answer>",
    "<think></think><answer>||||</answer>",
    "\x00\x01\x02",
    "\u2603\u00e9\u4e2d\u6587\U0001f600\u200b\u0663",
    "9" * 5000,
    "x" * 10_000,
)
"""Replies no environment may raise on (each should be an invalid action)."""


class EnvCheckError(AssertionError):
    """An environment broke one of the :class:`treeroll.base.Env` invariants."""


def check_env(
    make_env: Callable[[], Env],
    seeds: Sequence[int] = (0, 1, 2),
    n_steps: int = 20,
    *,
    replies: Sequence[str] | None = None,
) -> None:
    """Check the Env invariants on fresh environments from ``make_env``; raise
    :class:`EnvCheckError` on the first broken one.

    Checked: ``system_prompt`` is a string; ``reset(seed)`` is deterministic; ``step`` returns
    ``(str, float, bool, bool, dict)`` and is deterministic given the seed and the replies;
    malformed text never raises; ``fork()`` continues identically and stepping the fork leaves
    the original unchanged; ``info["success"]`` is a bool when an episode ends.

    The replies stepped are drawn from ``replies`` when given, else from the environment's
    ``example_reply(rng)`` when it has one, mixed with :data:`MALFORMED_REPLIES`.
    """
    if n_steps < 2:
        raise ValueError(f"n_steps must be >= 2 to test a fork mid-episode, got {n_steps}")
    probe = make_env()
    try:
        prompt = probe.system_prompt
    except AttributeError:  # what this check is for: a user's env missing part of Env
        prompt = None
    if not isinstance(prompt, str):
        raise EnvCheckError("env.system_prompt must be a str (use '' for none)")
    for seed in seeds:
        _check_reset(make_env, seed)
        plan = _plan(probe, seed, n_steps, replies)
        _check_malformed(make_env, seed)
        _check_fork(make_env, seed, plan)


def _plan(probe: Env, seed: int, n_steps: int, replies: Sequence[str] | None) -> list[str]:
    """A fixed list of replies to step with (the same for original, fork and replays)."""
    rng = np.random.default_rng(seed)
    example = probe.example_reply if isinstance(probe, ExampleEnv) else None
    plan = []
    for _ in range(n_steps):
        if rng.random() < 0.2:
            plan.append(MALFORMED_REPLIES[int(rng.integers(3))])
        elif replies:
            plan.append(replies[int(rng.integers(len(replies)))])
        elif callable(example):
            plan.append(str(example(rng)))
        else:
            plan.append(MALFORMED_REPLIES[int(rng.integers(len(MALFORMED_REPLIES)))])
    return plan


def _check_reset(make_env: Callable[[], Env], seed: int) -> None:
    env = make_env()
    first = env.reset(seed)
    if not isinstance(first, str):
        raise EnvCheckError(f"reset({seed}) returned {type(first).__name__}, not str: return the "
                            "first observation as text")
    again = env.reset(seed)
    other = make_env().reset(seed)
    if not first == again == other:
        raise EnvCheckError(f"reset({seed}) is not deterministic: two resets with the same seed "
                            "gave different text; derive all randomness from the seed "
                            "(e.g. np.random.default_rng(seed))")


def _check_result(result: Any, where: str) -> StepResult:
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvCheckError(f"{where}: step must return the 5-tuple (observation, reward, "
                            f"terminated, truncated, info), got {type(result).__name__}")
    observation, reward, terminated, truncated, info = result
    if not isinstance(observation, str):
        raise EnvCheckError(f"{where}: the observation must be a str, got "
                            f"{type(observation).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float, np.floating,
                                                           np.integer)):
        raise EnvCheckError(f"{where}: the reward must be a float, got {type(reward).__name__}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise EnvCheckError(f"{where}: {name} must be a bool, got {type(flag).__name__}")
    if not isinstance(info, dict):
        raise EnvCheckError(f"{where}: info must be a dict, got {type(info).__name__}")
    if "format_error" in info and not isinstance(info["format_error"], (bool, np.bool_)):
        raise EnvCheckError(f"{where}: info['format_error'] must be a bool")
    if (terminated or truncated) and not isinstance(info.get("success"), bool):
        raise EnvCheckError(f"{where}: the step that ends an episode must set info['success'] "
                            f"to a bool, got {info.get('success')!r}")
    return result


def _check_malformed(make_env: Callable[[], Env], seed: int) -> None:
    for text in MALFORMED_REPLIES:
        env = make_env()
        env.reset(seed)
        try:
            result = env.step(text)
        except Exception as err:
            raise EnvCheckError(
                f"step raised {type(err).__name__}({err}) on the malformed reply "
                f"{text[:40]!r}: model text must never raise; treat an unparsable reply as an "
                "invalid action (with a penalty) and set info['format_error'] = True") from err
        _check_result(result, f"step({text[:40]!r}) after reset({seed})")


def _run(env: Env, plan: Sequence[str], where: str) -> list[tuple[Any, ...]]:
    """Step ``env`` through ``plan`` until the episode ends; the outcomes to compare."""
    outcomes = []
    for text in plan:
        observation, reward, terminated, truncated, info = _check_result(env.step(text), where)
        outcomes.append((observation, float(reward), bool(terminated), bool(truncated),
                         info.get("success")))
        if terminated or truncated:
            break
    return outcomes


def _first_difference(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> str:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"step {index}: {x!r:.200} != {y!r:.200}"
    return f"lengths {len(a)} != {len(b)}"


def _check_fork(make_env: Callable[[], Env], seed: int, plan: list[str]) -> None:
    split = len(plan) // 3
    head, tail = plan[:split], plan[split:]

    replays = []
    for _ in range(2):
        env = make_env()
        env.reset(seed)
        replays.append(_run(env, plan, f"replay of seed {seed}"))
    if replays[0] != replays[1]:
        raise EnvCheckError(
            f"step is not deterministic given reset({seed}) and the replies "
            f"({_first_difference(*replays)}); draw every random event from a generator seeded "
            "in reset")
    expected = replays[0]
    if len(expected) <= split:  # the episode ended inside the head: fork at the start instead
        head, tail = [], plan

    env = make_env()
    env.reset(seed)
    done_head = _run(env, head, f"seed {seed} before the fork")
    fork = env.fork()
    if fork is env:
        raise EnvCheckError("fork() returned the environment itself: return an independent copy "
                            "(e.g. copy.deepcopy(self))")
    fork_outcomes = _run(fork, tail, f"fork of seed {seed}")
    try:
        original_outcomes = done_head + _run(env, tail, f"seed {seed} after the fork")
    except Exception as err:
        raise EnvCheckError(
            f"stepping the original after its fork was stepped raised {type(err).__name__}"
            f"({err}): fork() must return an independent copy, not share state") from err
    if original_outcomes != expected:
        raise EnvCheckError(
            f"stepping the fork changed the original (seed {seed}, "
            f"{_first_difference(original_outcomes, expected)}): fork() must deep-copy all "
            "mutable state, the random number generator included (copy.deepcopy(rng) or "
            "its bit_generator.state), instead of sharing it")
    if done_head + fork_outcomes != expected:
        raise EnvCheckError(
            f"the fork does not continue as the original would (seed {seed}, "
            f"{_first_difference(done_head + fork_outcomes, expected)}): fork() must copy the "
            "complete state, the random number generator state included")
