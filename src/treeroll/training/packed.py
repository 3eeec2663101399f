"""Tree-packed PPO-clip: every unique token of a rollout tree forwarded and back-propagated once.

The leaves of one group (``TrainItem.trajectory.group_id``) are merged into a token trie keyed by
``(token id, model-token mask, sampling logprob)``. Identical token prefixes give identical
contexts, hence identical logits, so merging is exact; keying on the mask and the old logprob as
well means two leaves only share a token when its whole loss input is the same (sibling branches
that happen to sample the same tokens with different recorded logprobs stay apart, still exact).

Every trie token carries the aggregate of the leaves through it (ALGORITHMS.md section 7): with
per-leaf weight ``w`` (the normalisation of :func:`treeroll.training.loss.token_weights`) and
advantage ``A``, the expanded loss ``sum_leaves -w * min(r * A, clip(r) * A)`` equals
``-(P * min(r, clip r) + N * max(r, clip r))`` with ``P`` the sum of ``w * A`` over leaves with
``A >= 0`` and ``N`` over leaves with ``A < 0``; the k3 KL term weighs ``sum w``. Metrics weigh
each trie token by its leaf multiplicity, so ``clip_fraction``, ``entropy`` and ``kl`` equal the
expanded ones.

How the trie is computed (measured choice, see ``bench/train_cost.py``): node by node with
cached prefixes. Unary runs of the trie become segments; a segment's children are forwarded
together as one right-padded batch whose past is the KV of their common root-to-parent path
(positions continue from the path length, so they are depth-based). The alternative, one packed
sequence per tree with a tree-shaped 4D attention mask, forwards the same tokens but its
attention is dense over the packed length: on FrozenLake trees (leaves of ~2,300 tokens, a tree
of ~10k unique tokens) that is ~3x the expanded attention work, whereas node-by-node each query
token attends exactly to its own path, so the attention work is also the ideal one.

Gradients flow through the cached KV into the parent: each call's path KV is handed to its
children as a detached leaf tensor; the children's subtree is forwarded and back-propagated
first (depth first), and then the parent is back-propagated with the gradient its KV received.
So only the calls along one root-to-leaf path hold activations at a time, and a segment longer
than ``max_packed_tokens`` (or a batch of siblings larger than it) is split into several calls
without changing the result: the splitting is exact, only the cost changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treeroll.training.loss import LossConfig, TrainItem, token_weights

__all__ = ["packed_backward", "supports_packing", "unique_tokens", "unsupported_reason"]


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot be tree-packed, or None when it can.

    Packing needs a decoder-only transformers model whose forward takes ``cache`` (a
    ``DynamicCache`` of full-attention layers) and ``position_ids``; sliding-window or other
    non-full attention layers would make a cached prefix differ from the expanded context.
    """
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return "transformers is not installed"
    if not isinstance(model, PreTrainedModel):
        return f"{type(model).__name__} is not a transformers PreTrainedModel"
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return "the model is an encoder-decoder"
    text = config.get_text_config(decoder=True)
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "the model uses sliding-window attention"
    layer_types = getattr(text, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return f"the model has non-full-attention layers ({sorted(set(layer_types))})"
    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "position_ids"):
        if name not in parameters:
            return f"the model's forward takes no {name!r} argument"
    return None


def supports_packing(model: Any) -> bool:
    """Whether :func:`packed_backward` can train ``model`` (see :func:`unsupported_reason`)."""
    return unsupported_reason(model) is None


@dataclass
class _Segment:
    """A unary run of the token trie: tokens, and per token the aggregate of its leaves."""

    tokens: np.ndarray  # [n] int64
    mask: np.ndarray  # [n] model token (1) or environment token (0)
    old: np.ndarray  # [n] sampling logprob
    positive: np.ndarray  # [n] P: sum of w * A over leaves with A >= 0
    negative: np.ndarray  # [n] N: sum of w * A over leaves with A < 0
    weight: np.ndarray  # [n] sum of w (the KL weight)
    count: np.ndarray  # [n] leaves through the token
    count_positive: np.ndarray  # [n] leaves with A > 0 (clip_fraction)
    count_negative: np.ndarray  # [n] leaves with A < 0
    children: list[_Segment] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


