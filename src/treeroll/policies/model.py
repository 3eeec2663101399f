"""Policies that exist without a model hub: a word-level tokenizer and a small Llama.

The embedded default policy is built here from a config: a ``tokenizers`` word-level
tokenizer whose vocabulary is collected from the environment's own texts, and a small
``LlamaForCausalLM`` initialised from scratch. Nothing is downloaded. Users with a real model
pass a local directory instead (:func:`load_policy_files`; :mod:`treeroll.policies` adds
shipped policies and observation views on top), loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["ModelConfig", "build_model", "build_word_tokenizer", "load_policy_files"]

SPECIAL_TOKENS = ("<pad>", "<unk>", "<eos>", "<bos>")
WORD_PATTERN = (r"<think>|</think>|<answer>|</answer>|\|\||```|\n"
                r"|[A-Z][a-z]+|[a-z]+|[A-Z]|[0-9]|[^\sA-Za-z0-9]")
"""How the word-level tokenizer cuts text: the reply-format tags, triple backticks and ``||``
whole, newlines (the grid's rows), words, single digits, single symbols; other spaces dropped."""


def build_word_tokenizer(texts: Iterable[str], min_count: int = 1,
                         extra_pattern: str | None = None) -> Any:
    """A ``PreTrainedTokenizerFast`` with a word vocabulary covering ``texts``.

    Words are ``WORD_PATTERN`` pieces (``extra_pattern``, if given, is tried first, e.g. the
    cell words of :mod:`treeroll.views`); spaces are dropped (decoding joins pieces with one
    space, which every parser in treeroll accepts). Unknown words map to ``<unk>``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    word_pattern = f"{extra_pattern}|{WORD_PATTERN}" if extra_pattern else WORD_PATTERN
    pattern = re.compile(word_pattern)
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(pattern.findall(text))
    words = sorted(w for w, c in counts.items() if c >= min_count)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    for digit in "0123456789":
        vocab.setdefault(digit, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[ \t\r]+"), behavior="removed"),
        pre_tokenizers.Split(Regex(word_pattern), behavior="isolated"),
    ])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins pieces with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>", bos_token="<bos>")
    return fast


@dataclass(frozen=True)
class ModelConfig:
    """A small Llama built from scratch (the embedded default policy)."""

    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (``hidden_size`` must be divisible by it)."""
    intermediate_size: int = 256
    """MLP width."""
    max_positions: int = 4096
    """Longest context the rotary embedding is set up for."""
    seed: int = 0
    """Initialisation seed."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size ({self.hidden_size}) must be divisible by "
                             f"model.num_heads ({self.num_heads})")
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"model.seed must be >= 0, got {self.seed}")


def build_model(vocab_size: int, config: ModelConfig, pad_token_id: int = 0,
                eos_token_id: int = 2) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` (float32; transformers' default SDPA
    attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    llama = LlamaConfig(
        vocab_size=vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions, pad_token_id=pad_token_id,
        eos_token_id=eos_token_id, bos_token_id=None, tie_word_embeddings=True)
    return LlamaForCausalLM(llama)


def load_policy_files(path: str | Path) -> tuple[Any, Any]:
    """Load a model and tokenizer from a local directory (never from a hub)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"no model directory at {path}: pass a local folder written by save_pretrained "
            "(treeroll never downloads weights)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                 dtype=torch.float32)
    return model, tokenizer
