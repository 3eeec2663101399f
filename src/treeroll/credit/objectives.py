"""Policy-gradient objectives: how a token's ratio to the behaviour policy and its advantage
become the loss the update minimises.

:data:`POLICY_LOSSES` maps ``optim.loss.objective`` to a :class:`PolicyLoss`: ``ppo_clip``
(PPO's clipped surrogate) and ``truncated_is`` (SAO's truncated importance weights). Both update
paths (one sequence per leaf, :mod:`treeroll.training.loss`, and tree-packed,
:mod:`treeroll.training.packed`) ask the objective, so adding one is a class here and one
``POLICY_LOSSES.register`` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from treeroll.checks import checked
from treeroll.registry import Registry

__all__ = ["POLICY_LOSSES", "LossConfig", "PPOClip", "PolicyLoss", "TruncatedIS",
           "policy_loss"]


@dataclass(frozen=True)
class LossConfig:
    """The policy-gradient objective."""

    clip_low: float = checked(0.2, ge=0)
    """PPO clip range below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = checked(0.2, ge=0)
    """PPO clip range above 1 (DAPO's clip-higher uses 0.28)."""
    kl_coef: float = checked(0.0, ge=0)
    """Weight of the k3 KL estimate to the reference policy (0 = no reference model)."""
    normalisation: str = checked("token_mean", choices=("token_mean", "seq_mean"))
    """``token_mean`` (every model token of the batch weighs the same) or ``seq_mean`` (each
    leaf's tokens averaged, then leaves averaged)."""
    temperature: float = checked(1.0, gt=0)
    """The sampling temperature, applied to the logits so ratios compare like with like (the
    trainer sets it from ``rollout.temperature``)."""
    micro_batch_tokens: int = checked(16384, ge=1)
    """Tokens forwarded at once (padding included); bounds activation memory."""
    compute_dtype: str = checked("float32", choices=("float32", "bfloat16"))
    """The packed update's forward and backward: ``float32``, or ``bfloat16`` under
    ``torch.autocast`` with the weights, the optimiser and the loss's softmax kept in float32
    (faster where the CPU has native bfloat16, e.g. AVX512-BF16 or AMX: ``bench/real_model.py``
    measures both; elsewhere it can be slower). The sampler's logprobs stay float32, so the
    first PPO ratio is then 1 only within bfloat16 rounding."""
    objective: str = "ppo_clip"
    """A name in :data:`POLICY_LOSSES`: ``ppo_clip``, PPO's clipped surrogate.
    ``truncated_is`` (SAO's off-policy correction, as treeroll reads it): the policy gradient
    of each token weighted by its importance ratio against the behaviour policy's sampling
    logprob, truncated at ``is_cap`` (no clipping; the loss value is
    ``-min(ratio, is_cap) * A``)."""
    is_cap: float = checked(2.0, gt=0)
    """``truncated_is``: the largest importance weight (``clip_fraction`` counts the tokens
    above it)."""


