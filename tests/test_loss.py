"""PPO-clip token loss and per-token weights against references written from the formulas,
with plain Python loops over a small hand-built example."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from treeroll.training.loss import (
    LossConfig,
    TrainItem,
    expanded_backward,
    ppo_token_loss,
    token_weights,
)
from treeroll.tree import Trajectory


def reference_token_loss(logp: list[float], old: list[float], advantage: list[float],
                         ref: list[float] | None, clip_low: float, clip_high: float,
                         kl_coef: float) -> tuple[list[float], list[bool]]:
    """Per token: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * k3, with
    r = exp(logp - old) and k3 = exp(ref - logp) - (ref - logp) - 1; a token is clipped when
    its ratio left the range in the direction its advantage pushes (so it has no gradient)."""
    losses, clipped = [], []
    for i in range(len(logp)):
        ratio = math.exp(logp[i] - old[i])
        bounded = min(max(ratio, 1 - clip_low), 1 + clip_high)
        loss = -min(ratio * advantage[i], bounded * advantage[i])
        if ref is not None and kl_coef:
            delta = ref[i] - logp[i]
            loss += kl_coef * (math.exp(delta) - delta - 1)
        losses.append(loss)
        clipped.append((advantage[i] > 0 and ratio > 1 + clip_high)
                       or (advantage[i] < 0 and ratio < 1 - clip_low))
    return losses, clipped


# ratio:      1.5   1.5   0.5   0.5   1.1   0.9   1.3
# advantage:  +1    -1    -1    +1    +2    -0.5   0
RATIOS = [1.5, 1.5, 0.5, 0.5, 1.1, 0.9, 1.3]
ADVANTAGES = [1.0, -1.0, -1.0, 1.0, 2.0, -0.5, 0.0]
OLD = [-1.0, -2.0, -0.5, -3.0, -1.5, -0.7, -2.2]
LOGP = [o + math.log(r) for o, r in zip(OLD, RATIOS, strict=True)]
REF = [-1.2, -1.0, -0.9, -2.0, -1.4, -0.7, -3.0]


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_ppo_token_loss_matches_the_formula(kl_coef: float) -> None:
    """Clipping active on both sides (a high ratio with A > 0, a low one with A < 0), inactive
    in the other two corners and inside the range; KL to a reference; asymmetric clips."""
    config = LossConfig(clip_low=0.2, clip_high=0.28, kl_coef=kl_coef)
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, clipped = ppo_token_loss(logp, torch.tensor(OLD, dtype=torch.float64),
                                   torch.tensor(ADVANTAGES, dtype=torch.float64), config,
                                   torch.tensor(REF, dtype=torch.float64))
    expected, expected_clipped = reference_token_loss(LOGP, OLD, ADVANTAGES, REF, 0.2, 0.28,
                                                      kl_coef)
    torch.testing.assert_close(loss.detach(), torch.tensor(expected, dtype=torch.float64))
    assert clipped.tolist() == expected_clipped == [True, False, True, False, False, False,
                                                    False]
    if not kl_coef:  # golden values of the surrogate, by hand
        assert loss.detach().tolist() == pytest.approx([-1.28, 1.5, 0.8, -0.5, -2.2, 0.45, 0.0])
        # d loss / d logp = -r A where unclipped, 0 where clipped (and where A = 0)
        loss.sum().backward()
        assert logp.grad is not None
        gradient = [0.0 if c else -r * a
                    for r, a, c in zip(RATIOS, ADVANTAGES, expected_clipped, strict=True)]
        assert logp.grad.tolist() == pytest.approx(gradient)


def _trajectory(prompt: list[int], response: list[int], mask: list[int],
                group: int = 0) -> Trajectory:
    return Trajectory(prompt_ids=prompt, response_ids=response, response_mask=mask,
                      response_logprobs=[0.0] * len(response), reward=0.0, group_id=group,
                      tree_id=group, node_path=[0], leaf_status="terminal", success=False,
                      num_turns=1)


MASKS = [[1, 1, 0, 0, 1], [1, 1, 1], [1, 0, 0, 0, 0, 1, 1, 1, 1, 1]]
"""Three leaves with 3, 3 and 6 model tokens (environment tokens in between)."""


def test_token_weights_match_both_normalisations() -> None:
    """token_mean: every model token of the batch weighs 1 / (all model tokens); seq_mean:
    each leaf's tokens weigh 1 / (its model tokens * number of leaves)."""
    items = [TrainItem(_trajectory([5, 6], [7] * len(mask), mask), 1.0) for mask in MASKS]
    total = sum(sum(mask) for mask in MASKS)
    assert token_weights(items, LossConfig(normalisation="token_mean")) == pytest.approx(
        [1 / total] * 3)
    assert token_weights(items, LossConfig(normalisation="seq_mean")) == pytest.approx(
        [1 / (3 * 3), 1 / (3 * 3), 1 / (6 * 3)])


