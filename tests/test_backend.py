"""The transformers backend: KV forking equals recomputation; seeded sampling is cache-blind."""

from __future__ import annotations

import math

import pytest
import torch

from treeroll.backends.hf import HFBackend, KVTrie
from treeroll.base import GenerationRequest, SamplingParams


def _random_prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(4, vocab, (n,), generator=g).tolist()) for n in lengths]


def test_forked_logits_equal_full_recompute(tiny_model, word_tokenizer) -> None:
    """Logits computed through a forked cache (prefix from the trie, batch padded) equal a
    plain forward of the whole sequence, within 1e-4."""
    vocab = len(word_tokenizer)
    trunk = _random_prompts(vocab, [30])[0]
    backend = HFBackend(tiny_model)
    params = SamplingParams(max_new_tokens=5, stop_token_ids=())
    first = backend.generate([GenerationRequest(trunk, seed=1)], params)[0]
    assert first.prefill_tokens == len(trunk) and first.cached_tokens == 0
    # Three children of the same node with different observations, plus one deeper branch.
    children = [trunk + tuple(first.token_ids) + obs
                for obs in ((7, 8, 9), (10,), (11, 12, 13, 14, 15, 16))]
    children.append(trunk[:12] + (20, 21))  # branches mid-trunk
    completions = backend.generate([GenerationRequest(c, seed=i) for i, c in
                                    enumerate(children)], params)
    assert completions[0].cached_tokens == len(trunk) + len(first.token_ids) - 1
    for child, completion in zip(children, completions, strict=True):
        full = torch.tensor([list(child) + completion.token_ids[:-1]])
        with torch.no_grad():
            logits = tiny_model(input_ids=full).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        # logprob of each sampled token, from a plain forward of the whole sequence
        positions = range(len(child) - 1, len(child) - 1 + len(completion.token_ids))
        reference = [float(logp[p, t]) for p, t in zip(positions, completion.token_ids,
                                                        strict=True)]
        diff = max(abs(a - b) for a, b in zip(reference, completion.logprobs, strict=True))
        assert diff <= 1e-4, diff


def test_cached_logits_match_at_every_position(tiny_model, word_tokenizer) -> None:
    """Direct check of the padded forward: max abs logit difference <= 1e-4."""
    vocab = len(word_tokenizer)
    prompts = _random_prompts(vocab, [9, 17, 4], seed=3)
    backend = HFBackend(tiny_model)
    backend.generate([GenerationRequest(p, seed=0) for p in prompts],
                     SamplingParams(max_new_tokens=3))
    longer = [p + (5, 6, 7) for p in prompts]
    matched = [backend.trie.match(p[:-1]) for p in longer]
    assert all(m > 0 for m, _ in matched)
    cache, mask, positions, ids = backend._pack([[kv] for _, kv in matched],
                                                [m for m, _ in matched],
                                                [p[m:] for p, (m, _) in zip(longer, matched,
                                                                            strict=True)])
    with torch.no_grad():
        packed = backend._forward(ids, mask, positions, cache)[:, -1]
        for b, p in enumerate(longer):
            plain = tiny_model(input_ids=torch.tensor([list(p)])).logits[0, -1]
            assert float((packed[b] - plain).abs().max()) <= 1e-4


def test_seeded_sampling_through_fork_equals_no_cache_path(tiny_model, word_tokenizer) -> None:
    vocab = len(word_tokenizer)
    prompts = _random_prompts(vocab, [12, 5, 20], seed=7)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(2,))
    cached = HFBackend(tiny_model)
    plain = HFBackend(tiny_model, use_prefix_cache=False)
    first = cached.generate([GenerationRequest(p, seed=i) for i, p in enumerate(prompts)], params)
    second_prompts = [p + tuple(c.token_ids) + (9, 10) for p, c in zip(prompts, first,
                                                                       strict=True)]
    requests = [GenerationRequest(p, seed=100 + i) for i, p in enumerate(second_prompts)]
    requests.append(requests[0])  # a duplicate prompt shares its prefill
    through_fork = cached.generate(requests, params)
    reference = plain.generate(requests, params)
    assert [c.token_ids for c in through_fork] == [c.token_ids for c in reference]
    assert through_fork[-1].prefill_tokens == 0
    assert sum(c.cached_tokens for c in through_fork) > 0
    for c, p in zip(through_fork, requests, strict=True):
        assert c.prefill_tokens + c.cached_tokens == len(p.prompt_ids)
    # Batch composition does not change a seeded request's tokens.
    alone = HFBackend(tiny_model).generate([requests[1]], params)[0]
    assert alone.token_ids == through_fork[1].token_ids


