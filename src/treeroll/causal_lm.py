"""What treeroll uses of a language model and of a policy, as types the checker can follow.

A policy's model is a third party's object: transformers' ``LlamaForCausalLM`` (treeroll's own
small model is one), any ``AutoModelForCausalLM``, or a ``peft`` wrapper of one. treeroll does
not own their classes, so it names what it calls on them: :class:`CausalLM` is that surface,
checked structurally (every ``torch.nn.Module`` with transformers' causal-LM methods has it),
and :class:`PolicyParts` is what a backend builder reads of a policy (the full record is
:class:`treeroll.policies.Policy`, a layer up, which has both).

The model's ``config`` stays ``Any``: its fields differ by architecture (``num_hidden_layers``,
``text_config``, ...) and treeroll reads them by name where it needs them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["CausalLM", "PolicyParts", "cache_argument", "cache_keyword"]


class CausalLM(Protocol):
    """A causal language model as treeroll calls it: ``model(input_ids=..., ...)`` returns an
    output with ``.logits`` (and ``.past_key_values`` when asked), and the ``torch.nn.Module``
    methods a trainer and a backend use."""

    config: Any
    """transformers' model config (fields by architecture: read by name)."""
    training: bool

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The forward pass (transformers' keyword arguments)."""
        ...

    def parameters(self, recurse: bool = ...) -> Iterator[torch.nn.Parameter]:
        """Its parameters."""
        ...

    def named_parameters(self, prefix: str = ..., recurse: bool = ...,
                         remove_duplicate: bool = ...) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Its parameters with their names."""
        ...

    def named_modules(self, memo: set[torch.nn.Module] | None = ..., prefix: str = ...,
                      remove_duplicate: bool = ...) -> Iterator[tuple[str, torch.nn.Module]]:
        """Its modules with their names."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Its weights by name."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = ...,
                        assign: bool = ...) -> Any:
        """Copy weights into it."""
        ...

    def train(self, mode: bool = ...) -> Any:
        """Training mode (dropout on, if it has any)."""
        ...

    def eval(self) -> Any:
        """Evaluation mode."""
        ...

    def get_input_embeddings(self) -> Any:
        """Its token embedding module."""
        ...

    def get_output_embeddings(self) -> Any:
        """Its output head (None for a model without a separate one)."""
        ...

    def save_pretrained(self, save_directory: Any, **kwargs: Any) -> Any:
        """Write it to a folder (transformers' layout; a ``peft`` model its adapter)."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """Its parameters' type."""
        ...


class PolicyParts(Protocol):
    """What a backend is built from: the policy's model and its tokenizer (a transformers
    tokenizer, or treeroll's word tokenizer)."""

    @property
    def model(self) -> CausalLM:
        """The model that decodes."""
        ...

    @property
    def tokenizer(self) -> Any:
        """Its tokenizer (``pad_token_id``, ``eos_token_id``, ``len()``, ``save_pretrained``)."""
        ...


def cache_keyword(model: Any) -> str | None:  # Any: a model or anything else (it says None)
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` (transformers' name
    since 5.20) or ``past_key_values`` (earlier, and in the 5.19 that vLLM's CPU build pins,
    where an unknown ``cache=`` would be swallowed by ``**kwargs`` and the cache silently
    ignored); None when its forward names neither (a wrapper taking ``**kwargs``). Read once
    per class: every forward call asks."""
    kind: type = type(model)
    return _cache_keyword_of(kind)


def cache_argument(model: Any) -> str:  # Any: as cache_keyword
    """The keyword to pass ``model``'s KV cache by: :func:`cache_keyword`, or ``cache`` (the
    current name) for a forward that names neither (a wrapper passing ``**kwargs`` on)."""
    return cache_keyword(model) or "cache"


@functools.cache
def _cache_keyword_of(cls: type) -> str | None:
    forward = getattr(cls, "forward", None)
    if forward is None:
        return None
    parameters = inspect.signature(forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)