@pytest.mark.parametrize("normalisation", ["token_mean", "seq_mean"])
def test_expanded_loss_is_the_reference_mean(tiny_model, normalisation: str) -> None:
    """The loss expanded_backward reports is the reference token loss averaged the way the
    normalisation says: over all model tokens, or per leaf then over leaves. Old logprobs are
    set so that some ratios leave the clip range on each side; a perturbed copy of the model
    is the KL reference."""
    torch.manual_seed(0)
    reference_model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in reference_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    config = LossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.1, normalisation=normalisation)
    generator = torch.Generator().manual_seed(1)
    items, per_leaf = [], []
    for leaf, mask in enumerate(MASKS):
        prompt = torch.randint(4, 100, (3 + leaf,), generator=generator).tolist()
        response = torch.randint(4, 100, (len(mask),), generator=generator).tolist()
        full = torch.tensor([prompt + response])
        with torch.no_grad():  # logp of each response token, one plain forward per leaf
            logp = torch.log_softmax(tiny_model(input_ids=full).logits[0].double(), -1)
            ref = torch.log_softmax(reference_model(input_ids=full).logits[0].double(), -1)
        positions = range(len(prompt) - 1, len(prompt) - 1 + len(response))
        new = [float(logp[p, t]) for p, t in zip(positions, response, strict=True)]
        refs = [float(ref[p, t]) for p, t in zip(positions, response, strict=True)]
        ratios = [1.6, 0.6, 1.0, 1.05, 0.7, 1.4, 1.2, 0.95, 0.5, 1.1][: len(response)]
        old = [n - math.log(r) for n, r in zip(new, ratios, strict=True)]
        advantage = [1.0, -0.5, 2.0][leaf]
        trajectory = _trajectory(prompt, response, mask, group=leaf)
        trajectory.response_logprobs = [o if m else 0.0 for o, m in zip(old, mask, strict=True)]
        items.append(TrainItem(trajectory, advantage))
        losses, clipped = reference_token_loss(new, old, [advantage] * len(new), refs,
                                               0.2, 0.28, 0.1)
        per_leaf.append([(loss, c) for loss, c, m in zip(losses, clipped, mask, strict=True)
                         if m])
    assert any(c for leaf in per_leaf for _, c in leaf)  # clipping is active somewhere
    if normalisation == "token_mean":
        tokens = [loss for leaf in per_leaf for loss, _ in leaf]
        expected = sum(tokens) / len(tokens)
    else:
        expected = sum(sum(loss for loss, _ in leaf) / len(leaf) for leaf in per_leaf) / 3
    metrics = expanded_backward(tiny_model, items, config, reference_model)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    flags = [c for leaf in per_leaf for _, c in leaf]
    assert metrics["clip_fraction"] == pytest.approx(sum(flags) / len(flags))


def test_turns_are_numbered_by_model_reply_and_the_observation_after_it() -> None:
    from treeroll.training.loss import turn_of_tokens

    t = _trajectory([5], [7] * 10, [1, 1, 0, 0, 1, 0, 1, 1, 1, 0])
    assert turn_of_tokens(t).tolist() == [1, 1, 1, 1, 2, 2, 3, 3, 3, 3]
    assert turn_of_tokens(_trajectory([5], [], [])).tolist() == []


