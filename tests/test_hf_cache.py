"""The embedded backend's growing KV cache (``treeroll.backends.hf.cache``)."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from treeroll.backends.hf import HFBackend
from treeroll.backends.hf import cache as hf_cache
from treeroll.backends.hf.cache import GrowingLayer, growing_cache, room_for
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.strategies import Chain, TreeGRPO
from treeroll.tree import leaves, path_to


def _kv(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 2, length, 4, generator=g),
            torch.randn(batch, 2, length, 4, generator=g))


def test_appending_writes_into_the_room_without_reallocating() -> None:
    """Keys/values equal DynamicLayer's concatenation after every step; the buffer is the
    same tensor while it has room, and one reallocation makes room again."""
    growing, plain = GrowingLayer(), DynamicLayer()
    first = _kv(3, 5, 0)
    growing.update(*first)
    plain.update(*first)
    buffer = growing._key_buffer
    assert buffer is not None and buffer.shape[2] == 5 + 64
    for step in range(65):
        kv = _kv(3, 1, step + 1)
        keys, values = growing.update(*kv)
        plain.update(*kv)
        assert torch.equal(keys, plain.keys) and torch.equal(values, plain.values)
        if step < 64:
            assert growing._key_buffer is buffer  # no copy while there is room
    assert growing._key_buffer is not buffer  # the 65th position did not fit: reallocated
    assert growing.get_seq_length() == 5 + 65


def test_dropping_leading_positions_and_selecting_rows_keep_the_values() -> None:
    """``drop_front`` and ``batch_select_indices`` give what slicing/indexing a
    concatenated cache gives, and later appends land after the kept positions."""
    growing, plain = GrowingLayer(), DynamicLayer()
    kv = _kv(4, 9, 0)
    growing.update(*kv)
    plain.update(*kv)
    growing.drop_front(3)
    plain.keys, plain.values = plain.keys[:, :, 3:], plain.values[:, :, 3:]
    select = torch.tensor([2, 0])
    growing.batch_select_indices(select)
    plain.batch_select_indices(select)
    step = _kv(2, 1, 5)
    keys, values = growing.update(*step)
    plain.update(*step)
    assert keys.shape == (2, 2, 7, 4)
    assert torch.equal(keys, plain.keys) and torch.equal(values, plain.values)


def test_keys_replaced_from_outside_are_adopted_on_the_next_append() -> None:
    """A caller that assigns ``keys``/``values`` itself (as transformers' own crop does)
    does not lose them: the next append copies them into a fresh buffer."""
    layer = GrowingLayer()
    layer.update(*_kv(2, 6, 0))
    layer.keys, layer.values = layer.keys[:, :, :4].clone(), layer.values[:, :, :4].clone()
    expected = torch.cat([layer.keys, _kv(2, 1, 1)[0]], dim=2)
    keys, _ = layer.update(*_kv(2, 1, 1))
    assert torch.equal(keys, expected)


def test_growing_cache_holds_the_given_layers_and_makes_the_rest_lazily() -> None:
    filled = growing_cache([_kv(2, 3, 0), _kv(2, 3, 1)])
    assert [type(layer) for layer in filled.layers] == [GrowingLayer, GrowingLayer]
    assert filled.get_seq_length() == 3
    empty = growing_cache()
    empty.update(*_kv(1, 2, 0), layer_idx=1)
    assert [type(layer) for layer in empty.layers] == [GrowingLayer, GrowingLayer]


def test_a_buffer_with_room_is_adopted_without_a_copy_and_appended_into() -> None:
    """The decode batch's builders allocate ``room_for(length)`` positions and hand the buffer
    over: no second copy when the cache is made, none on the next appends."""
    keys, values = _kv(2, room_for(5), 0)
    first = keys[:, :, :5].clone()
    cache = growing_cache([(keys, values)], 5)
    assert cache.layers[0].keys.data_ptr() == keys.data_ptr()
    assert cache.get_seq_length() == 5
    new_keys, new_values = _kv(2, 1, 2)
    held, _ = cache.layers[0].update(new_keys, new_values)
    assert held.data_ptr() == keys.data_ptr() and held.shape[2] == 6
    assert torch.equal(held, torch.cat([first, new_keys], dim=2))
    with pytest.raises(ValueError, match="cannot hold"):
        GrowingLayer().adopt(keys[:, :, :3], values[:, :, :3], 4)


class _ConcatenatingLayer(DynamicLayer):
    """transformers' own layer (a copy on every append), with the decode batch's trim."""

    def drop_front(self, positions: int) -> None:
        self.keys, self.values = self.keys[:, :, positions:], self.values[:, :, positions:]

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]


@pytest.mark.parametrize("continuous", [False, True], ids=["calls", "continuous"])
@pytest.mark.parametrize("strategy", [Chain(group_size=3), TreeGRPO(m=3, n=2, l=1)],
                         ids=["chain", "tree_grpo"])
def test_rollouts_on_the_growing_cache_equal_those_on_transformers_cache(
        tiny_model, word_tokenizer, monkeypatch, strategy, continuous) -> None:
    """The same trees, token for token, with the same log-probabilities, as with
    transformers' concatenating ``DynamicLayer`` (the values the model sees are the same)."""
    fmt = TurnFormat(word_tokenizer)
    config = RolloutConfig(max_turn_tokens=6, synchronous=False, continuous=continuous)

    def run() -> list[list[tuple[tuple[int, ...], tuple[float, ...]]]]:
        batch = rollout([3, 4, 5, 6], lambda: make_frozenlake("rllm"), HFBackend(tiny_model),
                        fmt, strategy, config=config, seed=1)
        return [sorted((tuple(n.action_ids), tuple(n.action_logprobs))
                       for leaf in leaves(tree) for n in path_to(leaf)[1:])
                for tree in batch.trees]

    growing = run()
    monkeypatch.setattr(hf_cache, "GrowingLayer", _ConcatenatingLayer)
    assert run() == growing