def test_identical_requests_are_decoded_in_one_row_and_counted_as_shared(tiny_model) -> None:
    """Greedy requests with one prompt sample the same reply: the backend forwards it once
    (as many forward tokens as one request alone) and reports the later copies' tokens as
    shared, each whole reply; their tokens and logprobs are the lone request's."""
    prompt = (5, 6, 7, 8)
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=())
    alone_backend = HFBackend(tiny_model)
    alone = alone_backend.generate([GenerationRequest(prompt)], params)[0]
    backend = HFBackend(tiny_model)
    copies = backend.generate([GenerationRequest(prompt) for _ in range(3)], params)
    assert backend.stats["forward_tokens"] == alone_backend.stats["forward_tokens"]
    assert [c.token_ids for c in copies] == [alone.token_ids] * 3
    assert [c.logprobs for c in copies] == [alone.logprobs] * 3
    assert [c.shared_tokens for c in copies] == [0, len(alone.token_ids), len(alone.token_ids)]


def test_requests_whose_samples_part_get_their_own_rows_and_tokens(tiny_model,
                                                                  word_tokenizer) -> None:
    """Sampled requests that share a prompt and part at different positions: each one's
    tokens equal that request's tokens sampled alone; the shared count is the length of the
    prefix an earlier request had sampled already, and the forward work falls by that much."""
    prompt = _random_prompts(len(word_tokenizer), [9], seed=3)[0]
    # at this temperature the random tiny model's eight samples share 0 to 8 first tokens
    params = SamplingParams(temperature=0.05, max_new_tokens=8, stop_token_ids=())
    requests = [GenerationRequest(prompt, seed=s) for s in range(8)]
    backend = HFBackend(tiny_model)
    together = backend.generate(requests, params)
    alone = [HFBackend(tiny_model).generate([r], params)[0] for r in requests]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    for i, c in enumerate(together):
        longest = max((next((j for j, (a, b) in enumerate(zip(c.token_ids, e.token_ids,
                                                                strict=True)) if a != b),
                            len(c.token_ids)) for e in together[:i]), default=0)
        assert c.shared_tokens == longest, i
    assert sum(c.shared_tokens for c in together) > 0  # the test exercises sharing ...
    assert len({tuple(c.token_ids) for c in together}) > 2  # ... and parting
    fed = sum(len(c.token_ids) - 1 for c in together)  # each request's tokens but its last
    shared_fed = sum(min(c.shared_tokens, len(c.token_ids) - 1) for c in together)
    assert backend.stats["forward_tokens"] == len(prompt) + fed - shared_fed


