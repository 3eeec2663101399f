"""Tree-packed loss equals the loss over expanded leaves: loss, every gradient, and metrics."""

from __future__ import annotations

import copy
import random
import zlib
from typing import Any

import numpy as np
import pytest
import torch

from treeroll.base import BatchAdvantageEstimator
from treeroll.config import TrainConfig
from treeroll.credit import ADVANTAGES, AdvantageConfig, make_estimator
from treeroll.credit.estimators import token_credit
from treeroll.policies.model import ModelConfig, build_model
from treeroll.training.loss import LossConfig, TrainItem, expanded_backward
from treeroll.training.packed import packed_backward, supports_packing, unique_tokens
from treeroll.training.trainer import ppo_update
from treeroll.tree import Node, NodeStatus, RolloutTree, export_trajectories, leaves

VOCAB = 40
TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
TOLERANCE = {torch.float64: 1e-5, torch.float32: 1e-3}


def random_tree(rng: random.Random, group_id: int, *, depth: int, width: int,
                prune: float = 0.0, max_tokens: int = 5) -> RolloutTree:
    """A tree of ``depth`` turns with ``width`` children per node; each node ends early with
    probability ``prune``. Some siblings repeat a sibling's action tokens with other logprobs."""
    prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 6))]
    tree = RolloutTree.new(task_seed=group_id, tree_id=group_id, group_id=group_id,
                           prompt_ids=prompt, prompt_text="")

    def tokens() -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, max_tokens))]

    def grow(parent: Node) -> None:
        previous: list[int] | None = None
        for _ in range(width):
            action = list(previous) if previous and rng.random() < 0.3 else tokens()
            previous = action
            last = parent.depth + 1 == depth
            stop = last or rng.random() < prune
            child = tree.add_child(
                parent, action_ids=action,
                action_logprobs=[-3 * rng.random() for _ in action],
                observation_ids=tokens(), reward=float(rng.random() < 0.4),
                status=(NodeStatus.TERMINAL if last else NodeStatus.PRUNED) if stop
                else NodeStatus.EXPANDED, terminated=stop)
            if not stop:
                grow(child)

    grow(tree.root)
    return tree


SHAPES: dict[str, dict[str, Any]] = {
    "single_chain": {"depth": 6, "width": 1},
    "deep": {"depth": 6, "width": 2, "prune": 0.3, "max_tokens": 3},
    "wide": {"depth": 2, "width": 8},
    "pruned": {"depth": 4, "width": 3, "prune": 0.4},
}


def chain_group(rng: random.Random, group_id: int, size: int = 4,
                depth: int = 4) -> RolloutTree:
    """GRPO's group: ``size`` independent chains below the root (no shared turn)."""
    tree = RolloutTree.new(task_seed=group_id, tree_id=group_id, group_id=group_id,
                           prompt_ids=[rng.randrange(3, VOCAB) for _ in range(4)], prompt_text="")
    for _ in range(size):
        node = tree.root
        for turn in range(depth):
            action = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 4))]
            node = tree.add_child(node, action_ids=action,
                                  action_logprobs=[-3 * rng.random() for _ in action],
                                  observation_ids=[rng.randrange(3, VOCAB)],
                                  reward=float(rng.random() < 0.5), terminated=turn == depth - 1)
    return tree


def items_of(trees: list[RolloutTree], estimator: str | None = None) -> list[TrainItem]:
    """The trainer's items: every leaf of every tree with the estimator's advantage (or a
    random one of either sign when ``estimator`` is None, so that one-leaf groups learn too)."""
    rng = random.Random(len(trees))
    out: list[TrainItem] = []
    made = make_estimator(AdvantageConfig(name=estimator)) if estimator else None
    credits = (made.over_batch(trees) if isinstance(made, BatchAdvantageEstimator)
               else [made(tree) if made else None for tree in trees])
    for tree, credit in zip(trees, credits, strict=True):
        count = len(export_trajectories(tree))
        advantages = (token_credit(tree, credit) if estimator
                      else [rng.gauss(0, 1) for _ in range(count)])
        out.extend(TrainItem(t, a)
                   for t, a in zip(export_trajectories(tree), advantages, strict=True))
    return out


