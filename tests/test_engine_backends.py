"""The vLLM and SGLang backends at their API boundaries, on CPU, against fakes that behave as
vLLM 0.34.0 and SGLang 0.5.23 do (``tests/_engines.py``: the engines' parameter names and
limits, their seed semantics, the logprobs each returns in each mode, vLLM's process boundary
for weight updates, SGLang's answer shapes). What is checked is treeroll's side: the requests
it builds, that the logprobs it reports are those of the distribution each token was drawn
from, how it counts cached tokens, weight updates, and the refusals before work."""

from __future__ import annotations

import threading
from dataclasses import replace
from http.server import ThreadingHTTPServer

import numpy as np
import pytest
import torch

from tests._engines import BLOCK, FakeLLM, FakeSGLang, TinyLM, VLLMSamplingParams
from treeroll.backends.http import ServerError
from treeroll.backends.sglang import SGLangBackend
from treeroll.backends.vllm import IN_PROCESS, VLLMBackend
from treeroll.base import GenerationRequest, SamplingParams

PARAMS = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=4, stop_token_ids=(2,),
                        top_logprobs=1)


def _drawn_from(lm: TinyLM, prompt: tuple[int, ...], tokens: list[int], temperature: float,
                top_p: float, which: str = "sampled") -> list[float]:
    """The logprob of each token under the distribution it was drawn from (``sampled``), or
    another of :meth:`TinyLM.step`'s distributions, recomputed from the model."""
    context, out = list(prompt), []
    for token in tokens:
        _, dists = lm.step(context, temperature, top_p, np.random.default_rng(0))
        out.append(float(dists[which][token]))
        context.append(token)
    return out


@pytest.fixture(autouse=True)
def _vllm_in_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """As :func:`treeroll.backends.vllm.make_llm` leaves it: the engine in this process."""
    monkeypatch.setenv(IN_PROCESS, "0")


def _vllm(**options: object) -> tuple[VLLMBackend, FakeLLM]:
    llm = FakeLLM(**options)  # type: ignore[arg-type]
    return VLLMBackend(llm, sampling_params=VLLMSamplingParams), llm


def test_vllm_requests_carry_ids_a_salt_a_seed_and_the_stop_ids_by_vllms_names() -> None:
    backend, llm = _vllm()
    backend.generate([GenerationRequest((1, 2, 3), max_new_tokens=2, seed=2**64 + 3)], PARAMS)
    (prompt,), (sp,) = llm.calls[0]
    assert prompt == {"prompt_token_ids": [1, 2, 3], "cache_salt": "treeroll-w0"}
    assert sp.seed == (2**64 + 3) % 2**63 and sp.max_tokens == 2
    assert (sp.temperature, sp.top_p, sp.logprobs) == (0.8, 0.9, 1)
    assert sp.stop_token_ids == [2] and sp.detokenize is False and sp.n == 1


def test_vllm_logprobs_are_those_of_the_distribution_each_token_was_drawn_from() -> None:
    backend, llm = _vllm()
    prompt = (4, 7, 1)
    out = backend.generate([GenerationRequest(prompt, seed=5, max_new_tokens=6)], PARAMS)[0]
    expected = _drawn_from(llm.lm, prompt, out.token_ids, 0.8, 0.9)
    assert out.logprobs == pytest.approx(expected, abs=1e-9)
    raw = _drawn_from(llm.lm, prompt, out.token_ids, 0.8, 0.9, "raw")
    assert max(abs(a - b) for a, b in zip(raw, expected, strict=True)) > 0.05  # not raw ones
    again = backend.generate([GenerationRequest(prompt, seed=5, max_new_tokens=6)], PARAMS)[0]
    assert again.token_ids == out.token_ids  # a seed per request
    assert out.top_logprobs is not None and all(len(t) == 1 for t in out.top_logprobs)


def test_vllm_an_llm_returning_raw_logprobs_is_refused() -> None:
    with pytest.raises(ValueError, match=r"raw_logprobs.*processed_logprobs"):
        VLLMBackend(FakeLLM(logprobs_mode="raw_logprobs"), sampling_params=VLLMSamplingParams)


