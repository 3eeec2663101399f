"""The vLLM and SGLang backends at their API boundaries, on CPU: a fake ``vllm.LLM`` with
vLLM's output shapes and a block prefix cache salted like vLLM's, and a fake SGLang HTTP
server answering ``/generate`` in SGLang's shape. What is checked is treeroll's side: the
requests it builds, how it reads answers and counts cached tokens, weight updates (a new
salt, a reset, the weights handed over), and clear errors on malformed answers."""

from __future__ import annotations

import json
import os
import pickle
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from treeroll.backends.http import ServerError
from treeroll.backends.sglang import SGLangBackend
from treeroll.backends.vllm import IN_PROCESS, VLLMBackend
from treeroll.base import GenerationRequest, SamplingParams

PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=4, stop_token_ids=(2,),
                        top_logprobs=1)
BLOCK = 4


class FakeLLM:
    """``vllm.LLM``'s generate / reset_prefix_cache / apply_model, with a prefix cache of
    full ``BLOCK``-token blocks keyed by (salt, prefix), as vLLM's hashes chain them."""

    def __init__(self, logprobs_mode: str = "processed_logprobs") -> None:
        self.model_config = SimpleNamespace(logprobs_mode=logprobs_mode, max_logprobs=20)
        self.blocks: set[tuple[str, tuple[int, ...]]] = set()
        self.calls: list[tuple[list[dict], list[dict]]] = []
        self.loaded: list[list[tuple[str, torch.Tensor]]] = []
        self.model = SimpleNamespace(load_weights=self.loaded.append)
        self.resets = 0
        self.finish = "stop"

    def generate(self, prompts, sampling_params, use_tqdm=True):  # type: ignore[no-untyped-def]
        self.calls.append((prompts, sampling_params))
        outs = []
        for prompt, sp in zip(prompts, sampling_params, strict=True):
            ids, salt = tuple(prompt["prompt_token_ids"]), prompt["cache_salt"]
            hit = 0
            while hit + BLOCK <= len(ids) - 1 and (salt, ids[:hit + BLOCK]) in self.blocks:
                hit += BLOCK
            for end in range(BLOCK, len(ids) + 1, BLOCK):
                self.blocks.add((salt, ids[:end]))
            tokens = [5 + (sp["seed"] or 0) % 7, 2][:sp["max_tokens"]]
            logprobs = [{t: SimpleNamespace(logprob=-0.5), 9: SimpleNamespace(logprob=-3.0)}
                        for t in tokens]
            outs.append(SimpleNamespace(num_cached_tokens=hit, outputs=[SimpleNamespace(
                token_ids=tokens, logprobs=logprobs, finish_reason=self.finish)]))
        return outs

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        self.blocks.clear()
        return True

    def apply_model(self, fn):  # type: ignore[no-untyped-def]
        """vLLM's ``collective_rpc``: into the engine's own process by default, through a
        serializer that refuses functions (``pickle`` refuses lambdas and closures too)."""
        if os.environ.get(IN_PROCESS, "1") != "0":
            pickle.dumps(fn)
        return [fn(self.model)]


@pytest.fixture(autouse=True)
def _vllm_in_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """As :func:`treeroll.backends.vllm.make_llm` leaves it: the engine in this process."""
    monkeypatch.setenv(IN_PROCESS, "0")


def _vllm() -> tuple[VLLMBackend, FakeLLM]:
    llm = FakeLLM()
    return VLLMBackend(llm, sampling_params=lambda **kw: kw), llm


def test_vllm_requests_carry_ids_a_salt_a_seed_and_the_stop_ids() -> None:
    backend, llm = _vllm()
    backend.generate([GenerationRequest((1, 2, 3), max_new_tokens=2, seed=2**64 + 3)], PARAMS)
    (prompt,), (sp,) = llm.calls[0]
    assert prompt == {"prompt_token_ids": [1, 2, 3], "cache_salt": "treeroll-w0"}
    assert sp["seed"] == (2**64 + 3) % 2**63 and sp["max_tokens"] == 2
    assert (sp["temperature"], sp["top_p"], sp["logprobs"]) == (0.8, 0.95, 1)
    assert sp["stop_token_ids"] == [2] and sp["detokenize"] is False and sp["n"] == 1


def test_vllm_cached_tokens_come_from_num_cached_tokens() -> None:
    backend, _ = _vllm()
    prompt = tuple(range(10, 23))  # 13 tokens: 3 full blocks
    first = backend.generate([GenerationRequest(prompt, seed=1)], PARAMS)[0]
    again = backend.generate([GenerationRequest(prompt + (7,), seed=1)], PARAMS)[0]
    assert (first.prefill_tokens, first.cached_tokens) == (13, 0)
    assert (again.prefill_tokens, again.cached_tokens) == (2, 12)
    assert again.token_ids == [6, 2] and again.logprobs == [-0.5, -0.5]
    assert again.top_logprobs == [[(6, -0.5)], [(2, -0.5)]]