def test_reverse_turn_batches_go_deepest_first_and_cover_each_model_token_once() -> None:
    from treeroll.training.loss import by_turn_reversed

    items = [TrainItem(_trajectory([5, 6], [7] * len(mask), mask, group=i), float(i + 1))
             for i, mask in enumerate(MASKS)]  # 2, 1 and 2 turns
    batches = by_turn_reversed(items)
    assert len(batches) == 2
    deepest, first = batches
    assert [item.trajectory.group_id for item in deepest] == [0, 2]
    assert deepest[0].trajectory.response_mask == [0, 0, 0, 0, 1]
    assert deepest[1].trajectory.response_mask == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    # nothing after an item's turn is read: its tokens are cut where the turn ends
    assert [item.trajectory.response_mask for item in first] == [[1, 1], [1, 1, 1], [1]]
    assert [len(item.trajectory.response_ids) for item in first] == [2, 3, 1]
    assert [item.advantage for item in first] == [1.0, 2.0, 3.0]
    for i, mask in enumerate(MASKS):  # every model token in exactly one batch
        covered = [sum(item.trajectory.response_mask[k] for batch in batches for item in batch
                       if item.trajectory.group_id == i
                       and k < len(item.trajectory.response_mask)) for k in range(len(mask))]
        assert covered == mask


def test_reverse_turn_order_takes_one_optimiser_step_per_depth(tiny_model) -> None:
    from dataclasses import replace

    from treeroll.config import TrainConfig
    from treeroll.training.trainer import ppo_update

    items = [TrainItem(_trajectory([5, 6], [7 + k for k in range(len(mask))], mask, group=i),
                       float(i) - 1.0) for i, mask in enumerate(MASKS)]
    config = TrainConfig()
    steps = {}
    for order in ("joint", "reverse"):
        model = copy.deepcopy(tiny_model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = replace(config, optim=replace(config.optim, turn_order=order, packed=False))
        steps[order] = ppo_update(model, optimizer, items, run, None,
                               np.random.default_rng(0))["optimizer_steps"]
    assert steps == {"joint": 1.0, "reverse": 2.0}


def test_truncated_is_weights_the_policy_gradient_by_the_capped_ratio() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old = torch.tensor([-1.5, -1.0, -0.5])  # ratios e^0.5, e^-1, 1
    advantage = torch.tensor([2.0, -1.0, 3.0])
    config = LossConfig(objective="truncated_is", is_cap=1.5)
    loss, truncated = ppo_token_loss(logp, old, advantage, config)
    weights = [min(math.exp(0.5), 1.5), math.exp(-1.0), 1.0]
    assert loss.tolist() == pytest.approx([-w * a for w, a in zip(weights, [2.0, -1.0, 3.0],
                                                                    strict=True)])
    assert truncated.tolist() == [True, False, False]
    loss.sum().backward()  # d/d logp of -w * A * pi/pi_detached = -w * A
    assert logp.grad.tolist() == pytest.approx([-w * a for w, a in zip(
        weights, [2.0, -1.0, 3.0], strict=True)])


def test_with_signal_keeps_every_leaf_under_a_kl_term_or_an_objective_that_is_not_silent(
        monkeypatch) -> None:
    from treeroll.credit import objectives
    from treeroll.training.loss import token_weights, with_signal

    items = [TrainItem(_trajectory([5, 6], [7, 8, 9], [1, 0, 1], group=0), a)
             for a in (0.0, 1.5, np.array([0.0, 2.0, 0.0]), np.array([0.0, 0.0, 0.0]))]
    config = LossConfig()
    weights = token_weights(items, config)
    kept, kept_weights = with_signal(items, config, kl=False)
    assert [id(k) for k in kept] == [id(items[1])]  # a value at an environment token is none
    assert kept_weights == [weights[1]]  # the whole minibatch's normalisation

    def everything(kept: tuple[list[TrainItem], list[float]]) -> bool:
        return [id(k) for k in kept[0]] == [id(i) for i in items] and kept[1] == weights

    assert everything(with_signal(items, config, kl=True))

    class Loud(objectives.PPOClip):
        silent_at_zero_advantage = False

    monkeypatch.setitem(objectives.POLICY_LOSSES._items, "loud", Loud)
    assert everything(with_signal(items, LossConfig(objective="loud"), kl=False))