class _Trie:
    """A token trie of one group, a node per token, with the leaf aggregates per node."""

    _FIELDS = ("positive", "negative", "weight", "count", "count_positive", "count_negative")

    def __init__(self) -> None:
        self.children: list[dict[tuple[int, int, float], int]] = [{}]  # node 0: virtual root
        self.key: list[tuple[int, int, float]] = [(-1, 0, 0.0)]
        self.acc: dict[str, list[float]] = {name: [0.0] for name in self._FIELDS}

    def insert(self, item: TrainItem, weight: float) -> None:
        t = item.trajectory
        ids = t.prompt_ids + t.response_ids
        mask = [0] * len(t.prompt_ids) + list(t.response_mask)
        old = [0.0] * len(t.prompt_ids) + [float(x) for x in t.response_logprobs]
        advantage = item.advantage
        add = {"positive": weight * advantage if advantage >= 0 else 0.0,
               "negative": weight * advantage if advantage < 0 else 0.0,
               "weight": weight, "count": 1.0,
               "count_positive": float(advantage > 0), "count_negative": float(advantage < 0)}
        node = 0
        for key in zip(ids, mask, old, strict=True):
            child = self.children[node].get(key)
            if child is None:
                child = len(self.key)
                self.children[node][key] = child
                self.children.append({})
                self.key.append(key)
                for name in self._FIELDS:
                    self.acc[name].append(0.0)
            node = child
            for name, value in add.items():
                self.acc[name][node] += value

    def segments(self, max_length: int) -> list[_Segment]:
        """Compress unary runs into segments of at most ``max_length`` tokens."""
        acc = {name: np.asarray(values) for name, values in self.acc.items()}
        roots: list[_Segment] = []
        stack: list[tuple[int, list[_Segment]]] = [(c, roots) for c in self.children[0].values()]
        while stack:
            node, siblings = stack.pop()
            run = [node]
            while len(self.children[node]) == 1 and len(run) < max_length:
                node = next(iter(self.children[node].values()))
                run.append(node)
            index = np.asarray(run)
            keys = [self.key[n] for n in run]
            segment = _Segment(
                tokens=np.asarray([k[0] for k in keys], dtype=np.int64),
                mask=np.asarray([k[1] for k in keys], dtype=np.float64),
                old=np.asarray([k[2] for k in keys], dtype=np.float64),
                **{name: acc[name][index] for name in self._FIELDS})
            siblings.append(segment)
            stack.extend((c, segment.children) for c in self.children[node].values())
        return roots


def packed_backward(model: Any, items: Sequence[TrainItem], config: LossConfig,
                    ref_model: Any | None = None, *,
                    max_packed_tokens: int | None = None) -> dict[str, float]:
    """Forward and backward the loss over ``items``, each unique token of each group once.

    Same contract, loss, gradients and metric keys as
    :func:`treeroll.training.loss.expanded_backward` (gradients accumulate in ``model``'s
    parameters, no optimiser step). ``max_packed_tokens`` (default
    ``config.micro_batch_tokens``) bounds the tokens of one forward call, padding included;
    longer segments and larger sibling batches are split at token boundaries, exactly.
    """
    budget = max(1, max_packed_tokens or config.micro_batch_tokens)
    weights = token_weights(items, config)
    tries: dict[int, _Trie] = {}
    for item, weight in zip(items, weights, strict=True):
        tries.setdefault(item.trajectory.group_id, _Trie()).insert(item, weight)
    roots = [s for trie in tries.values() for s in trie.segments(budget)]
    use_ref = ref_model is not None and bool(config.kl_coef)
    run = _Run(model, ref_model if use_ref else None, config, budget)
    for batch in _batches(roots, budget):
        run.call(batch, None, None)
    metrics = run.metrics
    tokens = max(metrics.pop("tokens"), 1.0)
    for key in ("clip_fraction", "entropy", "kl"):
        metrics[key] /= tokens
    return metrics


def unique_tokens(items: Sequence[TrainItem]) -> int:
    """Tokens :func:`packed_backward` forwards for ``items`` (the tries' sizes, no padding)."""
    tries: dict[int, _Trie] = {}
    for item in items:
        tries.setdefault(item.trajectory.group_id, _Trie()).insert(item, 0.0)
    return sum(len(trie.key) - 1 for trie in tries.values())


def _batches(segments: list[_Segment], budget: int) -> list[list[_Segment]]:
    """Group segments (longest first) so each batch has ``size * longest <= budget``."""
    ordered = sorted(segments, key=len, reverse=True)
    out: list[list[_Segment]] = []
    for segment in ordered:
        if out and (len(out[-1]) + 1) * len(out[-1][0]) <= budget:
            out[-1].append(segment)
        else:
            out.append([segment])
    return out


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer [1, heads, path, head_dim]


