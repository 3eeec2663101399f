"""The PPO update of one training step: epochs over the step's leaves in minibatches of whole
task groups, each minibatch one optimiser step (:func:`ppo_update`), its metrics averaged over
the minibatches by model tokens (:class:`_Tally`)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import torch

from treeroll.causal_lm import CausalLM
from treeroll.config import TrainConfig
from treeroll.training.loss import TrainItem, by_turn_reversed, expanded_backward, with_signal
from treeroll.training.packed import PackingUnsupported, packed_backward, unsupported_reason

__all__ = ["ppo_update"]


def ppo_update(model: CausalLM, optimizer: torch.optim.Optimizer, items: list[TrainItem],
               config: TrainConfig, ref_model: CausalLM | None, rng: np.random.Generator
               ) -> dict[str, float]:
    """PPO epochs over ``items`` in minibatches of whole task groups (a tree's leaves stay
    together: packing forwards their shared prefixes once); as many minibatches per epoch as
    ``optim.minibatches`` asks, at most one per group, each one optimiser step (one per turn
    depth with ``optim.turn_order: reverse``). Returns every metric averaged over the
    minibatches, each weighted by its model tokens, ``optimizer_steps``, and
    ``first_abs_log_ratio``: the mean |log(pi / pi_old)| per model token of the first
    minibatch, before any step: 0 when the trainer's logprobs are the sampler's (PPO's first
    ratio 1), its size the sampler-trainer mismatch otherwise.

    Leaves whose gradient is exactly zero (every model token at advantage 0, no KL term:
    :func:`~treeroll.training.loss.with_signal`) are not forwarded; the others keep the loss
    weights of the whole minibatch, so the gradient and the step are the same.
    ``skipped_token_fraction`` is the share of model tokens left out. The loss, the gradient's
    norm and the clipped and KL shares stay the whole minibatch's (a left-out token adds 0 to
    each); ``entropy`` and ``abs_log_ratio`` are means over the tokens forwarded. A minibatch
    with nothing to train on still takes its optimiser step, on the zero gradients one of its
    leaves gives at weight 0 (the leaf ``first_abs_log_ratio`` then reads)."""
    if not items:
        return {"skipped": 1.0}
    # Ratios compare like with like: the update uses the temperature the rollout sampled at.
    loss_config = replace(config.optim.loss, temperature=config.rollout.temperature or 1.0)
    backward = expanded_backward
    if config.optim.packed:
        reason = next((r for r in (unsupported_reason(m) for m in (model, ref_model)
                                   if m is not None) if r), None)
        if reason is None:
            backward = packed_backward
        else:
            warnings.warn(f"optim.packed: {reason}; training on expanded leaves instead",
                          stacklevel=2)
    groups: dict[int, list[TrainItem]] = {}
    for item in items:
        groups.setdefault(item.trajectory.group_id, []).append(item)
    members = list(groups.values())
    tally = _Tally()
    kl = ref_model is not None and bool(loss_config.kl_coef)
    model.train()
    for _ in range(config.optim.ppo_epochs):
        order = rng.permutation(len(members))
        chunks = [[item for g in chunk for item in members[g]] for chunk in
                  np.array_split(order, min(config.optim.minibatches, len(members)))]
        if config.optim.turn_order == "reverse":
            chunks = [part for chunk in chunks for part in by_turn_reversed(chunk)]
        for batch in chunks:
            optimizer.zero_grad()
            # leaves whose gradient is exactly zero are not forwarded (with_signal)
            active, weights = with_signal(batch, loss_config, kl)
            trained = _model_tokens(active)
            if not active:
                # the step still runs (AdamW's moments and decay move on zero gradients): one
                # short leaf at weight 0 gives the same zero gradients, on the same parameters
                active = [min(batch, key=lambda item: _model_tokens([item]))]
                weights = [0.0]
            try:
                metrics = backward(model, active, loss_config, ref_model, weights=weights)
            except PackingUnsupported as err:
                warnings.warn(f"optim.packed: {err}; training on expanded leaves instead",
                              stacklevel=2)
                backward = expanded_backward
                optimizer.zero_grad()
                metrics = backward(model, active, loss_config, ref_model, weights=weights)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                             config.optim.max_grad_norm))
            optimizer.step()
            tally.add({**metrics, "grad_norm": grad_norm}, whole=_model_tokens(batch),
                      trained=trained, forwarded=trained or _model_tokens(active))
    model.eval()
    return tally.averaged()


class _Tally:
    """The update's metrics, summed over its minibatches: each metric weighted by the model
    tokens it is a mean over (:data:`_FORWARDED_MEANS` by the tokens forwarded, the others by
    the whole minibatch's), the optimiser steps, the first minibatch's log-ratio, and the
    model tokens left out."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self.steps = 0
        self.first = 0.0
        self.seen = 0.0
        self.skipped = 0.0

    def add(self, metrics: dict[str, float], *, whole: float, trained: float,
            forwarded: float) -> None:
        """One minibatch's metrics: ``whole`` its model tokens, ``trained`` those with a
        gradient (0 for a silent minibatch), ``forwarded`` those its forward saw (a silent
        minibatch's leaf at weight 0 included)."""
        self.steps += 1
        if self.steps == 1:  # the leaves forwarded first, before any step (a silent one too)
            self.first = metrics.get("abs_log_ratio", 0.0)
        self.seen += whole
        self.skipped += whole - trained
        for key, value in metrics.items():
            # a left-out token adds 0 to the loss and the clipped and KL counts (a silent
            # minibatch's leaf at weight 0 too); its entropy and log-ratio are not known
            share = forwarded if key in _FORWARDED_MEANS else whole
            if key in _TOKEN_MEANS:
                value *= forwarded / max(whole, 1.0)
            self.totals[key] = self.totals.get(key, 0.0) + share * value
            self.counts[key] = self.counts.get(key, 0.0) + share

    def averaged(self) -> dict[str, float]:
        """Every metric's token-weighted mean, ``optimizer_steps``, ``first_abs_log_ratio``
        and ``skipped_token_fraction`` (model tokens left out of the forward because their
        gradient was exactly zero)."""
        out = {key: total / max(self.counts[key], 1.0) for key, total in self.totals.items()}
        out["optimizer_steps"] = float(self.steps)
        out["first_abs_log_ratio"] = self.first
        out["skipped_token_fraction"] = self.skipped / max(self.seen, 1.0)
        return out


_FORWARDED_MEANS = ("entropy", "abs_log_ratio")
"""Update metrics that are means over the tokens forwarded (a left-out leaf's are not known);
the others (the loss, the gradient's norm, the clipped and KL shares) are the whole
minibatch's."""
_TOKEN_MEANS = ("clip_fraction", "kl")
"""Of those, the means per forwarded token, scaled to the whole minibatch's tokens."""


def _model_tokens(items: list[TrainItem]) -> float:
    """Model tokens of ``items``."""
    return float(sum(sum(item.trajectory.response_mask) for item in items))
