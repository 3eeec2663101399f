"""Token-level PPO-clip on expanded leaves (every leaf forwarded as its own sequence).

This is the reference computation: :mod:`treeroll.training.packed` must give the same loss
and gradients while forwarding each unique token of a tree once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from treeroll.backends.weights import model_device
from treeroll.causal_lm import CausalLM
from treeroll.credit.objectives import LossConfig, policy_loss
from treeroll.tree import Trajectory

__all__ = ["LossConfig", "TrainItem", "expanded_backward", "ppo_token_loss", "token_weights",
           "with_signal"]


@dataclass
class TrainItem:
    """One leaf to train on: its tokens and its advantage, one value for the whole leaf or
    one per response token (:func:`treeroll.credit.estimators.token_credit` makes them; values at
    environment tokens are ignored)."""

    trajectory: Trajectory
    advantage: float | np.ndarray

    def __post_init__(self) -> None:
        if isinstance(self.advantage, np.ndarray):
            n = len(self.trajectory.response_ids)
            if self.advantage.shape != (n,):
                raise ValueError(f"a per-token advantage needs shape ({n},) (the leaf's "
                                 f"response tokens), got {self.advantage.shape}")

    def token_advantages(self) -> np.ndarray:
        """The advantage of every response token, float64 ``[len(response_ids)]``."""
        if isinstance(self.advantage, np.ndarray):
            return self.advantage.astype(np.float64)
        return np.full(len(self.trajectory.response_ids), float(self.advantage))

    def has_signal(self) -> bool:
        """Whether any of the leaf's model tokens has a nonzero advantage."""
        mask = np.asarray(self.trajectory.response_mask, dtype=bool)
        return bool(np.any(self.token_advantages()[mask] != 0))


def ppo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor,
                   config: LossConfig, ref_logp: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token objective (+ k3 KL) to *minimise*, and whether each token was clipped
    or truncated, as ``config.objective``
    (:data:`~treeroll.credit.objectives.POLICY_LOSSES`) says."""
    ratio = torch.exp(logp - old_logp)
    loss, truncated = policy_loss(config).token_loss(ratio, logp, advantage, config)
    if ref_logp is not None and config.kl_coef:
        delta = ref_logp - logp
        loss = loss + config.kl_coef * (torch.exp(delta) - delta - 1)
    return loss, truncated


def turn_of_tokens(trajectory: Trajectory) -> np.ndarray:
    """The turn (1, 2, ...) of every response token: a turn is a model reply and the
    observation after it; reply boundaries are where a run of environment tokens ends."""
    mask = np.asarray(trajectory.response_mask, dtype=np.int64)
    starts = np.zeros(len(mask), dtype=np.int64)
    if len(mask):
        starts[0] = mask[0]
        starts[1:] = (mask[1:] == 1) & (mask[:-1] == 0)
    turns = np.cumsum(starts)
    return np.maximum(turns, 1)


def by_turn_reversed(items: Sequence[TrainItem]) -> list[list[TrainItem]]:
    """``items`` as one batch per turn depth, the deepest first: each item of batch ``d``
    keeps only turn ``d``'s model tokens in its loss (RTPO's reverse-order turn updates as
    treeroll reads them). Items without a turn ``d`` are left out of that batch."""
    turns = [turn_of_tokens(item.trajectory) for item in items]
    deepest = max((int(t.max()) for t in turns if len(t)), default=0)
    out = []
    for depth in range(deepest, 0, -1):
        batch = []
        for item, turn in zip(items, turns, strict=True):
            t = item.trajectory
            mask = np.asarray(t.response_mask) * (turn == depth)
            if not mask.any():
                continue
            end = int(np.flatnonzero(mask)[-1]) + 1  # nothing after turn d is read
            advantage = (item.advantage[:end] if isinstance(item.advantage, np.ndarray)
                         else item.advantage)
            batch.append(TrainItem(replace(t, response_ids=t.response_ids[:end],
                                           response_mask=mask[:end].tolist(),
                                           response_logprobs=t.response_logprobs[:end]),
                                   advantage))
        out.append(batch)
    return out


def token_weights(items: Sequence[TrainItem], config: LossConfig) -> list[float]:
    """Per-leaf weight of each model token so the batch loss is a mean."""
    counts = [max(sum(it.trajectory.response_mask), 1) for it in items]
    if config.normalisation == "token_mean":
        total = sum(sum(it.trajectory.response_mask) for it in items)
        return [1.0 / max(total, 1)] * len(items)
    return [1.0 / (c * len(items)) for c in counts]


def with_signal(items: Sequence[TrainItem], config: LossConfig, kl: bool
                ) -> tuple[list[TrainItem], list[float]]:
    """The items of a minibatch whose gradient is not exactly zero, with the loss weights
    they have in the *whole* minibatch (:func:`token_weights` over ``items``), so that a
    backward over them alone gives the whole minibatch's loss and gradient.

    A leaf whose model tokens all have advantage 0 (every leaf of a group that earned the
    same reward, under GRPO-like estimators) contributes nothing when the objective says so
    (:attr:`~treeroll.credit.objectives.PolicyLoss.silent_at_zero_advantage`) and no KL term
    is added (``kl``: a KL penalty pulls every token, whatever its advantage). Otherwise every
    item is kept. Forwarding them anyway is most of an update's time on a hard task set:
    SmolLM2's FrozenLake steps spent minutes of update on groups that had no signal."""
    weights = token_weights(items, config)
    if kl or not policy_loss(config).silent_at_zero_advantage:
        return list(items), weights
    kept = [i for i, item in enumerate(items) if item.has_signal()]
    return [items[i] for i in kept], [weights[i] for i in kept]


