"""The rollout settings every strategy shares: sampling, per-tree budgets and how the engine
runs (:mod:`treeroll.engine.loop` reads them, :func:`treeroll.engine.rollout` takes them)."""

from __future__ import annotations

from dataclasses import dataclass

from treeroll.checks import checked

__all__ = ["RolloutConfig"]


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling and budget settings shared by every strategy."""

    max_turn_tokens: int = checked(24, ge=1)
    """Most tokens the model may generate in one turn."""
    temperature: float = checked(1.0, ge=0)
    """Sampling temperature (the logprobs recorded are those of this distribution)."""
    top_p: float = checked(1.0, gt=0, le=1)
    """Nucleus sampling threshold. With top_p < 1 the logprobs recorded are those of the
    renormalised nucleus, while the update recomputes the full softmax: its ratios then start
    below 1 (by the nucleus's mass), so train with 1.0."""
    max_leaves: int | None = checked(None, ge=1)
    """Budget: most leaves (trajectories) one task's tree may end with; None = no limit."""
    max_generated_tokens: int | None = checked(None, ge=1)
    """Budget: most tokens one task's tree may generate; None = no limit."""
    max_depth: int = checked(64, ge=1)
    """Safety cap on turns per trajectory, whatever the environment says."""
    entropy_window: int = checked(0, ge=0)
    """Record the mean normalised entropy of each turn's first tokens (ARPO needs 20)."""
    synchronous: bool = True
    """Batched rounds as in the released codes: each backend call waits for every
    environment step of the last one and each tree advances as one unit (Tree-GRPO expands
    all M trees after all M chains have ended); token for token the loop every figure before
    the engine was measured with. False: each unit advances on its own (Tree-GRPO expands
    tree i as soon as its chain ends; :mod:`treeroll.engine.loop`), which pays off with slow
    environments (``env_workers``) or a server backend; on in-process FrozenLake rollouts it
    is as fast per generated token (``bench/engine_step.py``), not faster, hence the
    default."""
    env_workers: int = checked(0, ge=0)
    """Threads stepping environments beside generation (0: inline; use > 0 for slow
    environments such as SWE tasks, whose commands run side by side)."""
    continuous: bool = False
    """Continuous batching (needs ``synchronous`` False and a backend with ``submit`` /
    ``advance``, :class:`~treeroll.base.StreamingBackend`, such as the HF backend): a branch's
    request joins the running decode batch as soon as its observation is ready, and its
    environment step starts as soon as its own reply ends, instead of once per backend call
    after the call's longest reply. The trees are those of the unsynchronised engine (request
    seeds do not depend on the batch), within float rounding."""
