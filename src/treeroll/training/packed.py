"""Tree-packed PPO-clip: every unique token of a rollout tree forwarded and back-propagated once.

The leaves of one group (``TrainItem.trajectory.group_id``) are merged into a token trie keyed by
``(token id, model-token mask, sampling logprob)``. Identical token prefixes give identical
contexts, hence identical logits, so merging is exact; keying on the mask and the old logprob as
well means two leaves only share a token when its whole loss input is the same (sibling branches
that happen to sample the same tokens with different recorded logprobs stay apart, still exact).

Every trie token carries the aggregate of the leaves through it (docs/concepts.md): with
per-leaf weight ``w`` (the normalisation of :func:`treeroll.training.loss.token_weights`) and
advantage ``A`` (the leaf's value at that token: one per leaf, or per turn, per token), the
expanded loss ``sum_leaves -w * min(r * A, clip(r) * A)`` equals
``-(P * min(r, clip r) + N * max(r, clip r))`` with ``P`` the sum of ``w * A`` over leaves with
``A >= 0`` and ``N`` over leaves with ``A < 0``; the k3 KL term weighs ``sum w``. Metrics weigh
each trie token by its leaf multiplicity, so ``clip_fraction``, ``entropy`` and ``kl`` equal the
expanded ones.

How the trie is computed (measured choice, see ``bench/train_cost.py`` and
``bench/packed_full_step.py``): node by node with cached prefixes. Unary runs of the trie
become segments. A call forwards a right-padded batch of segments, each row continuing its own
root-to-parent path: the path's keys and values are gathered from the parent call into a
right-padded prefix (rows of one call may have different parents, groups and prefix lengths;
a key mask hides a row's padding), and positions continue from the row's path length, so they
are depth-based. Attention over ``[prefix, segment]`` uses
:mod:`treeroll.training.attention` (exact, no materialised mask). Which segments share a
call is decided by :func:`_plan`, a dynamic program over an estimated cost (call overhead,
padded tokens, attention to the prefix). The alternative, one packed sequence per tree with a
tree-shaped 4D attention mask, forwards the same tokens but its attention is dense over the
packed length: on FrozenLake trees (leaves of ~2,300 tokens, a tree of ~10k unique tokens)
that is ~3x the expanded attention work, whereas node by node each query token attends
exactly to its own path.

Gradients flow through the cached KV into the parent: each call's KV is handed to its
children as detached leaf tensors; the children's subtrees are forwarded and back-propagated
first (depth first), and then the parent is back-propagated with the gradient its KV received.
So only the calls along one root-to-leaf chain hold activations at a time, and a segment longer
than ``max_packed_tokens`` (or a batch larger than it) is split into several calls without
changing the result: the splitting is exact, only the cost changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treeroll.backends.weights import model_device
from treeroll.causal_lm import CausalLM, cache_argument, cache_keyword
from treeroll.credit.objectives import policy_loss
from treeroll.heads import HeadReshaped, check_logits, head_at
from treeroll.training import attention
from treeroll.training.attention import tree_attention
from treeroll.training.loss import LossConfig, TrainItem, token_weights

__all__ = ["PackingUnsupported", "packed_backward", "supports_packing", "unique_tokens",
           "unsupported_reason"]


class PackingUnsupported(RuntimeError):
    """The model turned out not to support packing while running (its attention does not go
    through transformers' attention interface); nothing was changed but accumulated grads."""


def unsupported_reason(model: CausalLM) -> str | None:
    """Why ``model`` cannot be tree-packed, or None when it can.

    Packing needs a decoder-only transformers model whose forward takes ``cache`` (a
    ``DynamicCache`` of full-attention layers; ``past_key_values`` before transformers 5.20:
    :func:`treeroll.causal_lm.cache_keyword`) and ``position_ids``; sliding-window or other
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
    if cache_keyword(model) is None:
        return "the model's forward takes no 'cache' (or 'past_key_values') argument"
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return "the model's forward takes no 'position_ids' argument"
    return None


def supports_packing(model: CausalLM) -> bool:
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
        advantages = [0.0] * len(t.prompt_ids) + item.token_advantages().tolist()
        acc = self.acc
        node = 0
        for key, advantage in zip(zip(ids, mask, old, strict=True), advantages, strict=True):
            child = self.children[node].get(key)
            if child is None:
                child = len(self.key)
                self.children[node][key] = child
                self.children.append({})
                self.key.append(key)
                for name in self._FIELDS:
                    acc[name].append(0.0)
            node = child
            if advantage >= 0:
                acc["positive"][node] += weight * advantage
                acc["count_positive"][node] += float(advantage > 0)
            else:
                acc["negative"][node] += weight * advantage
                acc["count_negative"][node] += 1.0
            acc["weight"][node] += weight
            acc["count"][node] += 1.0

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


def packed_backward(model: CausalLM, items: Sequence[TrainItem], config: LossConfig,
                    ref_model: CausalLM | None = None, *,
                    max_packed_tokens: int | None = None,
                    weights: Sequence[float] | None = None) -> dict[str, float]:
    """Forward and backward the loss over ``items``, each unique token of each group once.

    Same contract, loss, gradients and metric keys as
    :func:`treeroll.training.loss.expanded_backward` (gradients accumulate in ``model``'s
    parameters, no optimiser step). ``max_packed_tokens`` (default
    ``config.micro_batch_tokens``) bounds the new tokens of one forward call, padding included;
    longer segments and larger batches are split at token boundaries, exactly. ``weights``
    (default :func:`~treeroll.training.loss.token_weights` of ``items``) weighs each item's
    tokens in the loss.
    """
    budget = max(1, max_packed_tokens or config.micro_batch_tokens)
    weights = list(weights) if weights is not None else token_weights(items, config)
    tries: dict[int, _Trie] = {}
    for item, weight in zip(items, weights, strict=True):
        tries.setdefault(item.trajectory.group_id, _Trie()).insert(item, weight)
    roots = [s for trie in tries.values() for s in trie.segments(budget)]
    ref = ref_model if config.kl_coef else None
    run = _ForestPass(model, ref, config, budget)
    with tree_attention(model), (tree_attention(ref) if ref is not None else nullcontext()):
        for batch in _plan([(segment, 0) for segment in roots], budget,
                           _keys_per_token(model)):
            run.call([segment for segment, _ in batch], None, None, None)
    metrics = run.metrics
    tokens = max(metrics.pop("tokens"), 1.0)
    for key in ("clip_fraction", "entropy", "kl", "abs_log_ratio"):
        metrics[key] /= tokens
    return metrics


def unique_tokens(items: Sequence[TrainItem]) -> int:
    """Tokens :func:`packed_backward` forwards for ``items`` (the tries' sizes, no padding)."""
    tries: dict[int, _Trie] = {}
    for item in items:
        tries.setdefault(item.trajectory.group_id, _Trie()).insert(item, 0.0)
    return sum(len(trie.key) - 1 for trie in tries.values())


CALL_OVERHEAD_TOKENS = 128
"""The fixed cost of one forward+backward call, in tokens' worth of work (measured for the
default local model on 2 CPU threads: ~4 ms per call, ~23 us per token). It only steers how
segments are grouped into calls; any grouping gives the same result."""


def _keys_per_token(model: CausalLM) -> float:
    """How many attended keys cost as much as one token's projections and MLP (~12 x hidden)."""
    hidden = getattr(model.config.get_text_config(decoder=True), "hidden_size", 64)
    return 12.0 * float(hidden)


def _plan(entries: list[tuple[_Segment, int]], budget: int, keys_per_token: float
          ) -> list[list[tuple[_Segment, int]]]:
    """Split ``(segment, prefix length)`` entries into right-padded batches of least cost.

    Entries are sorted by length (longest first) and cut into contiguous runs by dynamic
    programming over the estimated cost of a call: a fixed overhead plus, per padded token, its
    projections and its attention to the batch's longest prefix and to half the longest segment.
    A run's padded size (``rows * longest``) stays within ``budget`` unless it is one entry.
    """
    ordered = sorted(entries, key=lambda e: -len(e[0]))
    count = len(ordered)
    prefixes = np.asarray([prefix for _, prefix in ordered], dtype=np.float64)
    best = np.zeros(count + 1)
    cut = np.full(count + 1, count)
    for i in range(count - 1, -1, -1):
        longest = len(ordered[i][0])
        rows = max(1, min(count - i, budget // max(longest, 1)))  # batch sizes 1..rows
        sizes = np.arange(1, rows + 1)
        widest = np.maximum.accumulate(prefixes[i: i + rows])
        costs = (CALL_OVERHEAD_TOKENS
                 + sizes * longest * (1.0 + (widest + longest / 2) / keys_per_token)
                 + best[i + 1: i + rows + 1])
        k = int(np.argmin(costs))
        best[i], cut[i] = costs[k], i + k + 1
    out, i = [], 0
    while i < count:
        out.append(ordered[i: int(cut[i])])
        i = int(cut[i])
    return out


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer [batch, heads, keys, head_dim]


class _ForestPass:
    """Depth-first forward/backward over the segment forest, batching across parents."""

    def __init__(self, model: CausalLM, ref_model: CausalLM | None, config: LossConfig,
                 budget: int) -> None:
        self.model = model
        self.ref_model = ref_model
        self.config = config
        self.budget = budget
        self.keys_per_token = _keys_per_token(model)
        self.bfloat16 = config.compute_dtype == "bfloat16"
        self.forwarded = 0
        self.calls = 0
        self.metrics = {"loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "kl": 0.0,
                        "abs_log_ratio": 0.0, "tokens": 0.0}

    def call(self, segments: list[_Segment], past: KV | None, ref_past: KV | None,
             prefix_lengths: np.ndarray | None) -> None:
        """Forward ``segments`` (row ``b`` continues ``past[b]``'s first ``prefix_lengths[b]``
        keys), recurse into their children, then back-propagate this call."""
        size, longest = len(segments), max(len(s) for s in segments)
        ids = torch.zeros(size, longest, dtype=torch.long)  # [batch, longest], right-padded
        for b, segment in enumerate(segments):
            ids[b, : len(segment)] = torch.from_numpy(segment.tokens)
        width = past[0][0].shape[2] if past else 0  # padded prefix length
        lengths = (np.zeros(size, dtype=np.int64) if prefix_lengths is None
                   else prefix_lengths)
        positions = torch.from_numpy(lengths)[:, None] + torch.arange(longest)[None, :]
        extra = ({} if past is None or bool((lengths == width).all())
                 else {"treeroll_prefix_lengths": torch.from_numpy(lengths)})
        self.forwarded += size * longest
        self.calls += 1
        rows, cols, targets, data = _predictions(segments)
        device = model_device(self.model)  # built on the CPU, used where the model is
        rows, cols, targets = rows.to(device), cols.to(device), targets.to(device)
        data = {name: value.to(device) for name, value in data.items()}
        ref_logp, ref_layers = None, None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp_all, ref_layers = _forward(self.ref_model, ids, positions, ref_past,
                                                    self.config.temperature, extra, rows, cols,
                                                    self.bfloat16)
                ref_logp = ref_logp_all.gather(-1, targets[:, None]).squeeze(-1)
                del ref_logp_all
        logp_all, layers = _forward(self.model, ids, positions, past, self.config.temperature,
                                    extra, rows, cols, self.bfloat16)
        loss = self._loss(logp_all, targets, data, ref_logp)
        del logp_all
        # Children, depth first: this call's KV goes down as detached leaves; each child row
        # gathers its own path (the real prefix keys of its parent row, then the parent's
        # segment) into a right-padded prefix. Once the subtree is done, the gradient the
        # leaves received is back-propagated into this call's graph.
        outputs: list[torch.Tensor] = [loss]
        grads: list[torch.Tensor] = [torch.ones_like(loss)]
        children = [(child, b) for b, segment in enumerate(segments)
                    for child in segment.children]
        if children:
            leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_())
                      for k, v in layers]
            path_lengths = lengths + np.asarray([len(s) for s in segments], dtype=np.int64)
            entries = [(child, int(path_lengths[b])) for child, b in children]
            parent_of = {id(child): b for child, b in children}
            for batch in _plan(entries, self.budget, self.keys_per_token):
                parent_rows = np.asarray([parent_of[id(child)] for child, _ in batch])
                index = _path_index(parent_rows, lengths, path_lengths, width)
                child_ref = (None if ref_layers is None
                             else _gather(ref_layers, parent_rows, index))
                self.call([child for child, _ in batch], _gather(leaves, parent_rows, index),
                          child_ref, path_lengths[parent_rows])
            for (k, v), (leaf_k, leaf_v) in zip(layers, leaves, strict=True):
                if leaf_k.grad is not None and leaf_v.grad is not None:
                    outputs.extend([k, v])
                    grads.extend([leaf_k.grad, leaf_v.grad])
        del layers
        if outputs[0].requires_grad or len(outputs) > 1:
            torch.autograd.backward(outputs, grads)

    def _loss(self, logp_all: torch.Tensor, targets: torch.Tensor,
              data: dict[str, torch.Tensor], ref_logp: torch.Tensor | None) -> torch.Tensor:
        """Sum over this call's predictions of the aggregated per-token loss; adds metrics.
        ``logp_all``: ``[predictions, vocab]``."""
        config = self.config
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [predictions]
        ratio = torch.exp(logp - data["old"].to(logp.dtype))
        objective = policy_loss(config)
        positive = data["positive"].to(logp.dtype)
        negative = data["negative"].to(logp.dtype)
        count = data["count"].to(logp.dtype)
        loss = objective.packed_loss(ratio, logp, positive, negative, config)
        if ref_logp is not None:
            delta = ref_logp - logp
            loss = loss + config.kl_coef * data["weight"].to(logp.dtype) * (
                torch.exp(delta) - delta - 1)
        total = loss.sum()
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            clip_count = objective.packed_flagged(
                ratio, count, data["count_positive"].to(logp.dtype),
                data["count_negative"].to(logp.dtype), config)
            self.metrics["loss"] += float(total)
            self.metrics["tokens"] += float(count.sum())
            self.metrics["clip_fraction"] += float(clip_count.sum())
            self.metrics["entropy"] += float((entropy * count).sum())
            self.metrics["abs_log_ratio"] += float(((logp - data["old"].to(logp.dtype)).abs()
                                                    * count).sum())
            if ref_logp is not None:
                delta = ref_logp - logp
                self.metrics["kl"] += float(((torch.exp(delta) - delta - 1) * count).sum())
        return total


def _path_index(parent_rows: np.ndarray, lengths: np.ndarray, path_lengths: np.ndarray,
                width: int) -> torch.Tensor:
    """Per child row, the key positions of its path in the parent call's KV, right-padded.

    Parent row ``b``'s keys are its prefix ``0 .. lengths[b] - 1`` (then padding up to
    ``width``) followed by its segment at ``width ..``; padding entries point at key 0 and are
    masked by the prefix lengths.
    """
    longest = int(path_lengths[parent_rows].max())
    index = np.zeros((len(parent_rows), longest), dtype=np.int64)
    for c, b in enumerate(parent_rows):
        own = int(lengths[b])
        index[c, :own] = np.arange(own)
        index[c, own: path_lengths[b]] = width + np.arange(path_lengths[b] - own)
    return torch.from_numpy(index)


def _gather(layers: KV, rows: np.ndarray, index: torch.Tensor) -> KV:
    """Per layer, keys and values ``kv[rows[c], :, index[c]]`` as ``[children, heads, path,
    head_dim]``: each child row's path, right-padded."""
    device = layers[0][0].device
    select, index = torch.from_numpy(rows)[:, None].to(device), index.to(device)
    # advanced indexing puts [children, path] first: [children, path, heads, head_dim]
    return [(k[select, :, index].transpose(1, 2).contiguous(),
             v[select, :, index].transpose(1, 2).contiguous()) for k, v in layers]


def _forward(model: CausalLM, ids: torch.Tensor, positions: torch.Tensor, past: KV | None,
             temperature: float, extra: dict[str, torch.Tensor], rows: torch.Tensor,
             cols: torch.Tensor, bfloat16: bool = False) -> tuple[torch.Tensor, KV]:
    """Log-probabilities ``[predictions, vocab]`` at the positions ``(rows, cols)`` that
    predict a model token, and the KV per layer (prefix + segment).

    The output head and the softmax over the vocabulary run only at those positions
    (:mod:`treeroll.heads`). ``bfloat16``:
    the forward under ``torch.autocast`` (``LossConfig.compute_dtype``)."""
    from transformers import DynamicCache

    # Right padding needs no attention mask: under the causal attention a real token never sees
    # the padding after it, and nothing reads the padding's outputs or its KV; a row's padded
    # prefix keys are masked by its prefix length (``extra``).
    cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
    device = model_device(model)
    ids, positions = ids.to(device), positions.to(device)
    extra = {name: value.to(device) for name, value in extra.items()}
    calls = attention.CALLS[0]
    with head_at(model, rows, cols), \
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=bfloat16):
        out = model(input_ids=ids, position_ids=positions, use_cache=True,
                    **{cache_argument(model): cache}, **extra)
    if past and attention.CALLS[0] == calls:
        raise PackingUnsupported(
            f"{type(model).__name__} did not call transformers' attention interface, so a "
            "cached prefix would be attended with the wrong causal mask; train it with "
            "optim.packed false")
    try:
        check_logits(model, out.logits, len(rows))
    except HeadReshaped as error:
        raise PackingUnsupported(f"{error}; train it with optim.packed false") from None
    logp = torch.log_softmax(out.logits.float() / temperature, dim=-1)
    # filled in place; full-attention layers only (unsupported_reason), each holding its keys
    # and values (transformers types them as a union with layers that hold neither)
    layers: Any = cache.layers
    return logp, [(layer.keys, layer.values) for layer in layers]


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
