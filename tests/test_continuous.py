"""Continuous batching (issue #11): requests join the HF backend's running decode batch, and
the engine starts each reply's environment step as soon as that reply ends."""

from __future__ import annotations

import pytest

from treeroll.backends.hf import HFBackend
from treeroll.base import GenerationRequest, SamplingParams
from treeroll.checks import ConfigError
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.scorers import FrozenLakeProgress
from treeroll.strategies import PATR, Chain, TreeGRPO
from treeroll.tree import TokenCounts, leaves, path_to, token_counts

from .conftest import ScriptedBackend
from .test_engine import _Sleepy


def _random_prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[tuple[int, ...]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(4, vocab, (n,), generator=g).tolist()) for n in lengths]


def _drain(backend: HFBackend) -> dict[int, object]:
    done = {}
    while backend.busy:
        done.update(backend.advance())
    return done


def test_requests_joining_a_running_batch_sample_what_they_sample_alone(
        tiny_model, word_tokenizer) -> None:
    """A request submitted while others decode joins their batch (both caches left-padded to
    the longer past); a request beyond ``max_batch_size`` waits for a free row. Every reply
    equals that request sampled alone (tokens; logprobs within float rounding)."""
    prompts = _random_prompts(len(word_tokenizer), [7, 19, 11, 4], seed=2)
    params = SamplingParams(max_new_tokens=9, stop_token_ids=())
    requests = [GenerationRequest(p, seed=i, max_new_tokens=9 - i) for i, p in enumerate(prompts)]
    backend = HFBackend(tiny_model, max_batch_size=2, replay=False)
    first = backend.submit(requests[:1], params)
    finished = dict(backend.advance())
    finished.update(backend.advance())
    later = backend.submit(requests[1:], params)  # one joins now, two wait for free rows
    assert backend.busy
    finished.update(_drain(backend))
    assert not backend.busy and sorted(finished) == first + later
    for ticket, request in zip(first + later, requests, strict=True):
        alone = HFBackend(tiny_model).generate([request], params)[0]
        got = finished[ticket]
        assert got.token_ids == alone.token_ids  # type: ignore[attr-defined]
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-5)  # type: ignore[attr-defined]
    fed = sum(len(p) + len(finished[t].token_ids) - 1  # type: ignore[attr-defined]
              for t, p in zip(first + later, prompts, strict=True))
    assert backend.stats["forward_tokens"] == fed


def test_a_stream_refuses_other_sampling_parameters_and_a_reset_while_decoding(
        tiny_model) -> None:
    backend = HFBackend(tiny_model)
    backend.submit([GenerationRequest((5, 6, 7), seed=0)], SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="same sampling parameters"):
        backend.submit([GenerationRequest((5, 6), seed=1)], SamplingParams(max_new_tokens=4))
    with pytest.raises(RuntimeError, match="still decoding"):
        backend.reset_cache()
    _drain(backend)
    backend.reset_cache()


def test_a_running_batch_drops_the_left_padding_of_rows_that_finished(tiny_model,
                                                                      word_tokenizer) -> None:
    """A long prompt that finishes early leaves the short one's left padding behind; the
    batch drops it, so its width is the live row's length, not the longest past it ever
    held."""
    long, short = _random_prompts(len(word_tokenizer), [40, 5], seed=4)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=())
    backend = HFBackend(tiny_model, replay=False)
    backend.submit([GenerationRequest(long, seed=0, max_new_tokens=2),
                    GenerationRequest(short, seed=1)], params)
    done = dict(backend.advance())
    done.update(backend.advance())
    assert list(done) == [0]  # the long prompt's 2 tokens are out; the short one decodes on
    stream = backend._stream
    assert stream is not None and stream.live == 1
    assert stream.mask.shape[1] == int(stream.mask.sum()) == len(short) + 2
    assert all(layer.keys.shape[2] == len(short) + 2 for layer in stream.cache.layers)
    done.update(_drain(backend))
    alone = HFBackend(tiny_model).generate([GenerationRequest(short, seed=1)], params)[0]
    assert done[1].token_ids == alone.token_ids  # type: ignore[attr-defined]


def test_queued_requests_join_in_rounds(tiny_model, word_tokenizer) -> None:
    """With ``join_fraction=1`` a lone request queued beside two decoding ones waits for
    ``join_wait`` decode steps, then joins (one prefill forward for a round, not one a step);
    it samples what it samples alone."""
    prompts = _random_prompts(len(word_tokenizer), [6, 8, 7], seed=6)
    params = SamplingParams(max_new_tokens=10, stop_token_ids=())
    backend = HFBackend(tiny_model, replay=False, join_fraction=1.0, join_wait=3)
    backend.submit([GenerationRequest(p, seed=i) for i, p in enumerate(prompts[:2])], params)
    backend.advance()
    backend.submit([GenerationRequest(prompts[2], seed=2)], params)
    live = []
    for _ in range(4):
        backend.advance()
        live.append(backend._stream.live)  # type: ignore[union-attr]
    assert live == [2, 2, 2, 3]
    done = _drain(backend)
    alone = HFBackend(tiny_model).generate([GenerationRequest(prompts[2], seed=2)], params)[0]
    assert done[2].token_ids == alone.token_ids  # type: ignore[attr-defined]


