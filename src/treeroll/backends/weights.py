"""The one rule every backend that holds the policy's model follows on a weight update, and
where a model's inputs go (its parameters' device)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from treeroll.causal_lm import CausalLM

__all__ = ["model_device", "take_weights"]


def take_weights(model: CausalLM, state_dict: Mapping[str, Any]) -> bool:
    """Copy ``state_dict`` into ``model`` unless every tensor in it already is the model's
    own (the trainer updated this very model in place: nothing to copy); returns whether it
    copied."""
    own = model.state_dict()
    if all(k in own and v.data_ptr() == own[k].data_ptr() for k, v in state_dict.items()):
        return False
    model.load_state_dict(state_dict)
    return True


def model_device(model: CausalLM) -> torch.device:
    """The device of ``model``'s parameters: where inputs built on the CPU are moved (the
    HF backend's batches, the training losses' ids and per-token data)."""
    return next(model.parameters()).device
