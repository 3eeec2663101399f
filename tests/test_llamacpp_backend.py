"""The llama.cpp backend's own behaviour: what it asks the server for, how it reads the
answers (recorded ones, no server needed), the GGUF it writes, and ``n_cmpl`` prompt sharing
against a real server (``TREEROLL_SKIP_LLAMA_CPP=1`` leaves that out)."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from treeroll.backends.http import ServerError
from treeroll.backends.llamacpp import LlamaCppBackend
from treeroll.backends.llamacpp.gguf import _permute, byte_alphabet, export_gguf, load_gguf_module
from treeroll.backends.llamacpp.server import LlamaServer, source_dir
from treeroll.base import GenerationRequest, SamplingParams

PARAMS = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8, stop_token_ids=(2,),
                        top_logprobs=2)


def _answer(tokens, probs, stop_type="eos", prompt_n=5, cache_n=3):  # type: ignore[no-untyped-def]
    """A ``/completion`` answer in llama.cpp's shape (post-sampling probabilities)."""
    return {"tokens": tokens, "stop_type": stop_type,
            "timings": {"prompt_n": prompt_n, "cache_n": cache_n},
            "completion_probabilities": [
                {"id": t, "prob": p, "top_probs": [{"id": t, "prob": p}, {"id": 99, "prob": 0.01}]}
                for t, p in zip(tokens, probs, strict=True)]}


def test_the_request_asks_for_the_sampling_distribution_and_token_ids() -> None:
    backend = LlamaCppBackend("http://x", eog_token_ids=(2,))
    body = backend.payload(GenerationRequest((1, 2, 3), max_new_tokens=4, seed=2**40 + 7),
                           PARAMS)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 4
    assert body["samplers"] == ["temperature", "top_p"]
    assert (body["top_k"], body["min_p"], body["repeat_penalty"]) == (0, 0.0, 1.0)
    assert body["post_sampling_probs"] is True and body["return_tokens"] is True
    assert body["seed"] == (2**40 + 7) % 2**32 and body["n_probs"] == 2
    unseeded = backend.payload(GenerationRequest((1,)), PARAMS)
    assert unseeded["seed"] == -1 and unseeded["n_predict"] == 8


def test_an_answer_becomes_a_completion_with_the_servers_counts() -> None:
    backend = LlamaCppBackend("http://x")
    out = backend.completion(_answer([7, 2], [0.5, 0.25]), GenerationRequest((1,) * 8), PARAMS)
    assert out.token_ids == [7, 2] and out.finish_reason == "stop"
    assert out.logprobs == pytest.approx([np.log(0.5), np.log(0.25)])
    assert (out.prefill_tokens, out.cached_tokens) == (5, 3)
    assert out.top_logprobs is not None and out.top_logprobs[0][1][0] == 99
    limit = backend.completion(_answer([7], [0.5], stop_type="limit"), GenerationRequest((1,)),
                               PARAMS)
    assert limit.finish_reason == "length"
    greedy = backend.completion(_answer([7], [0.9]), GenerationRequest((1,)),
                                SamplingParams(temperature=0.0))
    assert greedy.logprobs == [0.0]
    assert backend.stats["prefill"] == 15 and backend.stats["requests"] == 3


@pytest.mark.parametrize("broken", ["count", "id", "stop"])
def test_a_malformed_answer_is_a_clear_error(broken) -> None:
    answer = _answer([7, 2], [0.5, 0.25])
    if broken == "count":
        answer["completion_probabilities"].pop()
    elif broken == "id":
        answer["completion_probabilities"][0]["id"] = 8
    else:
        answer["stop_type"] = "word"
    with pytest.raises(ServerError, match="/completion"):
        LlamaCppBackend("http://x").completion(answer, GenerationRequest((1,)), PARAMS)


def test_stop_ids_the_server_does_not_stop_on_are_refused() -> None:
    backend = LlamaCppBackend("http://127.0.0.1:9", eog_token_ids=(2,))
    with pytest.raises(ValueError, match=r"stop_token_ids \[5\].*end-of-generation ids \[2\]"):
        backend.generate([GenerationRequest((1,))], SamplingParams(stop_token_ids=(5,)))


def test_an_unreachable_server_is_a_clear_error() -> None:
    backend = LlamaCppBackend("http://127.0.0.1:9")
    with pytest.raises(ServerError, match=r"127\.0\.0\.1:9/completion: no answer"):
        backend.generate([GenerationRequest((1,))], SamplingParams())


def test_the_rotary_permutation_pairs_the_halves_of_each_head() -> None:
    # HF rotates (x_i, x_{i+d/2}); llama.cpp rotates adjacent pairs (x_{2i}, x_{2i+1}).
    heads, dim = 2, 4
    weight = np.arange(heads * dim).reshape(heads * dim, 1)
    assert _permute(weight, heads)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_the_byte_alphabet_is_gpt2s() -> None:
    alphabet = byte_alphabet()
    assert len(set(alphabet.values())) == 256
    assert (alphabet[ord("a")], alphabet[ord(" ")], alphabet[ord("\n")]) == ("a", "Ġ", "Ċ")


SKIP = os.environ.get("TREEROLL_SKIP_LLAMA_CPP") == "1"