def test_stop_token_and_length_caps(tiny_model) -> None:
    backend = HFBackend(tiny_model)
    prompt = (5, 6, 7)
    out = backend.generate([GenerationRequest(prompt, max_new_tokens=2, seed=0)],
                           SamplingParams(max_new_tokens=10))[0]
    assert len(out.token_ids) == 2 and out.finish_reason == "length"
    greedy = backend.generate([GenerationRequest(prompt)],
                              SamplingParams(temperature=0.0, max_new_tokens=4))[0]
    first = greedy.token_ids[0]
    stopped = backend.generate([GenerationRequest(prompt)],
                               SamplingParams(temperature=0.0, max_new_tokens=4,
                                              stop_token_ids=(first,)))[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


def test_trie_stores_shared_prefix_once_and_splits() -> None:
    trie = KVTrie()

    def kv(n: int, offset: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
        values = torch.arange(n, dtype=torch.float).view(1, n, 1) + offset
        return [(values.clone(), values.clone())]

    trie.insert((1, 2, 3, 4), kv(4, 0.0))
    trie.insert((1, 2, 9), kv(3, 0.0))
    assert trie.num_tokens == 5  # 1 2 stored once, then 3 4 and 9
    length, got = trie.match((1, 2, 3, 7))
    assert length == 3 and got[0][0].shape[1] == 3
    length, _ = trie.match((5,))
    assert length == 0
    small = KVTrie(max_tokens=4)
    small.insert((1, 2, 3), kv(3, 0.0))
    small.insert((4, 5, 6), kv(3, 0.0))
    assert small.num_tokens <= 4


def _nucleus(logits: torch.Tensor, temperature: float, top_p: float) -> dict[int, float]:
    """Log-probabilities of the distribution top-p sampling draws from, from its definition:
    the most probable tokens of softmax(logits / T), taken in order until their mass reaches
    top_p, renormalised over that nucleus."""
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    nucleus: list[int] = []
    mass = 0.0
    for token in sorted(range(len(probs)), key=lambda t: -probs[t]):
        nucleus.append(token)
        mass += probs[token]
        if mass >= top_p:
            break
    return {token: math.log(probs[token] / mass) for token in nucleus}


def test_top_p_logprobs_are_those_of_the_nucleus_sampled_from(tiny_model, word_tokenizer
                                                               ) -> None:
    """With top_p < 1 a sampled id's recorded logprob is its log-probability under the
    renormalised nucleus of softmax(logits / T), the distribution it was drawn from, not the
    full softmax: at the first position over many seeds (every nucleus token is drawn and
    their probabilities sum to 1), and at every position of longer continuations."""
    temperature, top_p = 0.12, 0.5
    prompt = _random_prompts(len(word_tokenizer), [12], seed=1)[0]
    with torch.no_grad():
        logits = tiny_model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    nucleus = _nucleus(logits, temperature, top_p)
    assert 3 <= len(nucleus) <= 12  # several tokens, far fewer than the vocabulary
    backend = HFBackend(tiny_model)
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=1)
    recorded: dict[int, float] = {}
    for completion in backend.generate([GenerationRequest(prompt, seed=s) for s in range(400)],
                                       params):
        token, logprob = completion.token_ids[0], completion.logprobs[0]
        assert token in nucleus
        assert logprob == pytest.approx(nucleus[token], abs=1e-4), (token, nucleus)
        recorded[token] = logprob
    assert set(recorded) == set(nucleus)  # every nucleus token was drawn at least once
    assert sum(math.exp(logprob) for logprob in recorded.values()) == pytest.approx(1.0,
                                                                                   abs=1e-4)
    # Deeper positions, through the KV cache, against a plain forward of the whole sequence.
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=6,
                            stop_token_ids=())
    for completion in backend.generate([GenerationRequest(prompt, seed=s) for s in range(4)],
                                       params):
        with torch.no_grad():
            every = tiny_model(input_ids=torch.tensor(
                [list(prompt) + completion.token_ids[:-1]])).logits[0].float()
        for i, (token, logprob) in enumerate(zip(completion.token_ids, completion.logprobs,
                                                 strict=True)):
            expected = _nucleus(every[len(prompt) - 1 + i], temperature, top_p)
            assert logprob == pytest.approx(expected[token], abs=1e-4)


