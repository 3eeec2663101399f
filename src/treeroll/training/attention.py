"""Attention for tree-packed training: a cached prefix plus a causal segment, without a mask.

A packed call forwards a segment of ``n`` new tokens whose keys follow a cached prefix of ``P``
keys (its root-to-parent path). The attention it needs is "lower-right causal": query ``i``
sees every prefix key and the segment's keys ``<= i``. transformers expresses that with a
materialised ``[batch, 1, n, P + n]`` mask, and with a mask PyTorch's CPU flash kernel can no
longer skip the blocks above the diagonal, so a long segment costs about twice the attention
work of the same tokens forwarded without a prefix (measured in ``bench/packed_full_step.py``).

Here the two parts are computed separately and merged exactly, as ring/blockwise attention
does: the prefix part with no mask (or only a key-padding mask when the rows of a batch have
prefixes of different lengths), the segment part with ``is_causal``; the outputs are combined
with their log-sum-exps, and the backward pass of each part is run against the *merged* output
and log-sum-exp, which gives the exact gradients of the full softmax. The fused kernels used are
``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward (CPU tensors). On other
devices, or with attention dropout, the function falls back to PyTorch SDPA with an explicit
mask: still exact, just not the fast path.

The function is registered with transformers' ``AttentionInterface`` under
:data:`IMPLEMENTATION` and switched on only for the duration of a packed update
(:func:`tree_attention`); an implementation name that has no mask function makes transformers
skip building the 4D mask altogether.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from treeroll.causal_lm import CausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["IMPLEMENTATION", "prefix_causal_attention", "tree_attention"]

IMPLEMENTATION = "treeroll_prefix_causal"
"""The name under which :func:`attention_forward` is registered with transformers."""

CALLS = [0]
"""How many times :func:`attention_forward` ran (lets the packed update check that a model
really routes its attention through transformers' attention interface)."""

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _PrefixCausal(torch.autograd.Function):
    """Exact softmax attention over ``[prefix keys (unmasked or key-masked), causal segment]``."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key_prefix: torch.Tensor,
                value_prefix: torch.Tensor, key_self: torch.Tensor, value_self: torch.Tensor,
                prefix_mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        out_prefix, lse_prefix = _flash(query, key_prefix, value_prefix, 0.0, False,
                                        attn_mask=prefix_mask, scale=scale)
        out_self, lse_self = _flash(query, key_self, value_self, 0.0, True, scale=scale)
        lse = torch.logaddexp(lse_prefix, lse_self)
        out = (torch.exp(lse_prefix - lse).unsqueeze(-1) * out_prefix
               + torch.exp(lse_self - lse).unsqueeze(-1) * out_self).to(query.dtype)
        ctx.save_for_backward(query, key_prefix, value_prefix, key_self, value_self, out, lse)
        ctx.prefix_mask = prefix_mask
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key_prefix, value_prefix, key_self, value_self, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq_prefix, dk_prefix, dv_prefix = _flash_backward(
            grad, query, key_prefix, value_prefix, out, lse, 0.0, False,
            attn_mask=ctx.prefix_mask, scale=ctx.scale)
        dq_self, dk_self, dv_self = _flash_backward(
            grad, query, key_self, value_self, out, lse, 0.0, True, scale=ctx.scale)
        return dq_prefix + dq_self, dk_prefix, dv_prefix, dk_self, dv_self, None, None


def prefix_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                            prefix_lengths: torch.Tensor | None = None,
                            scale: float | None = None, dropout: float = 0.0) -> torch.Tensor:
    """Attention of ``n`` queries over ``P`` prefix keys followed by their own ``n`` keys.

    ``query`` is ``[batch, heads, n, dim]``; ``key``/``value`` are ``[batch, heads, P + n,
    dim]`` (the same number of heads as ``query``). Query ``i`` attends to the prefix keys
    ``j < prefix_lengths[b]`` (all ``P`` when ``prefix_lengths`` is None) and to the segment
    keys ``P .. P + i``. Returns ``[batch, heads, n, dim]``. With ``prefix_lengths``, every
    entry must be >= 1 when ``P > 0``. Attention ``dropout`` takes the masked SDPA path (exact,
    not fused).
    """
    n = query.shape[2]
    prefix = key.shape[2] - n
    if prefix < 0:
        raise ValueError(f"prefix_causal_attention: {key.shape[2]} keys for {n} queries")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if prefix == 0:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, dropout_p=dropout)
    key_mask = None
    if prefix_lengths is not None:
        if bool((prefix_lengths <= 0).any()):
            raise ValueError("prefix_causal_attention: every row needs a non-empty prefix "
                             "when the batch has one (batch rows without a prefix separately)")
        key_mask = (torch.arange(prefix, device=query.device)[None, :]
                    < prefix_lengths.to(query.device)[:, None])  # [batch, P]
        if bool(key_mask.all()):
            key_mask = None
    fast = (not dropout and query.device.type == "cpu"
            and query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16))
    if not fast:
        full = torch.ones(n, prefix + n, dtype=torch.bool, device=query.device).tril(prefix)
        mask = full[None, None]
        if key_mask is not None:
            mask = mask & torch.cat([key_mask, key_mask.new_ones(len(key_mask), n)],
                                    dim=1)[:, None, None, :]
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, dropout_p=dropout)
    prefix_mask = None
    if key_mask is not None:
        # additive, broadcast over heads and queries: [batch, 1, 1, P]
        prefix_mask = torch.zeros(key_mask.shape, dtype=query.dtype, device=query.device)
        prefix_mask.masked_fill_(~key_mask, float("-inf"))
        prefix_mask = prefix_mask[:, None, None, :]
    result: torch.Tensor = _PrefixCausal.apply(
        query.contiguous(), key[:, :, :prefix].contiguous(), value[:, :, :prefix].contiguous(),
        key[:, :, prefix:].contiguous(), value[:, :, prefix:].contiguous(), prefix_mask, scale)
    return result


def attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-interface entry: lower-right causal over a cached prefix.

    Reads ``treeroll_prefix_lengths`` (``[batch]`` real prefix lengths, or absent) from the
    model call's keyword arguments. Returns ``([batch, n, heads, dim], None)`` like the other
    transformers attention functions.
    """
    CALLS[0] += 1
    if attention_mask is not None:
        raise ValueError(f"{IMPLEMENTATION} attention expects no attention mask; it is only "
                         "meant for treeroll's packed update")
    device = query.device.type
    if torch.is_autocast_enabled(device):  # rotary embeddings leave q and k in float32
        dtype = torch.get_autocast_dtype(device)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: repeat the key/value heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    out = prefix_causal_attention(query, key, value,
                                  prefix_lengths=kwargs.get("treeroll_prefix_lengths"),
                                  scale=scaling, dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, attention_forward)


@contextmanager
def tree_attention(model: CausalLM) -> Iterator[None]:
    """Within the block, ``model`` (and its sub-configs) attend with :func:`attention_forward`.

    The previous attention implementation is restored on exit, also on error.
    """
    _register()
    configs = [c for c in _configs(model.config) if hasattr(c, "_attn_implementation")]
    previous = [c._attn_implementation for c in configs]
    try:
        for c in configs:
            c._attn_implementation = IMPLEMENTATION
        yield
    finally:
        for c, name in zip(configs, previous, strict=True):
            c._attn_implementation = name


def _configs(config: PretrainedConfig) -> list[PretrainedConfig]:
    """``config`` and its sub-configs (text/vision configs of composite models)."""
    out = [config]
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None:
            out.append(sub)
    return out