def test_vllm_cached_tokens_come_from_num_cached_tokens() -> None:
    backend, _ = _vllm()
    prompt = tuple(range(10, 23))  # 13 tokens: 3 full blocks
    first = backend.generate([GenerationRequest(prompt, seed=1)], PARAMS)[0]
    again = backend.generate([GenerationRequest(prompt + (7,), seed=1)], PARAMS)[0]
    assert (first.prefill_tokens, first.cached_tokens) == (13, 0)
    assert (again.prefill_tokens, again.cached_tokens) == (2, 12)


def test_vllm_weight_update_hands_the_weights_over_and_nothing_old_is_hit() -> None:
    backend, llm = _vllm()
    prompt = tuple(range(10, 30))
    before = backend.generate([GenerationRequest(prompt, seed=3)], PARAMS)[0]
    backend.load_weights({"model.norm.weight": torch.full((3,), 4.0)})
    assert llm.lm.loaded == [["model.norm.weight"]]
    assert llm.resets == 1 and backend.cache_salt == "treeroll-w1"
    llm.blocks.add(("treeroll-w0", prompt[:4]))  # a block a missed reset would have left
    after = backend.generate([GenerationRequest(prompt, seed=3)], PARAMS)[0]
    assert after.cached_tokens == 0 and llm.calls[-1][0][0]["cache_salt"] == "treeroll-w1"
    assert after.logprobs != before.logprobs  # sampled from the new weights


def test_vllm_weight_updates_are_refused_at_start_over_an_engine_in_another_process(
        monkeypatch) -> None:
    """vLLM's default runs the engine in its own process, where ``reload_weights`` fails on
    the tensors it is sent: refused when the backend is made, not at the first update."""
    monkeypatch.delenv(IN_PROCESS)
    llm = FakeLLM()
    with pytest.raises(RuntimeError, match="dtype"):  # the boundary the update would hit
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": []})
    with pytest.raises(ValueError, match=f"another process.*{IN_PROCESS}=0"):
        VLLMBackend(llm, sampling_params=VLLMSamplingParams)
    frozen = VLLMBackend(llm, sampling_params=VLLMSamplingParams, updatable=False)
    assert len(frozen.generate([GenerationRequest((1, 2))], PARAMS)[0].token_ids) >= 1
    with pytest.raises(ValueError, match="updatable=False"):
        frozen.load_weights({})


def test_vllm_block_size_is_read_from_the_engine() -> None:
    backend, _ = _vllm()
    assert backend.block_size == BLOCK


@pytest.mark.parametrize(("params", "says"), [
    (SamplingParams(temperature=2.5, top_logprobs=1), "above vLLM's limit 2"),
    (SamplingParams(top_logprobs=21), "at most max_logprobs = 20"),
])
def test_vllm_limits_are_checked_before_a_call(params, says) -> None:
    backend, llm = _vllm()
    with pytest.raises(ValueError, match=says):
        backend.generate([GenerationRequest((1, 2))], params)
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        backend.generate([GenerationRequest((1, 2), max_new_tokens=0)], PARAMS)
    assert llm.calls == []
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        VLLMSamplingParams(temperature=2.5)  # what vLLM itself would have said, mid-run


def test_vllm_max_logprobs_minus_one_means_the_whole_vocabulary() -> None:
    backend, _ = _vllm(max_logprobs=-1)
    out = backend.generate([GenerationRequest((1, 2), seed=0)], replace(PARAMS,
                                                                        top_logprobs=5))[0]
    assert out.top_logprobs is not None and len(out.top_logprobs[0]) == 5