def models(dtype: torch.dtype) -> tuple[Any, Any]:
    """A tiny Llama and a perturbed copy as the reference model."""
    model = build_model(VOCAB, TINY).to(dtype)
    ref = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=dtype))
    # Move the policy away from the sampling logprobs so that clipping happens.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator, dtype=dtype))
    return model, ref


def assert_same(items: list[TrainItem], config: LossConfig, dtype: torch.dtype,
                use_ref: bool = False, **packed_kwargs: Any) -> dict[str, float]:
    """Expanded and packed: same loss, metrics and gradient of every parameter."""
    model, ref = models(dtype)
    ref_model = ref if use_ref else None
    model.zero_grad()
    expanded = expanded_backward(model, items, config, ref_model)
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    packed = packed_backward(model, items, config, ref_model, **packed_kwargs)
    tolerance = TOLERANCE[dtype]
    assert packed.keys() == expanded.keys()
    for key, value in expanded.items():
        assert packed[key] == pytest.approx(value, rel=tolerance, abs=1e-9), key
    assert expected.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        assert float(expected[name].norm()) > 0, name
        error = float((p.grad - expected[name]).norm() / expected[name].norm())
        assert error <= tolerance, (name, error)
    return packed


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_packed_equals_expanded_on_tree_shapes(shape: str, dtype: torch.dtype) -> None:
    rng = random.Random(zlib.crc32(shape.encode()) % 1000)  # stable across processes
    trees = [random_tree(rng, g, **SHAPES[shape]) for g in range(2)]
    metrics = assert_same(items_of(trees), LossConfig(clip_low=0.1, clip_high=0.1), dtype)
    assert metrics["clip_fraction"] > 0  # the clipped branch is exercised