class PolicyLoss(Protocol):
    """One policy-gradient objective, per token."""

    reads: ClassVar[tuple[str, ...]]
    """The :class:`LossConfig` fields only this objective reads (a non-default value of
    another objective's field is refused before a run starts)."""

    silent_at_zero_advantage: ClassVar[bool]
    """Whether a token whose advantage is 0 adds exactly nothing to the loss or its gradient
    (true of every objective linear in the advantage). Then the update skips the leaves whose
    model tokens all have advantage 0 (a group whose leaves earned the same reward) without
    changing the gradient (:func:`treeroll.training.loss.with_signal`)."""

    def token_loss(self, ratio: torch.Tensor, logp: torch.Tensor, advantage: torch.Tensor,
                   config: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of each token to minimise (its gradient the objective's), and whether each
        token was clipped or truncated."""
        ...

    def packed_loss(self, ratio: torch.Tensor, logp: torch.Tensor, positive: torch.Tensor,
                    negative: torch.Tensor, config: LossConfig) -> torch.Tensor:
        """The same, for a packed token shared by several leaves: ``positive`` and
        ``negative`` sum the weighted advantages of the leaves above and below zero."""
        ...

    def packed_flagged(self, ratio: torch.Tensor, count: torch.Tensor,
                       count_positive: torch.Tensor, count_negative: torch.Tensor,
                       config: LossConfig) -> torch.Tensor:
        """How many of the leaves' tokens at each packed position were clipped or truncated."""
        ...


def _clipped(ratio: torch.Tensor, config: LossConfig) -> torch.Tensor:
    return torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)


class PPOClip:
    """PPO's clipped surrogate ``-min(r A, clip(r, 1 - low, 1 + high) A)``."""

    reads: ClassVar[tuple[str, ...]] = ("clip_low", "clip_high")
    silent_at_zero_advantage: ClassVar[bool] = True  # -min(r 0, clip(r) 0) = 0, any r

    def token_loss(self, ratio: torch.Tensor, logp: torch.Tensor, advantage: torch.Tensor,
                   config: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`PolicyLoss`."""
        clipped = _clipped(ratio, config)
        loss = -torch.minimum(ratio * advantage, clipped * advantage)
        return loss, ratio * advantage > clipped * advantage

    def packed_loss(self, ratio: torch.Tensor, logp: torch.Tensor, positive: torch.Tensor,
                    negative: torch.Tensor, config: LossConfig) -> torch.Tensor:
        """See :class:`PolicyLoss`: the minimum splits by the sign of each leaf's advantage."""
        clipped = _clipped(ratio, config)
        return -(positive * torch.minimum(ratio, clipped)
                 + negative * torch.maximum(ratio, clipped))

    def packed_flagged(self, ratio: torch.Tensor, count: torch.Tensor,
                       count_positive: torch.Tensor, count_negative: torch.Tensor,
                       config: LossConfig) -> torch.Tensor:
        """See :class:`PolicyLoss`."""
        clipped = _clipped(ratio, config)
        return count_positive * (ratio > clipped) + count_negative * (ratio < clipped)


class TruncatedIS:
    """SAO's off-policy correction as treeroll reads it: the policy gradient weighted by the
    importance ratio truncated at ``is_cap`` (value ``-min(r, cap) A``, no clipping)."""

    reads: ClassVar[tuple[str, ...]] = ("is_cap",)
    silent_at_zero_advantage: ClassVar[bool] = True  # -min(r, cap) 0 grad log pi = 0

    def token_loss(self, ratio: torch.Tensor, logp: torch.Tensor, advantage: torch.Tensor,
                   config: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`PolicyLoss`."""
        weight = torch.clamp(ratio.detach(), max=config.is_cap)
        # value -min(r, c) * A; gradient -min(r, c) * A * grad log pi
        loss = -weight * advantage * torch.exp(logp - logp.detach())
        return loss, ratio.detach() > config.is_cap

    def packed_loss(self, ratio: torch.Tensor, logp: torch.Tensor, positive: torch.Tensor,
                    negative: torch.Tensor, config: LossConfig) -> torch.Tensor:
        """See :class:`PolicyLoss`: linear in A, so the leaves' weighted sum."""
        weight = torch.clamp(ratio.detach(), max=config.is_cap)
        return -(positive + negative) * weight * torch.exp(logp - logp.detach())

    def packed_flagged(self, ratio: torch.Tensor, count: torch.Tensor,
                       count_positive: torch.Tensor, count_negative: torch.Tensor,
                       config: LossConfig) -> torch.Tensor:
        """See :class:`PolicyLoss`."""
        return count * (ratio > config.is_cap)


POLICY_LOSSES: Registry[type[PolicyLoss]] = Registry("policy loss")
"""``optim.loss.objective`` -> its :class:`PolicyLoss` class."""
POLICY_LOSSES.register("ppo_clip", PPOClip)
POLICY_LOSSES.register("truncated_is", TruncatedIS)


def policy_loss(config: LossConfig) -> PolicyLoss:
    """The objective ``config.objective`` names (an unknown name lists the valid ones)."""
    made: Any = POLICY_LOSSES.get(config.objective)()
    return made
