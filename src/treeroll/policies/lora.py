"""LoRA adapters through ``peft``: train a small adapter over a named base, ship the adapter.

A policy folder may hold a LoRA adapter instead of a whole model: ``adapter_config.json`` and
``adapter_model.safetensors`` (``peft``'s own files) beside ``treeroll.json``, whose ``base``
names the policy the adapter was trained over (a shipped or registry name, or a folder).
Loading such a folder loads the base, applies the adapter and merges it into the weights
(``merge_and_unload``), so every backend and trainer sees a plain transformers model; the
tokenizer is the base's. A shipped adapter over the registry's SmolLM2 weighs megabytes where
the model weighs half a gigabyte (``smollm2-frozenlake``).

``peft`` injects its layers into the model in place: the wrapped model object keeps working
everywhere (the backends, the packed update, ``head_at``), with only the adapter's
parameters trainable. treeroll's SFT trains adapters; its RL trains the merged weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from treeroll.causal_lm import CausalLM
from treeroll.checks import checked

__all__ = ["ADAPTER_FILES", "LoraSettings", "add_lora", "is_adapter_folder", "merge_adapter",
           "save_adapter", "weights_fingerprint"]

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files of an adapter policy folder besides ``treeroll.json`` (``peft``'s names)."""

_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraSettings:
    """``policy.lora``: train a LoRA adapter (``peft``) instead of every weight."""

    rank: int = checked(0, ge=0)
    """The adapter's rank; 0 trains every weight (no adapter)."""
    alpha: float = checked(16.0, gt=0)
    """LoRA's scale numerator: the update is ``alpha / rank * B @ A``."""
    dropout: float = checked(0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training."""
    targets: tuple[str, ...] = _LINEAR
    """Names of the linear modules that get an adapter (Llama's attention and MLP)."""


def _peft() -> Any:
    try:
        import peft
    except ImportError as error:
        raise ImportError("LoRA adapters need peft: pip install 'peft>=0.21,<0.22' (a treeroll "
                          "dependency; is this an old environment?)") from error
    return peft


def add_lora(model: CausalLM, settings: LoraSettings) -> Any:
    """Inject a fresh adapter into ``model`` in place (only its parameters stay trainable)
    and return the ``peft`` wrapper, which :func:`save_adapter` writes; ``model`` itself
    keeps working as before. Refused, naming them, when a target matches no module."""
    peft = _peft()
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings.targets if t not in names]
    if missing:
        raise ValueError(f"policy.lora.targets: {missing} match no module of "
                         f"{type(model).__name__}; valid names include "
                         f"{sorted(n for n in names if n.endswith('proj'))}")
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha,
                             lora_dropout=settings.dropout, target_modules=list(settings.targets),
                             bias="none", task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def save_adapter(wrapped: Any, path: Path, base: str) -> None:
    """Write the adapter of ``wrapped`` (from :func:`add_lora`) into ``path``, naming
    ``base`` as the model it adapts."""
    wrapped.peft_config["default"].base_model_name_or_path = base
    # no embedding layers in the adapter, and no lookup of the base on a hub to check that
    wrapped.save_pretrained(path, safe_serialization=True, save_embedding_layers=False)


def is_adapter_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an adapter (``adapter_config.json``) rather than a model."""
    return (folder / "adapter_config.json").is_file()


def merge_adapter(model: CausalLM, folder: Path) -> Any:
    """``model`` with the adapter in ``folder`` applied and merged into its weights (a plain
    transformers model again, the adapter's parameters gone)."""
    peft = _peft()
    missing = [name for name in ADAPTER_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"policy folder {folder}: the adapter lacks {missing}")
    merged = peft.PeftModel.from_pretrained(model, folder).merge_and_unload()
    return merged.requires_grad_(True)  # peft froze the base: trainable again, as loaded


def weights_fingerprint(model: CausalLM) -> str:
    """A SHA-256 of ``model``'s weights (every state-dict entry's name, dtype, shape and
    values, in name order): an adapter records its base's, so that loading it over another
    model of the same shape (another version of the base) is refused instead of merging into
    the wrong weights. It reads the values, not a file, so it does not depend on how the base
    was saved (~1 s for SmolLM2-135M here)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()
