"""Write a treeroll policy (a transformers Llama) as a GGUF file that llama.cpp serves.

llama.cpp's own ``convert_hf_to_gguf.py`` reads a model's vocabulary through the tokenizer
families it recognises (SentencePiece, or a byte-level BPE whose pre-tokenizer hash it knows),
and refuses the word-level ``tokenizers`` vocabulary treeroll's embedded policies use. The
tensors are what it would write (its ``LlamaModel`` mapping, including the rotary
permutation of the query and key projections); the vocabulary is written as a byte-level
BPE with no merges: every token is one whole vocabulary entry, spelled in GPT-2's byte
alphabet, so the server's detokenised text is the tokenizer's own (llama.cpp insists on at
least one merge: one that splits a real token in two is written). treeroll talks to the
server in token ids only (``prompt`` as ids, ``return_tokens``), so the server never has to
tokenise text with this vocabulary.

The writer is llama.cpp's ``gguf`` package: the installed one, or the copy in the llama.cpp
source tree the server was built from (:func:`treeroll.backends.llamacpp.source_dir`), which
writes the format version that server reads.
"""

from __future__ import annotations

import importlib
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from treeroll.causal_lm import CausalLM

__all__ = ["byte_alphabet", "export_gguf", "load_gguf_module"]


def load_gguf_module(source: Path | None = None) -> Any:
    """llama.cpp's ``gguf`` writer: the installed package, else ``source/gguf-py``."""
    try:
        return importlib.import_module("gguf")
    except ImportError:
        if source is None or not (source / "gguf-py" / "gguf").is_dir():
            raise ImportError("writing GGUF needs llama.cpp's `gguf` package: pip install gguf, "
                              "or pass the llama.cpp source tree (its gguf-py)") from None
        sys.path.insert(0, str(source / "gguf-py"))
        return importlib.import_module("gguf")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (what byte-level BPE vocabularies
    in GGUF are spelled in; llama.cpp maps them back when it detokenises)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _permute(weight: Any, heads: int) -> Any:
    """llama.cpp's rotary layout of a query or key projection (``convert_hf_to_gguf``'s
    ``LlamaModel.permute``): HF rotates halves, llama.cpp adjacent pairs."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _tensors(model: CausalLM) -> dict[str, Any]:
    """GGUF tensor name -> float32 array, for a ``LlamaForCausalLM``."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    out: dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().to("cpu").float().numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = array
        elif name == "model.norm.weight":
            out["output_norm.weight"] = array
        elif name == "lm_head.weight":
            if not config.tie_word_embeddings:
                out["output.weight"] = array
        elif name.startswith("model.layers.") and name.endswith(".weight"):
            layer, rest = name[len("model.layers."):-len(".weight")].split(".", 1)
            if rest not in _LAYER_NAMES:
                raise ValueError(f"export_gguf: no GGUF name for {name}")
            if rest == "self_attn.q_proj":
                array = _permute(array, heads)
            elif rest == "self_attn.k_proj":
                array = _permute(array, kv_heads)
            out[f"blk.{layer}.{_LAYER_NAMES[rest]}.weight"] = array
        elif not name.endswith("rotary_emb.inv_freq"):
            raise ValueError(f"export_gguf: no GGUF name for {name}")
    return out


def export_gguf(model: CausalLM, tokenizer: Any, path: str | Path, *,
                gguf_source: Path | None = None, name: str = "treeroll-policy") -> Path:
    """Write ``model`` (a transformers ``LlamaForCausalLM``) and ``tokenizer``'s vocabulary
    as a float32 GGUF file at ``path``; return the path.

    The tokenizer's ``eos_token_id`` is the file's end-of-generation token (the server stops
    on it), its special tokens are control tokens, and no BOS is added (treeroll sends ids).
    """
    config = model.config
    if getattr(config, "model_type", None) != "llama":
        raise ValueError(f"export_gguf writes Llama models; this one is "
                         f"{getattr(config, 'model_type', type(model).__name__)!r}")
    if getattr(config, "rope_scaling", None) and config.rope_scaling.get("rope_type",
                                                                          "default") != "default":
        raise ValueError(f"export_gguf: rope scaling {config.rope_scaling} is not supported")
    gguf = load_gguf_module(gguf_source)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // \
        config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta",
                                                                    10000.0))))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _write_vocab(writer, gguf, tokenizer, config.vocab_size)
    for tensor_name, array in _tensors(model).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_vocab(writer: Any, gguf: Any, tokenizer: Any, vocab_size: int) -> None:
    """The tokenizer's ids as a byte-level BPE vocabulary without merges (see the module
    docstring); ids the tokenizer lacks up to the model's vocabulary size are unused."""
    alphabet = byte_alphabet()
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = set(getattr(tokenizer, "all_special_ids", ()))
    tokens, types = [], []
    for i in range(vocab_size):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[UNUSED_{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        if i in special:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append("".join(alphabet[b] for b in text.encode("utf-8")))
            types.append(gguf.TokenType.NORMAL)
    if len(set(tokens)) != len(tokens):
        raise ValueError("export_gguf: two token ids spell the same text; llama.cpp needs "
                         "distinct tokens")
    writer.add_vocab_size(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # llama.cpp refuses a byte-level BPE without merges, and the writer drops an empty list:
    # one merge, splitting a real token in two, satisfies it (text is never tokenised here).
    word = next((t for t, k in zip(tokens, types, strict=True)
                 if k == gguf.TokenType.NORMAL and len(t) > 1), "ĠĠ")
    writer.add_token_merges([f"{word[0]} {word[1:]}"])
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("export_gguf: the tokenizer has no eos_token_id")
    writer.add_eos_token_id(int(eos))
    for add, token_id in ((writer.add_pad_token_id, tokenizer.pad_token_id),
                          (writer.add_unk_token_id, getattr(tokenizer, "unk_token_id", None)),
                          (writer.add_bos_token_id, tokenizer.bos_token_id)):
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(False)
