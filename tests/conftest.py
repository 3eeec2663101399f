"""Shared fixtures: a tiny policy on FrozenLake and a scripted fake backend."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.envs import make_frozenlake
from treeroll.formatting import ByteTokenizer, TurnFormat
from treeroll.policies.model import ModelConfig, build_model, build_word_tokenizer

torch.set_num_threads(1)

TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)


@pytest.fixture(scope="session")
def word_tokenizer():  # type: ignore[no-untyped-def]
    """The word-level tokenizer of the rLLM FrozenLake texts."""
    return build_word_tokenizer(make_frozenlake("rllm").vocabulary_texts())


@pytest.fixture()
def tiny_model(word_tokenizer):  # type: ignore[no-untyped-def]
    """A freshly initialised tiny Llama over the word vocabulary."""
    return build_model(len(word_tokenizer), TINY, pad_token_id=word_tokenizer.pad_token_id,
                       eos_token_id=word_tokenizer.eos_token_id).eval()


class ScriptedBackend:
    """A fake backend: replies cycle through ``replies`` (byte tokens), seeded choice if asked."""

    def __init__(self, replies: Sequence[str], choose_by_seed: bool = False) -> None:
        self.tokenizer = ByteTokenizer()
        self.replies = list(replies)
        self.choose_by_seed = choose_by_seed
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        out = []
        for request in requests:
            if self.choose_by_seed:
                index = (request.seed or 0) % len(self.replies)
            else:
                index = self.calls % len(self.replies)
            self.calls += 1
            ids = self.tokenizer.encode(self.replies[index]) + [ByteTokenizer.eos_token_id]
            cap = request.max_new_tokens or params.max_new_tokens
            ids = ids[: min(cap, params.max_new_tokens)]
            finish = "stop" if ids[-1] == ByteTokenizer.eos_token_id else "length"
            out.append(Completion(token_ids=ids, logprobs=[-0.5] * len(ids),
                                  finish_reason=finish, prefill_tokens=len(request.prompt_ids)))
        return out

    def reset_cache(self) -> None:
        pass


@pytest.fixture()
def byte_format() -> TurnFormat:
    """Turn format over raw bytes (for scripted backends)."""
    return TurnFormat(ByteTokenizer())
