"""The output head at the positions that need it: logits only where a token is predicted.

A causal LM's forward computes logits over the whole vocabulary at every position; a
trainer needs them only where its loss reads them (the model's own tokens: about one position
in six of a FrozenLake context). For a 49k-word vocabulary the head and the softmax at every
position were most of the time and memory of a training forward. transformers' own
``logits_to_keep`` selects positions shared by every row, not a ragged set per row, so
treeroll gathers the hidden states the head is given with a forward pre-hook on the model's
output embeddings: whatever the model does after its head (a logit soft-cap) still applies,
and tied weights stay one parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from treeroll.causal_lm import CausalLM

__all__ = ["HeadReshaped", "check_logits", "head_at", "head_at_works"]


class HeadReshaped(RuntimeError):
    """The model reshaped its head's output, so logits at chosen positions cannot be had."""


@contextmanager
def head_at(model: CausalLM, rows: torch.Tensor, cols: torch.Tensor) -> Iterator[None]:
    """Within the block, ``model(...)``'s head runs only on ``hidden[rows, cols]``: its
    ``logits`` come out ``[len(rows), vocab]`` (check with :func:`check_logits`)."""
    head = model.get_output_embeddings()
    hook = head.register_forward_pre_hook(
        lambda module, args: (args[0][rows, cols], *args[1:]))
    try:
        yield
    finally:
        hook.remove()


def check_logits(model: CausalLM, logits: torch.Tensor, count: int) -> None:
    """Raise :class:`HeadReshaped` unless ``logits`` is ``[count, vocab]``."""
    if logits.dim() != 2 or logits.shape[0] != count:
        raise HeadReshaped(f"{type(model).__name__} reshaped its head's output "
                           f"({tuple(logits.shape)}), so its logits cannot be computed at the "
                           "predicted positions alone")


def head_at_works(model: CausalLM) -> bool:
    """Whether :func:`head_at` gives ``model`` logits at chosen positions: one forward of two
    tokens, without a cache, selecting one position. False for a model without a separate
    head, or one that reshapes (or fails on) its head's output; callers then compute every
    position's logits, as before."""
    if getattr(model, "get_output_embeddings", lambda: None)() is None:
        return False
    device = next(model.parameters()).device
    one = torch.zeros(1, dtype=torch.long, device=device)
    try:
        with torch.no_grad(), head_at(model, one, one + 1):
            logits = model(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device),
                           use_cache=False).logits
        check_logits(model, logits, 1)
    except torch.cuda.OutOfMemoryError:
        raise  # not an answer about the head
    except (HeadReshaped, RuntimeError, IndexError, ValueError):
        return False
    return True