def test_vllm_an_aborted_request_or_missing_logprobs_is_an_error() -> None:
    backend, llm = _vllm()
    llm.finish = "abort"
    with pytest.raises(RuntimeError, match="'abort'"):
        backend.generate([GenerationRequest((1, 2))], PARAMS)
    llm.finish = None
    output = llm.generate([{"prompt_token_ids": [1], "cache_salt": "x"}],
                          [VLLMSamplingParams(seed=0, max_tokens=2, logprobs=0)])[0]
    output.outputs[0].logprobs = None
    with pytest.raises(RuntimeError, match="is logprobs set"):
        backend.completion(output, GenerationRequest((1,)), PARAMS)
    with pytest.raises(ValueError, match="entropy_window"):
        backend.generate([GenerationRequest((1,))], SamplingParams(entropy_window=5))


# -- SGLang ----------------------------------------------------------------------------------

@pytest.fixture()
def sglang():  # type: ignore[no-untyped-def]
    FakeSGLang.state.reset()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


FULL = replace(PARAMS, top_p=1.0)


def test_sglang_sends_one_batch_of_ids_with_per_request_seeds(sglang) -> None:
    backend = SGLangBackend(sglang)
    outs = backend.generate([GenerationRequest((1, 2, 3), seed=3),
                             GenerationRequest((1, 2, 3, 4), max_new_tokens=1, seed=4)], FULL)
    path, body = FakeSGLang.state.seen[0]
    assert path == "/generate" and body["input_ids"] == [[1, 2, 3], [1, 2, 3, 4]]
    assert body["sampling_params"][0]["top_p"] == 1.0 and "return_sampling_mask" not in body
    assert [sp["sampling_seed"] for sp in body["sampling_params"]] == [3, 4]
    assert [sp["max_new_tokens"] for sp in body["sampling_params"]] == [4, 1]
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 1
    assert body["sampling_params"][0]["stop_token_ids"] == [2]
    assert len(outs[1].token_ids) == 1
    assert (outs[1].prefill_tokens, outs[1].cached_tokens) == (1, 3)


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_sglang_logprobs_are_those_of_the_distribution_each_token_was_drawn_from(
        sglang, top_p) -> None:
    """At top_p 1 SGLang's ``output_token_logprobs`` are the sampling distribution's; below 1
    they are taken before top-p, so treeroll reads ``output_token_sampling_logprobs``."""
    backend = SGLangBackend(sglang)
    params = replace(PARAMS, top_p=top_p, max_new_tokens=6)
    prompt = (3, 9, 4)
    out = backend.generate([GenerationRequest(prompt, seed=11)], params)[0]
    expected = _drawn_from(FakeSGLang.state.lm, prompt, out.token_ids, 0.8, top_p)
    assert out.logprobs == pytest.approx(expected, abs=1e-6)
    assert FakeSGLang.state.seen[-1][1].get("return_sampling_mask", False) is (top_p < 1)


def test_sglang_a_server_without_sampling_logprobs_is_an_error_below_top_p_one(
        sglang) -> None:
    FakeSGLang.state.returns_sampling_logprobs = False
    with pytest.raises(ServerError, match=r"output_token_sampling_logprobs.*top_p = 1"):
        SGLangBackend(sglang).generate([GenerationRequest((1, 2))], PARAMS)
    assert SGLangBackend(sglang).generate([GenerationRequest((1, 2))], FULL)[0].token_ids


def test_sglang_reads_a_position_without_top_logprobs_as_empty(sglang) -> None:
    """SGLang leaves ``None`` for a position that has no top logprobs
    (``detokenize_top_logprobs_tokens``)."""
    answer = {"output_ids": [5, 2], "meta_info": {
        "cached_tokens": 0, "finish_reason": {"type": "stop"},
        "output_token_logprobs": [[-0.5, 5, None], [-0.1, 2, None]],
        "output_top_logprobs": [[[-0.5, 5, None]], None]}}
    out = SGLangBackend(sglang).completion(answer, GenerationRequest((1,)), FULL)
    assert out.top_logprobs == [[(5, -0.5)], []] and out.logprobs == [-0.5, -0.1]