def test_a_branch_points_later_children_need_no_forward(tiny_model, word_tokenizer) -> None:
    """A prompt seen before (its KV in the trie, its last logits kept) is not forwarded again,
    not even its last token, alone or beside new prompts; what is sampled from it matches a
    plain forward within 1e-4, and the kept logits go with the trie on reset."""
    vocab = len(word_tokenizer)
    node, other = _random_prompts(vocab, [15, 9], seed=11)
    backend = HFBackend(tiny_model)
    params = SamplingParams(max_new_tokens=4, stop_token_ids=())
    backend.generate([GenerationRequest(node, seed=0)], params)
    before = backend.stats["forward_tokens"]
    later = backend.generate([GenerationRequest(node, seed=1), GenerationRequest(node, seed=2),
                              GenerationRequest(other, seed=3)], params)
    assert [c.prefill_tokens for c in later] == [0, 0, len(other)]
    assert [c.cached_tokens for c in later] == [len(node), len(node), 0]
    decoded = 3 * (params.max_new_tokens - 1)
    assert backend.stats["forward_tokens"] - before == len(other) + decoded
    for prompt, completion in zip((node, node, other), later, strict=True):
        full = torch.tensor([list(prompt) + completion.token_ids[:-1]])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_model(input_ids=full).logits[0].float(), -1)
        reference = [float(logp[len(prompt) - 1 + i, t])
                     for i, t in enumerate(completion.token_ids)]
        assert max(abs(a - b) for a, b in zip(reference, completion.logprobs,
                                               strict=True)) <= 1e-4
    backend.reset_cache()
    again = backend.generate([GenerationRequest(node, seed=1)], params)[0]
    assert again.prefill_tokens == len(node)
    off = HFBackend(tiny_model, keep_logits=False)
    off.generate([GenerationRequest(node, seed=0)], params)
    assert off.generate([GenerationRequest(node, seed=1)], params)[0].prefill_tokens == 1
    assert off.stats["refed"] == 1 and backend.stats["refed"] == 0


def test_a_reply_that_repeats_an_earlier_calls_reply_is_replayed_without_a_forward(
        tiny_model, word_tokenizer) -> None:
    """A request whose context an earlier call decoded samples from the logits kept then: a
    greedy repeat of a 4-token reply costs no forward (3 tokens reused, the last never fed);
    asked for 6 tokens it replays the 4 kept positions, feeds the 4th and decodes on; its
    tokens and logprobs are a fresh backend's."""
    node = _random_prompts(len(word_tokenizer), [12], seed=5)[0]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=())
    backend = HFBackend(tiny_model)
    first = backend.generate([GenerationRequest(node)], greedy)[0]
    before = backend.stats["forward_tokens"]
    again = backend.generate([GenerationRequest(node)], greedy)[0]
    assert again.token_ids == first.token_ids and again.logprobs == first.logprobs
    assert backend.stats["forward_tokens"] == before
    assert (again.reused_tokens, again.prefill_tokens, again.cached_tokens) == (3, 0, len(node))
    longer = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=())
    more = backend.generate([GenerationRequest(node)], longer)[0]
    fresh = HFBackend(tiny_model).generate([GenerationRequest(node)], longer)[0]
    assert more.token_ids == fresh.token_ids
    assert more.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)
    assert more.reused_tokens == 3  # t0..t2 replayed; t3 fed, then t4 decoded from it
    assert backend.stats["forward_tokens"] - before == 2
    off = HFBackend(tiny_model, replay=False)
    off.generate([GenerationRequest(node)], greedy)
    off_before = off.stats["forward_tokens"]
    repeat = off.generate([GenerationRequest(node)], greedy)[0]
    assert repeat.token_ids == first.token_ids and repeat.reused_tokens == 0
    assert off.stats["forward_tokens"] - off_before == len(first.token_ids) - 1


def test_a_replay_that_parts_after_its_first_token_samples_that_token_once(
        tiny_model, word_tokenizer) -> None:
    """An earlier 1-token reply kept only its prompt's logits: a longer repeat replays the
    first token from them and the prefill feeds it; the token is sampled once (not undone and
    sampled again by the decode batch), and the reply is a fresh backend's."""
    node = _random_prompts(len(word_tokenizer), [9], seed=11)[0]
    backend = HFBackend(tiny_model)
    backend.generate([GenerationRequest(node)],
                     SamplingParams(temperature=0.0, max_new_tokens=1, stop_token_ids=()))
    sampled = []
    sample = backend._sample
    backend._sample = lambda logits, rows, params: (  # type: ignore[method-assign]
        sampled.append(len(rows)), sample(logits, rows, params))[1]
    longer = SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=())
    before = backend.stats["forward_tokens"]
    out = backend.generate([GenerationRequest(node)], longer)[0]
    fresh = HFBackend(tiny_model).generate([GenerationRequest(node)], longer)[0]
    assert out.token_ids == fresh.token_ids
    assert out.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)
    assert sum(sampled) == len(out.token_ids) == 4
    assert (out.reused_tokens, out.prefill_tokens, out.cached_tokens) == (0, 0, len(node))
    assert backend.stats["forward_tokens"] - before == 3  # t0, t1, t2 fed; t3 never