def test_vllm_weight_update_hands_the_weights_over_and_nothing_old_is_hit() -> None:
    backend, llm = _vllm()
    prompt = tuple(range(10, 30))
    backend.generate([GenerationRequest(prompt)], PARAMS)
    weights = {"model.norm.weight": torch.ones(3)}
    backend.load_weights(weights)
    assert [name for name, _ in llm.loaded[0]] == ["model.norm.weight"]
    assert llm.resets == 1 and backend.cache_salt == "treeroll-w1"
    llm.blocks.add(("treeroll-w0", prompt[:4]))  # a block a missed reset would have left
    after = backend.generate([GenerationRequest(prompt)], PARAMS)[0]
    assert after.cached_tokens == 0 and llm.calls[-1][0][0]["cache_salt"] == "treeroll-w1"


def test_vllm_an_aborted_request_or_missing_logprobs_is_an_error() -> None:
    backend, llm = _vllm()
    llm.finish = "abort"
    with pytest.raises(RuntimeError, match="'abort'"):
        backend.generate([GenerationRequest((1, 2))], PARAMS)
    llm.finish = "stop"
    output = llm.generate([{"prompt_token_ids": [1], "cache_salt": "x"}],
                          [{"seed": 0, "max_tokens": 2}])[0]
    output.outputs[0].logprobs = None
    with pytest.raises(RuntimeError, match="is logprobs set"):
        backend.completion(output, GenerationRequest((1,)), PARAMS)
    with pytest.raises(ValueError, match="entropy_window"):
        backend.generate([GenerationRequest((1,))], SamplingParams(entropy_window=5))