def test_sglang_weight_update_writes_loads_and_flushes(sglang, tiny_model, tmp_path) -> None:
    backend = SGLangBackend(sglang, model=tiny_model, weights_dir=tmp_path)
    backend.generate([GenerationRequest((1, 2, 3))], FULL)
    new = {k: v + 1.0 for k, v in tiny_model.state_dict().items()}
    backend.load_weights(new)
    paths = [p for p, _ in FakeSGLang.state.seen]
    assert paths[-2:] == ["/update_weights_from_disk", "/flush_cache"]
    folder = FakeSGLang.state.seen[-2][1]["model_path"]
    assert folder == str(tmp_path / "v1") and (tmp_path / "v1" / "config.json").is_file()
    assert torch.equal(tiny_model.model.norm.weight, new["model.norm.weight"])
    after = backend.generate([GenerationRequest((1, 2, 3))], FULL)[0]
    assert after.cached_tokens == 0


def test_sglang_errors_name_the_endpoint(sglang) -> None:
    backend = SGLangBackend(sglang)
    FakeSGLang.state.finish_type = "abort"
    with pytest.raises(ServerError, match="/generate finished a request with 'abort'"):
        backend.generate([GenerationRequest((1,))], FULL)
    with pytest.raises(ValueError, match="needs the model"):
        backend.load_weights({})
    with pytest.raises(ServerError, match=r"no answer"):
        SGLangBackend("http://127.0.0.1:9").generate([GenerationRequest((1,))], FULL)


def test_sglang_seeds_a_server_would_ignore_are_refused(sglang) -> None:
    """Without deterministic inference SGLang ignores ``sampling_seed``: the same seeded
    request twice gives different samples, so treeroll refuses the seeds before the first
    call; ``seeded=False`` sends none."""
    FakeSGLang.state.deterministic = False
    unseeded = SGLangBackend(sglang, seeded=False)
    params = replace(FULL, max_new_tokens=8, stop_token_ids=())
    raw = [unseeded.generate([GenerationRequest((1, 2), seed=3)], params)[0].token_ids
           for _ in range(2)]
    assert raw[0] != raw[1]  # what a seed would have promised to be reproducible
    assert all("sampling_seed" not in sp for _, body in FakeSGLang.state.seen
               for sp in body.get("sampling_params", []))
    with pytest.raises(ValueError, match=r"ignores sampling_seed.*deterministic-inference"):
        SGLangBackend(sglang).generate([GenerationRequest((1, 2), seed=3)], params)
    FakeSGLang.state.deterministic = True
    backend = SGLangBackend(sglang)
    twice = [backend.generate([GenerationRequest((1, 2), seed=3)], params)[0].token_ids
             for _ in range(2)]
    assert twice[0] == twice[1]


def test_sglang_server_info_falls_back_to_the_deprecated_endpoint(sglang) -> None:
    assert SGLangBackend(sglang).server_info()["version"] == "0.5.23"
    FakeSGLang.state.has_server_info = False  # an older server: /get_server_info only
    backend = SGLangBackend(sglang)
    assert backend.server_info()["enable_deterministic_inference"] is True
    assert backend.generate([GenerationRequest((1, 2), seed=3)], FULL)[0].token_ids


def test_sglang_requests_pass_sglangs_own_checks_and_bad_ones_are_refused_first(
        sglang) -> None:
    backend = SGLangBackend(sglang)
    for params in (FULL, replace(FULL, temperature=0.0), replace(FULL, temperature=3.0),
                   replace(PARAMS, top_p=0.5)):
        assert backend.generate([GenerationRequest((1, 2), seed=1)], params)[0].token_ids
    with pytest.raises(ValueError, match="max_new_tokens -1: SGLang needs >= 0"):
        backend.generate([GenerationRequest((1, 2), max_new_tokens=-1)], FULL)
    calls = len(FakeSGLang.state.seen)
    with pytest.raises(ServerError, match=r"HTTP 400.*Unexpected keyword"):
        from treeroll.backends.http import post_json

        post_json(sglang + "/generate", {"input_ids": [[1]], "sampling_params": [
            {"max_tokens": 3}]})
    assert len(FakeSGLang.state.seen) == calls + 1