def sequence_logprobs(model: CausalLM, sequences: list[list[int]], temperature: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded forward: ``logp[b, t]`` of token ``t + 1`` given ``0..t``; and entropies.

    Shapes ``[batch, max_len - 1]``.
    """
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids[b, : len(seq)] = torch.tensor(seq)
    ids = ids.to(model_device(model))
    # Right padding needs no attention mask: under the causal mask a real token never sees the
    # padding after it, and the loss ignores the padding's own outputs. Without a mask, SDPA
    # takes its fused causal kernel instead of materialising [batch, heads, len, len].
    logits = model(input_ids=ids).logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)  # [batch, len-1, vocab]
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def expanded_backward(model: CausalLM, items: Sequence[TrainItem], config: LossConfig,
                      ref_model: CausalLM | None = None, *,
                      weights: Sequence[float] | None = None) -> dict[str, float]:
    """Forward and backward the loss over ``items``, each leaf as its own sequence, each
    item's tokens weighted by ``weights`` (default :func:`token_weights` of ``items``).

    Gradients accumulate in ``model``'s parameters (no optimiser step). Returns metrics.
    """
    weights = list(weights) if weights is not None else token_weights(items, config)
    order = sorted(range(len(items)), key=lambda i: -_length(items[i]))
    metrics = {"loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "kl": 0.0,
               "abs_log_ratio": 0.0, "tokens": 0.0}
    start = 0
    while start < len(order):
        longest = _length(items[order[start]])
        size = max(1, config.micro_batch_tokens // max(longest, 1))
        chunk = order[start: start + size]
        start += size
        _chunk_backward(model, [items[i] for i in chunk], [weights[i] for i in chunk], config,
                        ref_model, metrics)
    tokens = max(metrics.pop("tokens"), 1.0)
    for key in ("clip_fraction", "entropy", "kl", "abs_log_ratio"):
        metrics[key] /= tokens
    return metrics


def _length(item: TrainItem) -> int:
    return len(item.trajectory.prompt_ids) + len(item.trajectory.response_ids)


def _chunk_backward(model: CausalLM, items: list[TrainItem], weights: list[float],
                    config: LossConfig, ref_model: CausalLM | None,
                    metrics: dict[str, float]) -> None:
    sequences = [it.trajectory.prompt_ids + it.trajectory.response_ids for it in items]
    logp, entropy = sequence_logprobs(model, sequences, config.temperature)
    shape = logp.shape
    mask = torch.zeros(shape)
    old = torch.zeros(shape)
    advantage = torch.zeros(shape)
    weight = torch.zeros(shape)
    for b, it in enumerate(items):
        offset = len(it.trajectory.prompt_ids) - 1  # logits at t predict token t + 1
        n = len(it.trajectory.response_ids)
        mask[b, offset: offset + n] = torch.tensor(it.trajectory.response_mask, dtype=torch.float)
        old[b, offset: offset + n] = torch.tensor(it.trajectory.response_logprobs)
        advantage[b, offset: offset + n] = torch.from_numpy(it.token_advantages())
        weight[b, offset: offset + n] = weights[b]
    mask, old, advantage, weight = (t.to(logp.device) for t in (mask, old, advantage, weight))
    ref_logp = None
    if ref_model is not None and config.kl_coef:
        with torch.no_grad():
            ref_logp, _ = sequence_logprobs(ref_model, sequences, config.temperature)
    loss, clipped = ppo_token_loss(logp, old, advantage, config, ref_logp)
    total = (loss * mask * weight).sum()
    total.backward()
    metrics["loss"] += float(total.detach())
    metrics["tokens"] += float(mask.sum())
    metrics["clip_fraction"] += float((clipped.float() * mask).sum())
    metrics["entropy"] += float((entropy.detach() * mask).sum())
    metrics["abs_log_ratio"] += float(((logp.detach() - old).abs() * mask).sum())
    if ref_logp is not None:
        delta = ref_logp - logp.detach()
        metrics["kl"] += float(((torch.exp(delta) - delta - 1) * mask).sum())