class _Run:
    """Depth-first forward/backward over the segment forest of one batch."""

    def __init__(self, model: Any, ref_model: Any | None, config: LossConfig,
                 budget: int) -> None:
        self.model = model
        self.ref_model = ref_model
        self.config = config
        self.budget = budget
        self.forwarded = 0
        self.metrics = {"loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "kl": 0.0,
                        "tokens": 0.0}

    def call(self, segments: list[_Segment], past: KV | None, ref_past: KV | None) -> None:
        """Forward ``segments`` (siblings sharing ``past``), recurse, then back-propagate."""
        size, longest = len(segments), max(len(s) for s in segments)
        ids = torch.zeros(size, longest, dtype=torch.long)  # [batch, longest], right-padded
        for b, segment in enumerate(segments):
            ids[b, : len(segment)] = torch.from_numpy(segment.tokens)
        start = past[0][0].shape[2] if past else 0
        positions = torch.arange(start, start + longest)[None].expand(size, longest)
        self.forwarded += size * longest
        rows, cols, targets, data = _predictions(segments)
        ref_logp, ref_layers = None, None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp_all, ref_layers = _forward(self.ref_model, ids, positions, ref_past,
                                                    self.config.temperature)
                ref_logp = ref_logp_all[rows, cols, targets]
                del ref_logp_all
        logp_all, layers = _forward(self.model, ids, positions, past, self.config.temperature)
        loss = self._loss(logp_all, rows, cols, targets, data, ref_logp)
        del logp_all
        # Children, depth first: each parent row's path KV goes down as a detached leaf whose
        # gradient, once the subtree is done, is back-propagated into this call's graph.
        outputs: list[torch.Tensor] = [loss]
        grads: list[torch.Tensor] = [torch.ones_like(loss)]
        parents = [b for b, s in enumerate(segments) if s.children]
        if parents:
            leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_())
                      for k, v in layers]
            for b in parents:
                end = start + len(segments[b])
                child_past = [(k[b: b + 1, :, :end], v[b: b + 1, :, :end]) for k, v in leaves]
                child_ref = ([(k[b: b + 1, :, :end], v[b: b + 1, :, :end])
                              for k, v in ref_layers] if ref_layers is not None else None)
                for batch in _batches(segments[b].children, self.budget):
                    self.call(batch, child_past, child_ref)
            for (k, v), (leaf_k, leaf_v) in zip(layers, leaves, strict=True):
                if leaf_k.grad is not None and leaf_v.grad is not None:
                    outputs.extend([k, v])
                    grads.extend([leaf_k.grad, leaf_v.grad])
        del layers
        if outputs[0].requires_grad or len(outputs) > 1:
            torch.autograd.backward(outputs, grads)

    def _loss(self, logp_all: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              targets: torch.Tensor, data: dict[str, torch.Tensor],
              ref_logp: torch.Tensor | None) -> torch.Tensor:
        """Sum over this call's predictions of the aggregated per-token loss; adds metrics."""
        config = self.config
        logp = logp_all[rows, cols, targets]  # [predictions]
        ratio = torch.exp(logp - data["old"].to(logp.dtype))
        clipped = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
        positive = data["positive"].to(logp.dtype)
        negative = data["negative"].to(logp.dtype)
        count = data["count"].to(logp.dtype)
        loss = -(positive * torch.minimum(ratio, clipped)
                 + negative * torch.maximum(ratio, clipped))
        if ref_logp is not None:
            delta = ref_logp - logp
            loss = loss + config.kl_coef * data["weight"].to(logp.dtype) * (
                torch.exp(delta) - delta - 1)
        total = loss.sum()
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)[rows, cols]
            clip_count = (data["count_positive"].to(logp.dtype) * (ratio > clipped)
                          + data["count_negative"].to(logp.dtype) * (ratio < clipped))
            self.metrics["loss"] += float(total)
            self.metrics["tokens"] += float(count.sum())
            self.metrics["clip_fraction"] += float(clip_count.sum())
            self.metrics["entropy"] += float((entropy * count).sum())
            if ref_logp is not None:
                delta = ref_logp - logp
                self.metrics["kl"] += float(((torch.exp(delta) - delta - 1) * count).sum())
        return total


def _forward(model: Any, ids: torch.Tensor, positions: torch.Tensor, past: KV | None,
             temperature: float) -> tuple[torch.Tensor, KV]:
    """Log-probabilities ``[batch, longest, vocab]`` and the path KV per layer."""
    from transformers import DynamicCache

    # Right padding needs no attention mask: under the causal mask a real token never sees
    # the padding after it, and nothing reads the padding's outputs or its KV.
    cache = DynamicCache(ddp_cache_data=_expand(past, len(ids))) if past else DynamicCache()
    out = model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True)
    logp_all = torch.log_softmax(out.logits.float() / temperature, dim=-1)
    return logp_all, [(layer.keys, layer.values) for layer in out.cache.layers]


def _expand(past: KV, size: int) -> KV:
    return [(k.expand(size, -1, -1, -1), v.expand(size, -1, -1, -1)) for k, v in past]


def _predictions(segments: list[_Segment]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Every model token this call predicts: its row, the position whose logits predict it,
    the token, and its aggregates. A segment's first token is predicted by its parent (so the
    call that forwards a segment also scores its children's first tokens)."""
    rows, cols, targets = [], [], []
    parts: dict[str, list[np.ndarray]] = {name: [] for name in
                                          ("old", *_Trie._FIELDS)}
    for b, segment in enumerate(segments):
        n = len(segment)
        # within the segment: logits at i - 1 predict token i
        keep = np.nonzero(segment.mask[1:])[0] + 1
        rows.append(np.full(len(keep), b))
        cols.append(keep - 1)
        targets.append(segment.tokens[keep])
        for name in parts:
            parts[name].append(getattr(segment, name)[keep])
        for child in segment.children:
            if child.mask[0]:
                rows.append(np.array([b]))
                cols.append(np.array([n - 1]))
                targets.append(child.tokens[:1])
                for name in parts:
                    parts[name].append(getattr(child, name)[:1])
    data = {name: torch.from_numpy(np.concatenate(v)) for name, v in parts.items()}
    return (torch.from_numpy(np.concatenate(rows)).long(),
            torch.from_numpy(np.concatenate(cols)).long(),
            torch.from_numpy(np.concatenate(targets)).long(), data)