def test_load_weights_replaces_the_weights_and_forgets_the_cache(tiny_model, word_tokenizer
                                                                  ) -> None:
    prompt = _random_prompts(len(word_tokenizer), [10], seed=2)[0]
    backend = HFBackend(tiny_model)
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    backend.generate([GenerationRequest(prompt)], params)
    state = {k: torch.zeros_like(v) for k, v in tiny_model.state_dict().items()}
    backend.load_weights(state)
    assert all(float(p.detach().abs().sum()) == 0 for p in tiny_model.parameters())
    out = backend.generate([GenerationRequest(prompt)], params)[0]
    assert out.prefill_tokens == len(prompt)  # nothing cached under the old weights is reused
    from treeroll.base import UpdatableBackend
    assert isinstance(backend, UpdatableBackend)


def test_a_prefills_last_logits_do_not_depend_on_how_many_share_its_batch(
        word_tokenizer) -> None:
    """The prefill runs the head on the last positions alone, padded to LAST_ROWS rows: each
    row's logits are bit for bit those of a plain forward with every position's logits,
    whether the row is prefilled alone or with others. (A head of this shape over one row
    takes another CPU kernel, ~3e-7 off: LAST_ROWS = 1 fails here; the sampled logprobs,
    kept in float32, hide most of that, the SAO test's gradients did not.)"""
    from treeroll.backends.hf.cache import growing_cache
    from treeroll.policies.model import ModelConfig, build_model

    vocab = 2048  # a real head's shape, wider than the word vocabulary
    model = build_model(vocab, ModelConfig(hidden_size=128, num_layers=1, num_heads=4,
                                           intermediate_size=256, seed=0),
                        pad_token_id=0, eos_token_id=1).eval()
    backend = HFBackend(model)
    ids = torch.randint(4, vocab, (5, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(input_ids=ids).logits[:, -1]  # every position's logits, then the last
        for rows in (1, 5):
            positions = torch.arange(12).expand(rows, 12)
            last = backend._forward(ids[:rows], torch.ones(rows, 12, dtype=torch.long),
                                    positions, growing_cache(), last_only=True)
            assert last.shape == (rows, 1, vocab)
            assert torch.equal(last[:, 0], full[:rows])


def test_a_model_that_reshapes_its_heads_output_prefills_with_every_positions_logits(
        ) -> None:
    """A model whose forward reshapes the head's output (here back to ``[batch, seq,
    vocab]``) cannot have its head run at chosen positions: the backend finds that out with
    one small probe before its first prefill and computes every position's logits instead,
    as it did before the head ran on the last positions alone; the logits are the model's."""
    from treeroll.backends.hf.cache import growing_cache
    from treeroll.heads import head_at_works
    from treeroll.policies.model import ModelConfig, build_model

    model = build_model(64, ModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                        intermediate_size=64, seed=0),
                        pad_token_id=0, eos_token_id=1).eval()
    assert head_at_works(model)
    plain = model.forward

    def reshaping(*args: object, input_ids: torch.Tensor, **kwargs: object) -> object:
        out = plain(*args, input_ids=input_ids, **kwargs)
        out.logits = out.logits.reshape(*input_ids.shape, -1)
        return out

    model.forward = reshaping  # type: ignore[method-assign]
    assert not head_at_works(model)
    ids = torch.randint(4, 64, (3, 7), generator=torch.Generator().manual_seed(0))
    backend = HFBackend(model)
    with torch.no_grad():
        full = model(input_ids=ids).logits[:, -1]
        last = backend._forward(ids, torch.ones(3, 7, dtype=torch.long),
                                torch.arange(7).expand(3, 7), growing_cache(), last_only=True)
    assert backend._head_at_works is False
    assert last.shape == (3, 1, 64) and torch.equal(last[:, 0], full)