@pytest.mark.parametrize("normalisation", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_mixed_trees_and_chains_normalisations_and_kl(normalisation: str,
                                                       kl_coef: float) -> None:
    rng = random.Random(7)
    trees = [random_tree(rng, 0, **SHAPES["pruned"]), chain_group(rng, 1),
             random_tree(rng, 2, **SHAPES["deep"]), random_tree(rng, 3, **SHAPES["single_chain"])]
    config = LossConfig(normalisation=normalisation, kl_coef=kl_coef, clip_low=0.1,
                        clip_high=0.28, temperature=0.8)
    metrics = assert_same(items_of(trees), config, torch.float64, use_ref=True)
    assert (metrics["kl"] > 0) == bool(kl_coef)


@pytest.mark.parametrize("estimator", ADVANTAGES.names())
def test_every_advantage_estimator(estimator: str) -> None:
    rng = random.Random(3)
    trees = [random_tree(rng, g, depth=3, width=3, prune=0.2) for g in range(2)]
    assert_same(items_of(trees, estimator), LossConfig(), torch.float32)


def per_turn_items(trees: list[RolloutTree], seed: int) -> list[TrainItem]:
    """Items with a random value of either sign per turn *and leaf* (the most general credit:
    leaves through a shared turn disagree on it, so a shared token mixes signs)."""
    rng = np.random.default_rng(seed)
    out: list[TrainItem] = []
    for tree in trees:
        group = leaves(tree)
        credit = [rng.normal(size=leaf.depth) for leaf in group]
        out.extend(TrainItem(t, a) for t, a in zip(export_trajectories(tree),
                                                    token_credit(tree, credit), strict=True))
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_per_turn_advantages_through_the_packed_update_equal_the_expanded_update(dtype) -> None:
    rng = random.Random(21)
    trees = [random_tree(rng, g, depth=4, width=3, prune=0.2) for g in range(2)]
    items = per_turn_items(trees, seed=4)
    assert all(isinstance(it.advantage, np.ndarray) for it in items)
    assert_same(items, LossConfig(kl_coef=0.05, clip_low=0.1, clip_high=0.15), dtype,
                use_ref=True)
    assert_same(items_of(trees, "treerl"), LossConfig(normalisation="seq_mean"), dtype)


@pytest.mark.parametrize("max_packed_tokens", [1, 3, 10])
def test_splitting_at_node_boundaries_changes_nothing(max_packed_tokens: int) -> None:
    rng = random.Random(11)
    trees = [random_tree(rng, 0, depth=4, width=2, prune=0.2, max_tokens=3),
             random_tree(rng, 1, depth=2, width=4)]
    assert_same(items_of(trees), LossConfig(kl_coef=0.05), torch.float64, use_ref=True,
                max_packed_tokens=max_packed_tokens)


def test_each_unique_token_forwarded_once() -> None:
    rng = random.Random(5)
    tree = random_tree(rng, 0, depth=3, width=3)
    items = items_of([tree])
    expanded = sum(len(it.trajectory.prompt_ids) + len(it.trajectory.response_ids)
                   for it in items)
    nodes = sum(len(n.action_ids) + len(n.observation_ids) for n in tree.nodes)
    leaves_observations = sum(len(n.observation_ids) for n in tree.nodes if not n.children)
    assert unique_tokens(items) <= nodes - leaves_observations < expanded
    chains = items_of([random_tree(random.Random(g), g, depth=3, width=1) for g in range(3)])
    assert unique_tokens(chains) == sum(
        len(it.trajectory.prompt_ids) + len(it.trajectory.response_ids) for it in chains)


class _Wrapped(torch.nn.Module):
    """A model that is not a transformers PreTrainedModel (no cache interface)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor) -> Any:
        return self.inner(input_ids=input_ids)


def test_trainer_packs_by_default_and_falls_back_with_a_warning() -> None:
    rng = random.Random(2)
    items = items_of([random_tree(rng, 0, **SHAPES["pruned"])])
    config = TrainConfig()
    assert config.optim.packed
    packable, _ = models(torch.float32)
    assert supports_packing(packable)
    wrapped = _Wrapped(copy.deepcopy(packable))
    assert not supports_packing(wrapped)

    def step(model: Any) -> dict[str, float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return ppo_update(model, optimizer, items, config, None, np.random.default_rng(0))

    with pytest.warns(UserWarning, match="expanded leaves"):
        fallback = step(wrapped)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packed = step(packable)
    assert packed["loss"] == pytest.approx(fallback["loss"], rel=1e-3)
    for a, b in zip(packable.parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def _masked_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      lengths: list[int] | None) -> torch.Tensor:
    """Lower-right causal attention with a materialised mask (the slow, obvious way)."""
    n, prefix = query.shape[2], key.shape[2] - query.shape[2]
    mask = torch.ones(n, prefix + n, dtype=torch.bool).tril(prefix)[None, None]
    if lengths is not None:
        keys = torch.cat([torch.arange(prefix)[None] < torch.tensor(lengths)[:, None],
                          torch.ones(len(lengths), n, dtype=torch.bool)], dim=1)
        mask = mask & keys[:, None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lengths", [None, [9, 3, 1], [9, 9, 9]])
@pytest.mark.parametrize("prefix", [0, 9])
def test_prefix_causal_attention_matches_the_masked_softmax(
        dtype: torch.dtype, lengths: list[int] | None, prefix: int) -> None:
    from treeroll.training.attention import prefix_causal_attention

    if prefix == 0 and lengths is not None:
        lengths = None
    generator = torch.Generator().manual_seed(0)
    shape = (3, 2, 7, 8)
    query = torch.randn(shape, generator=generator, dtype=dtype).requires_grad_()
    key = torch.randn(3, 2, prefix + 7, 8, generator=generator, dtype=dtype).requires_grad_()
    value = torch.randn(3, 2, prefix + 7, 8, generator=generator, dtype=dtype).requires_grad_()
    upstream = torch.randn(shape, generator=generator, dtype=dtype)
    expected = _masked_reference(query, key, value, lengths)
    expected_grads = torch.autograd.grad(expected, (query, key, value), upstream)
    got = prefix_causal_attention(query, key, value, prefix_lengths=(
        None if lengths is None else torch.tensor(lengths)))
    got_grads = torch.autograd.grad(got, (query, key, value), upstream)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    for a, b in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


def test_prefix_causal_attention_rejects_an_empty_prefix_row() -> None:
    from treeroll.training.attention import prefix_causal_attention

    q, kv = torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 5, 4)
    with pytest.raises(ValueError, match="non-empty prefix"):
        prefix_causal_attention(q, kv, kv, prefix_lengths=torch.tensor([2, 0]))


def test_children_of_different_parents_share_calls_with_ragged_prefixes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from treeroll.training import attention

    seen: list[list[int] | None] = []
    original = attention.prefix_causal_attention

    def recording(*args: Any, **kwargs: Any) -> torch.Tensor:
        lengths = kwargs.get("prefix_lengths")
        seen.append(None if lengths is None else lengths.tolist())
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "prefix_causal_attention", recording)
    rng = random.Random(4)
    trees = [random_tree(rng, g, depth=3, width=2) for g in range(4)]
    assert len({len(tree.root.observation_ids) for tree in trees}) > 1  # ragged prompts
    items = items_of(trees)
    assert_same(items, LossConfig(), torch.float64)
    ragged = [lengths for lengths in seen if lengths is not None and len(set(lengths)) > 1]
    assert ragged, "no call batched rows with prefixes of different lengths"
    model, _ = models(torch.float32)
    before = model.config._attn_implementation
    packed_backward(model, items, LossConfig())
    assert model.config._attn_implementation == before


def test_attention_implementation_is_restored_after_an_error() -> None:
    from treeroll.training.attention import tree_attention

    model, _ = models(torch.float32)
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), tree_attention(model):
        assert model.config._attn_implementation != before
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before


def test_plan_pads_little_and_respects_the_budget() -> None:
    from treeroll.training.packed import _plan, _Segment

    def segment(n: int) -> _Segment:
        zeros = np.zeros(n)
        return _Segment(np.zeros(n, dtype=np.int64), zeros, zeros, zeros, zeros, zeros,
                        zeros, zeros, zeros)

    entries = [(segment(n), 50) for n in (400, 390, 12, 10, 10, 9, 3)]
    batches = _plan(entries, budget=1000, keys_per_token=768.0)
    assert sorted(len(s) for batch in batches for s, _ in batch) == [3, 9, 10, 10, 12, 390, 400]
    for batch in batches:
        longest = max(len(s) for s, _ in batch)
        assert len(batch) == 1 or len(batch) * longest <= 1000
        assert all(len(s) * 4 >= longest for s, _ in batch), "a short segment padded to a long"
    assert len(batches) <= 3


def test_grouped_query_attention_model_packs_exactly() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        use_sliding_window=False)).double()
    assert supports_packing(model)
    rng = random.Random(9)
    items = items_of([random_tree(rng, g, **SHAPES["deep"]) for g in range(2)])
    model.zero_grad()
    expanded = expanded_backward(model, items, LossConfig())
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    packed = packed_backward(model, items, LossConfig())
    assert packed["loss"] == pytest.approx(expanded["loss"], rel=1e-5)
    for name, p in model.named_parameters():
        error = float((p.grad - expected[name]).norm() / expected[name].norm())
        assert error <= 1e-5, (name, error)


def test_a_model_that_bypasses_the_attention_interface_is_refused_then_trained_expanded(
        ) -> None:
    from treeroll.training.packed import PackingUnsupported

    rng = random.Random(6)
    items = items_of([random_tree(rng, 0, depth=3, width=2)])
    model, _ = models(torch.float32)
    expected = copy.deepcopy(model)
    for layer in model.model.layers:  # its attention no longer follows model.config
        layer.self_attn.config = copy.deepcopy(model.config)
    with pytest.raises(PackingUnsupported, match=r"optim\.packed false"):
        packed_backward(model, items, LossConfig())
    config = TrainConfig()
    for m in (model, expected):
        m.zero_grad()
    with pytest.warns(UserWarning, match="expanded leaves"):
        ppo_update(model, torch.optim.SGD(model.parameters(), lr=0.1), items, config, None,
                np.random.default_rng(0))
    config_expanded = TrainConfig()
    config_expanded.optim.packed = False
    ppo_update(expected, torch.optim.SGD(expected.parameters(), lr=0.1), items, config_expanded,
            None, np.random.default_rng(0))
    for a, b in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_update_minibatches_hold_whole_groups_and_metrics_average_them(monkeypatch) -> None:
    """Minibatches split by whole task groups (a tree's leaves stay together, so packing keeps
    their shared prefixes), and the update reports the token-weighted mean of every
    minibatch's metrics and its number of optimiser steps, not the last minibatch's."""
    from collections import Counter

    from treeroll.training import update as ppo

    rng = random.Random(3)
    items = items_of([random_tree(rng, group, depth=3, width=2) for group in range(6)])
    calls: list[list[TrainItem]] = []

    def backward(model: Any, batch: Any, config: Any, ref_model: Any = None,
                 weights: Any = None) -> dict[str, float]:
        calls.append(list(batch))
        k = float(len(calls))
        (model.weight.sum() * k).backward()  # grad norm k * sqrt(2)
        return {"loss": k, "clip_fraction": 0.1 * k, "entropy": 2.0 * k, "kl": 0.0,
                "abs_log_ratio": 0.3 * k}

    monkeypatch.setattr(ppo, "expanded_backward", backward)
    config = TrainConfig()
    config.optim.packed = False
    config.optim.minibatches = 3
    config.optim.ppo_epochs = 2
    model = torch.nn.Linear(2, 1)
    metrics = ppo.ppo_update(model, torch.optim.SGD(model.parameters(), lr=0.1), items, config,
                              None, np.random.default_rng(0))
    size = Counter(item.trajectory.group_id for item in items)
    for batch in calls:
        groups = Counter(item.trajectory.group_id for item in batch)
        assert groups == {group: size[group] for group in groups}, "a group was split"
    assert len(calls) == 6
    for epoch in (calls[:3], calls[3:]):
        assert sorted(id(item) for batch in epoch for item in batch) == sorted(map(id, items))
    tokens = [sum(sum(item.trajectory.response_mask) for item in batch) for batch in calls]
    k = np.arange(1.0, 7.0)
    expected = {"loss": k, "clip_fraction": 0.1 * k, "entropy": 2.0 * k, "kl": 0.0 * k,
                "abs_log_ratio": 0.3 * k, "grad_norm": k * np.sqrt(2.0)}
    for key, per_call in expected.items():
        assert metrics[key] == pytest.approx(np.average(per_call, weights=tokens)), key
    assert metrics["optimizer_steps"] == 6
    assert metrics["first_abs_log_ratio"] == pytest.approx(0.3)  # the first call's, before a step


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("minibatches", [1, 4])
def test_leaves_without_signal_are_not_forwarded_and_the_step_is_the_same(
        monkeypatch, packed: bool, minibatches: int) -> None:
    """Groups whose leaves all have advantage 0 are left out of the forward (one minibatch
    holding them and others; with four minibatches, two of them hold nothing else and still
    take their optimiser step, momentum and weight decay included): the weights after the
    update are those of the update that forwards every leaf."""
    from treeroll.training import update as ppo
    from treeroll.training.loss import token_weights

    rng = random.Random(8)
    items = [TrainItem(item.trajectory, 0.0) if item.trajectory.group_id % 2 else item
             for item in items_of([random_tree(rng, g, depth=3, width=2) for g in range(4)])]
    config = TrainConfig()
    config.optim.packed, config.optim.minibatches = packed, minibatches
    start, _ = models(torch.float32)
    forwarded: list[int] = []

    def update() -> tuple[Any, dict[str, float]]:
        model = copy.deepcopy(start)
        # SGD is linear in the gradient (AdamW would hide a wrong normalisation); momentum and
        # decay move the weights on zero gradients too, so a skipped step would show
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
        for _ in range(2):  # the second update's silent minibatches move on the momentum
            metrics = ppo.ppo_update(model, optimizer, items, config, None,
                                         np.random.default_rng(0))
        return model, metrics

    real = ppo.with_signal

    def counted(batch: Any, loss: Any, kl: bool) -> Any:
        kept = real(batch, loss, kl)
        forwarded.append(len(kept[0]))
        return kept

    monkeypatch.setattr(ppo, "with_signal", counted)
    skipping, metrics = update()
    monkeypatch.setattr(ppo, "with_signal",
                        lambda batch, loss, kl: (list(batch), token_weights(batch, loss)))
    every, _ = update()
    silent = sum(sum(i.trajectory.response_mask) for i in items if i.trajectory.group_id % 2)
    assert metrics["skipped_token_fraction"] == pytest.approx(
        silent / sum(sum(i.trajectory.response_mask) for i in items))
    with_signal = sum(1 for i in items if i.trajectory.group_id % 2 == 0)
    assert sum(forwarded) == 2 * with_signal  # two updates, each the leaves with a signal
    assert (0 in forwarded) == (minibatches == 4)  # minibatches with nothing to train on
    for (name, a), b in zip(skipping.named_parameters(), every.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert not torch.equal(next(skipping.parameters()), next(start.parameters()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("is_cap", [1e-3, 1e6])
def test_truncated_is_objective_packed_equals_expanded(dtype: torch.dtype, is_cap: float
                                                       ) -> None:
    rng = random.Random(11)
    trees = [random_tree(rng, g, **SHAPES["deep"]) for g in range(2)]
    config = LossConfig(objective="truncated_is", is_cap=is_cap, kl_coef=0.05)
    metrics = assert_same(items_of(trees), config, dtype, use_ref=True)
    assert (metrics["clip_fraction"] > 0) == (is_cap < 1)  # a tight cap truncates some


@pytest.mark.parametrize("normalisation", ["token_mean", "seq_mean"])
def test_reverse_turn_batches_packed_equal_expanded(normalisation: str) -> None:
    from treeroll.training.loss import by_turn_reversed

    rng = random.Random(5)
    trees = [random_tree(rng, g, **SHAPES["deep"]) for g in range(2)]
    batches = by_turn_reversed(items_of(trees, "treerl"))  # per-turn credit, cut per depth
    assert len(batches) > 1
    for batch in batches:
        assert_same(batch, LossConfig(normalisation=normalisation, clip_low=0.1),
                    torch.float64)


def test_arpo_hard_is_grpos_gradient_unless_clipping_or_seq_mean_tells_them_apart() -> None:
    """A shared token gets the sum of its leaves' advantages either way under ``token_mean``
    (GRPO: each leaf's copy its own; hard: each copy the mean), so without clipping the two
    gradients are equal; clipping (a policy moved from its sampling logprobs) and
    ``seq_mean`` (each copy divided by its own leaf's length) separate them."""
    rng = random.Random(5)
    trees = [random_tree(rng, g, depth=3, width=3) for g in range(2)]
    unclipped = {"clip_low": 1e6, "clip_high": 1e6}
    settings = {"unclipped": LossConfig(**unclipped), "clipped": LossConfig(clip_low=0.05,
                clip_high=0.05), "seq_mean": LossConfig(normalisation="seq_mean", **unclipped)}
    grads: dict[tuple[str, str], torch.Tensor] = {}
    for estimator in ("grpo", "arpo_hard"):
        for setting, config in settings.items():
            model, _ = models(torch.float64)
            model.zero_grad()
            packed_backward(model, items_of(trees, estimator), config, None)
            grads[estimator, setting] = torch.cat([p.grad.flatten() for p in model.parameters()
                                                   if p.grad is not None])
    gap = {s: float((grads["grpo", s] - grads["arpo_hard", s]).norm() / grads["grpo", s].norm())
           for s in settings}
    assert gap["unclipped"] < 1e-6, gap
    assert gap["clipped"] > 1e-2 and gap["seq_mean"] > 1e-2, gap


def test_the_head_runs_only_where_a_model_token_is_predicted() -> None:
    """The output head sees one hidden state per predicted model token (summed over calls),
    not one per forwarded position, and the result is the expanded update's (above)."""
    rng = random.Random(11)
    items = items_of([random_tree(rng, g, depth=3, width=2) for g in range(2)])
    model, _ = models(torch.float32)
    seen: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(out.shape[0]))
    try:
        packed_backward(model, items, LossConfig())
    finally:
        hook.remove()
    forwarded = unique_tokens(items)
    predicted = sum(out for out in seen)
    assert 0 < predicted < forwarded
    trie_model_tokens = set()  # the trie's keys: (token, mask, logprob) along the path
    for it in items:
        t = it.trajectory
        path = [(token, 0, 0.0) for token in t.prompt_ids]
        for token, m, lp in zip(t.response_ids, t.response_mask, t.response_logprobs,
                                strict=True):
            path.append((token, m, lp))
            if m:
                trie_model_tokens.add((t.group_id, tuple(path)))
    assert predicted == len(trie_model_tokens)  # each trie model token predicted once


def test_bfloat16_compute_stays_close_to_float32() -> None:
    rng = random.Random(12)
    items = items_of([random_tree(rng, g, depth=3, width=2) for g in range(2)])
    grads = {}
    metrics = {}
    for dtype in ("float32", "bfloat16"):
        model, _ = models(torch.float32)
        model.zero_grad()
        metrics[dtype] = packed_backward(model, items, LossConfig(compute_dtype=dtype))
        grads[dtype] = torch.cat([p.grad.flatten() for p in model.parameters()
                                  if p.grad is not None])
        assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    assert metrics["bfloat16"]["loss"] == pytest.approx(metrics["float32"]["loss"], rel=0.05)
    cosine = float(torch.nn.functional.cosine_similarity(grads["float32"], grads["bfloat16"],
                                                         dim=0))
    assert cosine > 0.98
    assert not torch.equal(grads["float32"], grads["bfloat16"])  # bfloat16 really ran


def test_an_update_with_no_signal_reports_a_zero_loss_and_gradient_and_every_token_skipped(
        ) -> None:
    rng = random.Random(9)
    items = [TrainItem(item.trajectory, 0.0)
             for item in items_of([random_tree(rng, g, depth=3, width=2) for g in range(2)])]
    model, _ = models(torch.float32)
    before = copy.deepcopy(model)
    metrics = ppo_update(model, torch.optim.SGD(model.parameters(), lr=0.1), items,
                         TrainConfig(), None, np.random.default_rng(0))
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
    assert metrics["clip_fraction"] == 0.0 and metrics["skipped_token_fraction"] == 1.0
    assert metrics["entropy"] > 0 and metrics["optimizer_steps"] == 1.0
    for a, b in zip(model.parameters(), before.parameters(), strict=True):
        assert torch.equal(a, b)  # plain SGD on zero gradients leaves the weights