def _paths(batch) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Every tree as the sorted root-to-leaf paths of (action tokens, reward, status): node
    ids follow the order in which branches finish, which continuous batching changes."""
    return [sorted(tuple((tuple(n.action_ids), n.reward, str(n.status)) for n in path_to(leaf))
                   for leaf in leaves(tree)) for tree in batch.trees]


@pytest.mark.parametrize(("strategy", "scorer"), [
    (Chain(group_size=3), None),
    (TreeGRPO(m=3, n=2, l=1), None),
    (PATR(b0=2, k_turns=1, top_k=1, m=2, theta=3), FrozenLakeProgress()),
], ids=["chain", "tree_grpo", "patr"])
def test_continuous_batching_gives_the_unsynchronised_engines_trees(
        tiny_model, word_tokenizer, strategy, scorer) -> None:
    """Same trees as backend calls per round (compared as sets of paths: node ids follow the
    order branches finish in), the same tokens generated, and the accounting still equals
    the backend's forwards."""
    fmt = TurnFormat(word_tokenizer)
    runs = {}
    for continuous in (False, True):
        backend = HFBackend(tiny_model)
        config = RolloutConfig(max_turn_tokens=6, synchronous=False, continuous=continuous)
        batch = rollout([3, 4, 5], lambda: make_frozenlake("rllm"), backend, fmt, strategy,
                        config=config, scorer=scorer, seed=1)
        counts = sum((token_counts(t) for t in batch.trees), TokenCounts())
        assert counts.forwarded == backend.stats["forward_tokens"]
        runs[continuous] = _paths(batch), counts
    assert runs[True][0] == runs[False][0]
    assert runs[True][1].generated == runs[False][1].generated


def test_a_slow_environment_does_not_block_continuous_generation(tiny_model,
                                                                  word_tokenizer) -> None:
    """Task 0's steps sleep 1 s each; with env workers and continuous batching the other
    tasks' turns all end before task 0's first step does (1 s: margin for a loaded machine;
    0.3 s failed once beside a training run)."""
    _Sleepy.finished = {}
    fmt = TurnFormat(word_tokenizer)
    config = RolloutConfig(max_turn_tokens=4, env_workers=4, synchronous=False,
                           continuous=True, max_depth=4)
    batch = rollout([0, 1, 2], lambda: _Sleepy(1.0), HFBackend(tiny_model), fmt,
                    Chain(group_size=2), config=config, seed=0)
    assert len(_Sleepy.finished[1]) >= 4
    assert max(_Sleepy.finished[1] + _Sleepy.finished[2]) < min(_Sleepy.finished[0])
    assert all(len(leaves(t)) == 2 for t in batch.trees)


def test_continuous_batching_is_refused_with_rounds_or_a_backend_that_cannot_stream(
        byte_format) -> None:
    def lake():  # type: ignore[no-untyped-def]
        return make_frozenlake("rllm", size_min=3, size_max=3)

    with pytest.raises(ConfigError, match=r"rollout\.continuous.*synchronous false"):
        rollout([1], lake, ScriptedBackend(["Up"]), byte_format, Chain(group_size=1),
                config=RolloutConfig(continuous=True), seed=0)
    with pytest.raises(ConfigError, match=r"rollout\.continuous.*'ScriptedBackend' has none"):
        rollout([1], lake, ScriptedBackend(["Up"]), byte_format, Chain(group_size=1),
                config=RolloutConfig(continuous=True, synchronous=False), seed=0)


def test_the_config_check_refuses_continuous_batching_on_a_registered_backend_that_cannot_stream(
        ) -> None:
    """Before anything is built: the registry says which backends stream; a user's plug-in
    backend is not known until built (``rollout()`` checks it then)."""
    from dataclasses import replace

    from treeroll.backends import backend_streams
    from treeroll.config import TrainConfig
    from treeroll.config_checks import check_config

    base = TrainConfig()
    streaming = replace(base, rollout=replace(base.rollout, continuous=True, synchronous=False))
    check_config(streaming)  # the in-process hf backend streams
    assert backend_streams("hf") is True and backend_streams("pkg.mod:make") is None
    assert backend_streams("llamacpp") is False  # the flag lives in the registry entry
    for name in ("llamacpp", "vllm", "sglang"):
        with pytest.raises(ValueError, match=rf"--rollout\.continuous is on, which needs a "
                           rf"backend with submit.*'{name}' has none"):
            check_config(replace(streaming, backend=replace(base.backend, name=name)))
    with pytest.raises(ValueError, match=r"--rollout\.continuous is on, which needs "
                       r"--rollout\.synchronous false"):
        check_config(replace(streaming, rollout=replace(streaming.rollout, synchronous=True)))


def test_the_engine_refuses_a_stream_that_is_still_busy_when_every_reply_is_in(
        tiny_model, word_tokenizer) -> None:
    """The engine keeps its own ledger of submitted requests; a backend still busy after the
    last reply the engine waited for holds requests nobody will collect (a later rollout would
    receive them), so the rollout stops with an error instead of finishing quietly."""

    class Leaky(HFBackend):
        @property
        def busy(self) -> bool:
            return True

    config = RolloutConfig(max_turn_tokens=4, synchronous=False, continuous=True)
    rollout([3], lambda: make_frozenlake("rllm"), HFBackend(tiny_model),
            TurnFormat(word_tokenizer), Chain(group_size=2), config=config, seed=1)
    with pytest.raises(RuntimeError, match="still holds requests"):
        rollout([3], lambda: make_frozenlake("rllm"), Leaky(tiny_model),
                TurnFormat(word_tokenizer), Chain(group_size=2), config=config, seed=1)