@pytest.fixture(scope="module")
def gguf_module():  # type: ignore[no-untyped-def]
    if SKIP:
        pytest.skip("TREEROLL_SKIP_LLAMA_CPP=1")
    from treeroll.backends.llamacpp.server import server_binary

    server_binary()  # the sources (gguf-py) come with the build
    return load_gguf_module(source_dir())


def test_the_gguf_holds_every_weight_under_llama_cpps_names(gguf_module, tiny_model,
                                                            word_tokenizer, tmp_path) -> None:
    path = export_gguf(tiny_model, word_tokenizer, tmp_path / "m.gguf", gguf_source=source_dir())
    reader = gguf_module.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    config = tiny_model.config
    assert len(tensors) == 2 + 9 * config.num_hidden_layers  # embeddings tied: no output
    embed = tensors["token_embd.weight"].data
    assert np.array_equal(embed, tiny_model.model.embed_tokens.weight.detach().numpy())
    q = tiny_model.model.layers[1].self_attn.q_proj.weight.detach().numpy()
    assert np.array_equal(tensors["blk.1.attn_q.weight"].data,
                          _permute(q, config.num_attention_heads))
    fields = reader.fields
    eos = fields["tokenizer.ggml.eos_token_id"]
    assert int(eos.parts[eos.data[0]][0]) == word_tokenizer.eos_token_id


def test_export_refuses_a_model_that_is_not_a_llama(word_tokenizer, tmp_path) -> None:
    class NotLlama(torch.nn.Module):
        class config:
            model_type = "gpt2"

    with pytest.raises(ValueError, match="writes Llama models; this one is 'gpt2'"):
        export_gguf(NotLlama(), word_tokenizer, tmp_path / "m.gguf")


def test_a_server_that_cannot_load_its_model_says_why(gguf_module, tmp_path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ServerError, match="exited"):
        LlamaServer(bad, slots=1).start(timeout=60)


@pytest.fixture(scope="module")
def shared_server(gguf_module):  # type: ignore[no-untyped-def]
    from treeroll.backends.llamacpp import ManagedLlamaCpp
    from treeroll.policies import load_policy

    policy = load_policy("frozenlake-tiny")
    backend = ManagedLlamaCpp(copy.deepcopy(policy.model), policy.tokenizer, slots=4,
                              ctx_per_slot=512, share_prompts=True)
    yield backend, policy
    backend.close()


def test_n_cmpl_computes_a_shared_prompt_once_and_seeds_its_members_in_turn(shared_server
                                                                            ) -> None:
    backend, policy = shared_server
    from treeroll.envs import make_frozenlake

    env = make_frozenlake("rllm")
    prompt = tuple(policy.turn_format().prompt(env.system_prompt, env.reset(4242))[0])
    params = SamplingParams(temperature=2.0, max_new_tokens=6, stop_token_ids=(2,))
    seeds = [1000, 7, 123, 55]
    backend.reset_cache()
    grouped = backend.generate([GenerationRequest(prompt, seed=s) for s in seeds], params)
    assert grouped[0].prefill_tokens == len(prompt)
    assert all((c.prefill_tokens, c.cached_tokens) == (0, len(prompt)) for c in grouped[1:])
    backend.share_prompts = False
    try:
        alone = [backend.generate([GenerationRequest(prompt, seed=1000 + j)], params)[0]
                 for j in range(len(seeds))]
    finally:
        backend.share_prompts = True
    assert [c.token_ids for c in grouped] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in grouped}) > 1  # the members did differ


def test_a_running_server_reached_by_url_forgets_its_slots_on_reset(gguf_module,
                                                                    tmp_path) -> None:
    """``LlamaCppBackend.reset_cache`` on a server treeroll did not start erases every slot;
    started as a server whose weights change should be (``--slot-save-path``, which the erase
    action needs, and ``--cache-ram 0``) nothing cached is served afterwards; a server without
    ``--slot-save-path`` is a clear error naming the flag."""
    from treeroll.backends.llamacpp import LlamaCppBackend
    from treeroll.policies import load_policy

    policy = load_policy("frozenlake-tiny")
    path = export_gguf(policy.model, policy.tokenizer, source_dir().parent / "test-remote.gguf",
                       gguf_source=source_dir())
    with (LlamaServer(path, slots=1, ctx_per_slot=512, cache_ram_mib=0) as plain,
          pytest.raises(ServerError, match="--slot-save-path")):
        LlamaCppBackend(plain.url).reset_cache()
    with LlamaServer(path, slots=2, ctx_per_slot=512, cache_ram_mib=0,
                     extra_args=("--slot-save-path", str(tmp_path))) as server:
        backend = LlamaCppBackend(server.url, concurrency=2, eog_token_ids=(2,))
        prompt = tuple(range(10, 60))
        params = SamplingParams(max_new_tokens=4, stop_token_ids=(2,))
        backend.generate([GenerationRequest(prompt, seed=1)], params)
        again = backend.generate([GenerationRequest(prompt, seed=1)], params)[0]
        assert again.cached_tokens == len(prompt) - 1
        backend.reset_cache()
        after = backend.generate([GenerationRequest(prompt, seed=1)], params)[0]
        assert (after.prefill_tokens, after.cached_tokens) == (len(prompt), 0)
    path.unlink()