class FakeSGLang(BaseHTTPRequestHandler):
    """``/generate``, ``/flush_cache`` and ``/update_weights_from_disk`` in SGLang's shapes;
    a radix cache of exact prefixes; every body received is kept in ``seen``."""

    seen: ClassVar[list[tuple[str, dict]]] = []
    cache: ClassVar[set[tuple[int, ...]]] = set()
    finish_type = "stop"
    deterministic = True
    """``--enable-deterministic-inference``: without it the server ignores ``sampling_seed``
    (its sampler draws from its own generator), as SGLang 0.5.23 does."""
    draws = 0

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/get_server_info":
            info = {"enable_deterministic_inference": FakeSGLang.deterministic}
            return self._send(json.dumps(info).encode())
        self.send_error(404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        FakeSGLang.seen.append((self.path, body))
        if self.path == "/flush_cache":
            FakeSGLang.cache.clear()
            return self._send(b"Cache flushed.\n", "text/plain")
        if self.path == "/update_weights_from_disk":
            return self._send(json.dumps({"success": True, "message": "ok"}).encode())
        answers = []
        for ids, sp in zip(body["input_ids"], body["sampling_params"], strict=True):
            hit = max((n for n in range(len(ids)) if tuple(ids[:n]) in FakeSGLang.cache),
                      default=0)
            FakeSGLang.cache.update(tuple(ids[:n]) for n in range(1, len(ids) + 1))
            FakeSGLang.draws += 1
            seed = sp.get("sampling_seed", 0) if FakeSGLang.deterministic else FakeSGLang.draws
            out = [5 + seed % 7, 2][:sp["max_new_tokens"]]
            answers.append({"output_ids": out, "meta_info": {
                "prompt_tokens": len(ids), "cached_tokens": hit,
                "finish_reason": {"type": FakeSGLang.finish_type},
                "output_token_logprobs": [[-0.25, t, None] for t in out],
                # SGLang leaves None where a position has no top logprobs
                "output_top_logprobs": [[[-0.25, t, None], None] for t in out]}})
        self._send(json.dumps(answers).encode())

    def _send(self, data: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def sglang():  # type: ignore[no-untyped-def]
    FakeSGLang.seen, FakeSGLang.cache, FakeSGLang.finish_type = [], set(), "stop"
    FakeSGLang.deterministic, FakeSGLang.draws = True, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


SGLANG_PARAMS = replace(PARAMS, top_p=1.0)
"""SGLang's logprobs are before top-p: its backend samples with top_p = 1."""


def test_sglang_sends_one_batch_of_ids_with_per_request_seeds(sglang) -> None:
    backend = SGLangBackend(sglang)
    outs = backend.generate([GenerationRequest((1, 2, 3), seed=3),
                             GenerationRequest((1, 2, 3, 4), max_new_tokens=1, seed=4)],
                            SGLANG_PARAMS)
    path, body = FakeSGLang.seen[0]
    assert path == "/generate" and body["input_ids"] == [[1, 2, 3], [1, 2, 3, 4]]
    assert body["sampling_params"][0]["top_p"] == 1.0
    assert [sp["sampling_seed"] for sp in body["sampling_params"]] == [3, 4]
    assert [sp["max_new_tokens"] for sp in body["sampling_params"]] == [4, 1]
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 1
    assert body["sampling_params"][0]["stop_token_ids"] == [2]
    assert outs[0].token_ids == [8, 2] and outs[1].token_ids == [9]
    assert outs[0].logprobs == [-0.25, -0.25] and outs[0].top_logprobs == [[(8, -0.25)],
                                                                           [(2, -0.25)]]
    assert (outs[1].prefill_tokens, outs[1].cached_tokens) == (1, 3)


def test_sglang_weight_update_writes_loads_and_flushes(sglang, tiny_model, tmp_path) -> None:
    backend = SGLangBackend(sglang, model=tiny_model, weights_dir=tmp_path)
    backend.generate([GenerationRequest((1, 2, 3))], SGLANG_PARAMS)
    new = {k: v + 1.0 for k, v in tiny_model.state_dict().items()}
    backend.load_weights(new)
    paths = [p for p, _ in FakeSGLang.seen]
    assert paths[-2:] == ["/update_weights_from_disk", "/flush_cache"]
    folder = FakeSGLang.seen[-2][1]["model_path"]
    assert folder == str(tmp_path / "v1") and (tmp_path / "v1" / "config.json").is_file()
    assert torch.equal(tiny_model.model.norm.weight, new["model.norm.weight"])
    after = backend.generate([GenerationRequest((1, 2, 3))], SGLANG_PARAMS)[0]
    assert after.cached_tokens == 0


def test_sglang_errors_name_the_endpoint(sglang) -> None:
    backend = SGLangBackend(sglang)
    FakeSGLang.finish_type = "abort"
    with pytest.raises(ServerError, match="/generate finished a request with 'abort'"):
        backend.generate([GenerationRequest((1,))], SGLANG_PARAMS)
    with pytest.raises(ValueError, match="needs the model"):
        backend.load_weights({})
    with pytest.raises(ServerError, match=r"no answer"):
        SGLangBackend("http://127.0.0.1:9").generate([GenerationRequest((1,))], SGLANG_PARAMS)


def test_vllm_weight_updates_are_refused_at_start_over_an_engine_in_another_process(
        monkeypatch) -> None:
    """vLLM's default runs the engine in its own process, where ``apply_model`` cannot carry
    the update (the fake pickles the function as vLLM's serializer would): refused when the
    backend is made, not at the first update."""
    monkeypatch.delenv(IN_PROCESS)
    llm = FakeLLM()
    with pytest.raises((AttributeError, pickle.PicklingError)):
        llm.apply_model(lambda model: model)  # the boundary the old code hit at its update
    with pytest.raises(ValueError, match=f"another process.*{IN_PROCESS}=0"):
        VLLMBackend(llm, sampling_params=lambda **kw: kw)
    frozen = VLLMBackend(llm, sampling_params=lambda **kw: kw, updatable=False)
    assert frozen.generate([GenerationRequest((1, 2))], PARAMS)[0].token_ids == [5, 2]
    with pytest.raises(ValueError, match="updatable=False"):
        frozen.load_weights({})


def test_vllm_an_llm_returning_raw_logprobs_is_refused() -> None:
    with pytest.raises(ValueError, match=r"raw_logprobs.*processed_logprobs"):
        VLLMBackend(FakeLLM(logprobs_mode="raw_logprobs"), sampling_params=lambda **kw: kw)


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


def test_sglang_seeds_a_server_would_ignore_are_refused(sglang) -> None:
    """Without deterministic inference SGLang ignores ``sampling_seed``: the same seeded
    request twice gives different samples (as the fake shows), so treeroll refuses the seeds
    before the first call; ``seeded=False`` sends none."""
    FakeSGLang.deterministic = False
    unseeded = SGLangBackend(sglang, seeded=False)
    raw = [unseeded.generate([GenerationRequest((1, 2), seed=3)], SGLANG_PARAMS)[0].token_ids
           for _ in range(2)]
    assert raw[0] != raw[1]  # what the old code promised to be reproducible
    assert all("sampling_seed" not in sp for _, body in FakeSGLang.seen
               for sp in body.get("sampling_params", []))
    with pytest.raises(ValueError, match=r"ignores sampling_seed.*deterministic-inference"):
        SGLangBackend(sglang).generate([GenerationRequest((1, 2), seed=3)], SGLANG_PARAMS)
    FakeSGLang.deterministic = True
    backend = SGLangBackend(sglang)
    twice = [backend.generate([GenerationRequest((1, 2), seed=3)], SGLANG_PARAMS)[0].token_ids
             for _ in range(2)]
    assert twice[0] == twice[1]


def test_sglang_refuses_top_p_below_one_and_reads_none_top_logprobs(sglang) -> None:
    with pytest.raises(ValueError, match="before top-p"):
        SGLangBackend(sglang).generate([GenerationRequest((1, 2))], PARAMS)
    out = SGLangBackend(sglang).generate([GenerationRequest((1, 2))], SGLANG_PARAMS)[0]
    assert out.top_logprobs == [[(5, -0.25)], [(2, -0.25)]]  # the None entries skipped
