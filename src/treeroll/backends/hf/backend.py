"""The embedded generation backend: a Hugging Face causal LM with a KV-cache trie.

Every sequence the backend has run leaves its keys and values in a radix trie keyed by token
ids (the same idea as SGLang's RadixAttention, at token granularity, on the CPU). A request
continues the longest cached prefix of its prompt; only the rest is forwarded. A tree rollout
therefore prefills a shared prefix once: the children of a node find their parent's context in
the trie, and requests with identical prompts in one batch share a single prefill.

All active requests of a call are decoded as one padded batch (sequential decoding gains
nothing on a CPU): cached prefixes are left-padded to a common length, new tokens are
left-padded too, the attention mask hides the padding, and explicit position ids keep each
row's positions contiguous. Rows are dropped from the batch as they finish. Requests whose
histories are identical (the same prompt, then the same sampled tokens) share one row, which
is copied only where their samples part: a sharp policy's identical sibling turns are
forwarded once, and ``Completion.shared_tokens`` says how many of a reply's tokens an earlier
request of the call had already sampled.

The trie stores KV for every token but the last one of each sequence it saw. A prompt's last
token is fed again unless the backend kept its logits: the last-position logits of every
prefilled prompt are kept (a small LRU, cleared with the trie), so a branch point's later
children, requested in later calls, need no forward before their first sample
(``computed_over_unique`` 1.0). Those logits come from the batch they were computed in: they
equal a fresh forward's within float rounding (1e-4 here), not bit for bit; pass
``keep_logits=False`` for batch-independent bits.

The logits of every decoded position are kept too (``replay``), keyed by their context: a
request whose prompt's logits are kept samples from them, then from the kept logits of its
prompt plus what it has sampled, for as long as there are any. A turn that repeats, token for
token, a turn an earlier call sampled in the same context (a sharp policy's Tree-GRPO
expansion re-sampling its chain's turn) therefore costs no forward at all, and one that parts
from it feeds only from where it parted (``Completion.reused_tokens``). With it every
position of the trees' token trie is fed once (``forwarded_over_unique`` 1.0 in
``bench/rollout_cost.py``). Kept logits are bounded in entries and bytes
(``max_kept_logits``, ``max_kept_logits_bytes``; vocabulary x 4 bytes each) and dropped least
recently used first; a dropped entry only means a forward.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from treeroll.backends.hf.decode import DecodeBatch, Prefilled, _Row
from treeroll.backends.hf.kv_trie import KV, KVTrie
from treeroll.backends.weights import model_device, take_weights
from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.causal_lm import CausalLM, cache_argument
from treeroll.heads import check_logits, head_at, head_at_works

__all__ = ["HFBackend"]

LAST_ROWS = 16
"""The fewest rows a prefill's head runs on (:meth:`HFBackend._forward`): enough that the CPU
takes the same matrix-product kernel however many requests share the batch."""

class HFBackend:
    """Generation with a transformers causal LM on the CPU (or one GPU), KV reuse included.

    ``model`` is any ``PreTrainedModel`` with a causal-LM head that accepts
    ``past_key_values`` as a ``DynamicCache``, ``attention_mask`` and ``position_ids``
    (Llama, Qwen2/3, Mistral, GPT-NeoX, ...). ``use_prefix_cache=False`` recomputes every
    prompt from scratch (the reference path for tests and benchmarks). ``max_cached_tokens``
    bounds the trie (least recently used branches are evicted first); its memory is
    ``tokens * layers * 2 * kv_heads * head_dim * 4`` bytes (1 KiB a token for the default
    policy, about 12 KiB for a 0.5B Qwen).
    """

    def __init__(self, model: CausalLM, *, max_batch_size: int = 64, use_prefix_cache: bool = True,
                 max_cached_tokens: int = 262_144, pad_token_id: int = 0,
                 keep_logits: bool = True, max_kept_logits: int = 131_072,
                 max_kept_logits_bytes: int = 256 * 2**20, replay: bool = True,
                 join_fraction: float = 0.25, join_wait: int = 4) -> None:
        self.model = model
        self.positions = int(getattr(getattr(model, "config", None), "max_position_embeddings",
                                     0) or 0)
        self.max_batch_size = max_batch_size
        self.use_prefix_cache = use_prefix_cache
        self.trie = KVTrie(max_cached_tokens)
        self.pad_token_id = pad_token_id
        self.keep_logits = keep_logits and use_prefix_cache
        self.max_kept_logits = max_kept_logits
        self.max_kept_logits_bytes = max_kept_logits_bytes
        self.replay = replay and self.keep_logits
        self._logits: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._kept_bytes = 0
        self._head_at_works: bool | None = None  # probed at the first prefill
        self._stream: DecodeBatch | None = None  # the continuous batch (submit / advance)
        self._queued: list[_Row] = []
        self._tickets = 0
        self.join_fraction, self.join_wait = join_fraction, join_wait
        self._waited = 0  # decode steps the queue has waited
        self.stats = {"forward_tokens": 0, "generated": 0, "prefill": 0, "cached": 0,
                      "refed": 0, "reused": 0}
        """Totals since construction: tokens fed through the model, generated, prefilled and
        served from the cache; ``refed``: prompts whose every token was cached and whose last
        token was fed again for its logits (a branch point's later child without kept
        logits); ``reused``: sampled tokens, not a reply's last, replayed from kept logits
        instead of being fed."""

    def reset_cache(self) -> None:
        """Forget every cached prefix and kept logits (call after each weight update; not
        while a stream is decoding)."""
        if self._stream is not None:
            raise RuntimeError("reset_cache: requests submitted to the stream are still "
                               "decoding; advance until busy is False first")
        self.trie.clear()
        self._logits.clear()
        self._kept_bytes = 0

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy new weights into the model in place (nothing to copy when they are the
        model's own tensors, as when the trainer updates this very model) and forget every
        cached prefix and kept logits (they belong to the old weights)."""
        take_weights(self.model, state_dict)
        self.reset_cache()

    # ---------------------------------------------------------------- continuous batching
    def submit(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[int]:
        """Queue requests for the running decode batch; returns one ticket each. They join it
        at the next :meth:`advance` (up to ``max_batch_size`` requests decode at once; the
        rest wait in order). Every request of one stream uses the same ``params``."""
        if self._stream is not None and self._stream.params != params:
            raise ValueError("submit: every request of a running stream must use the same "
                             f"sampling parameters (running {self._stream.params}, got {params})")
        if self._stream is None:
            self._stream = DecodeBatch(self, params)
        tickets = list(range(self._tickets, self._tickets + len(requests)))
        self._tickets += len(requests)
        self._queued.extend(self._rows(requests, tickets, params))
        return tickets

    @torch.no_grad()
    def advance(self) -> list[tuple[int, Completion]]:
        """Join queued requests to the decode batch (a request its kept logits replay to the
        end finishes at once), then decode every request one token. Returns the requests that
        finished, as ``(ticket, completion)``, in no particular order."""
        stream = self._stream
        if stream is None:
            return []
        finished: list[_Row] = []
        if self._queued and self._join_now(stream.live):
            self._waited = 0
            room = max(self.max_batch_size - stream.live, 0)
            joining, self._queued = self._queued[:room], self._queued[room:]
            if self.replay:
                for row in joining:
                    self._replay(row, stream.params)
            finished.extend(row for row in joining if row.finish)
            todo = [row for row in joining if not row.finish]
            if todo:
                stream.join(self._prefill_rows(todo))
        if stream.live:
            finished.extend(stream.step())
            self._waited += bool(self._queued)
        self._count(finished)
        done = [(row.index, row.completion(stream.params)) for row in finished]
        if not stream.live and not self._queued:
            self._stream = None
        return done

    def _join_now(self, live: int) -> bool:
        """Whether the queue joins the decode batch at this step. Each join costs a prefill
        forward, so requests join in rounds: when nothing is decoding, when the queue holds
        ``join_fraction`` of the live requests, or when it has waited ``join_wait`` steps."""
        return (not live or len(self._queued) >= self.join_fraction * live
                or self._waited >= self.join_wait)

    @property
    def busy(self) -> bool:
        """Whether submitted requests are still queued or decoding."""
        return self._stream is not None

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Completion]:
        """Sample one continuation per request; see the module docstring for how."""
        out: list[Completion | None] = [None] * len(requests)
        # Chunks of similar prompt lengths pad less (seeded requests do not depend on their
        # batch, so the grouping changes no sample).
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        for start in range(0, len(requests), self.max_batch_size):
            chunk = order[start:start + self.max_batch_size]
            for row in self._generate_batch([requests[i] for i in chunk], chunk, params):
                out[row.index] = row.completion(params)
        return [c for c in out if c is not None]

    # ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerationRequest], indices: list[int],
                        params: SamplingParams) -> list[_Row]:
        """Sample every request of one chunk: replay what kept logits allow, decode the rest."""
        rows = self._rows(requests, indices, params)
        if self.replay:
            for row in rows:
                self._replay(row, params)
        todo = [row for row in rows if not row.finish]
        if todo:
            batch = DecodeBatch(self, params)
            batch.join(self._prefill_rows(todo))
            while batch.live:
                batch.step()
        self._count(rows)
        return rows

    def _rows(self, requests: Sequence[GenerationRequest], indices: Sequence[int],
              params: SamplingParams) -> list[_Row]:
        """Checked requests as rows to decode."""
        rows = []
        for req, index in zip(requests, indices, strict=True):
            if not req.prompt_ids:
                raise ValueError("a generation request needs at least one prompt token")
            max_new = min(params.max_new_tokens, req.max_new_tokens or params.max_new_tokens)
            if max_new < 1:
                raise ValueError(f"request {index} has max_new_tokens={max_new}; it must be >= 1")
            if self.positions and len(req.prompt_ids) + max_new > self.positions:
                raise ValueError(f"request {index}: a {len(req.prompt_ids)}-token context and "
                                 f"up to {max_new} new tokens exceed the model's "
                                 f"{self.positions} positions (max_position_embeddings)")
            gen = None
            if req.seed is not None:
                gen = torch.Generator().manual_seed(int(req.seed))
            prompt = tuple(req.prompt_ids)
            rows.append(_Row(index=index, prompt=prompt, max_new=max_new, generator=gen))
        return rows

    def _count(self, rows: Sequence[_Row]) -> None:
        for row in rows:
            self.stats["generated"] += len(row.tokens)
            self.stats["prefill"] += row.prefill
            self.stats["cached"] += row.cached
            self.stats["reused"] += row.reused

    def _prefill_rows(self, rows: list[_Row]) -> Prefilled:
        """Prefill what the cache lacks of each row's context (kept logits need none)."""
        # Requests with the same context share one prefill: the first is forwarded, the rest
        # repeat its cache rows.
        unique: dict[tuple[int, ...], int] = {}
        owner = [unique.setdefault(r.context, len(unique)) for r in rows]
        prompts = list(unique)
        kept: dict[int, tuple[torch.Tensor, list[KV]]] = {}  # prompts needing no forward
        for u, p in enumerate(prompts):
            if self.keep_logits and p in self._logits:
                m, pieces = self.trie.match_pieces(p)
                if m == len(p):
                    self._logits.move_to_end(p)
                    kept[u] = (self._logits[p], pieces)
        matched: list[tuple[int, list[KV]]] = [
            (len(p), kept[u][1]) if u in kept else
            self.trie.match_pieces(p[:-1]) if self.use_prefix_cache else (0, [])
            for u, p in enumerate(prompts)]
        if self.use_prefix_cache:  # a whole prompt in the trie, its last token fed again
            self.stats["refed"] += sum(1 for u, p in enumerate(prompts) if u not in kept
                                       and matched[u][0] == len(p) - 1
                                       and self.trie.match_length(p) == len(p))
        feeds = [p[m:] for p, (m, _) in zip(prompts, matched, strict=True)]
        first_seen: set[int] = set()
        for row, u in zip(rows, owner, strict=True):
            if row.tokens:  # replayed: its prompt is cached, its last replayed token is fed
                row.cached = len(row.prompt)
                if u in first_seen:  # ... by the earlier row of the same context
                    row.reused += 1
            elif u in first_seen:
                row.cached = len(row.prompt)
            else:
                row.cached = matched[u][0]
                row.prefill = len(feeds[u])
            first_seen.add(u)

        cache, mask, next_pos, logits = self._prefill(prompts, matched, feeds, kept)
        return Prefilled(rows=rows, owner=owner, cache=cache, mask=mask, next_pos=next_pos,
                         logits=logits)

    def _prefill(self, prompts: list[tuple[int, ...]], matched: list[tuple[int, list[KV]]],
                 feeds: list[tuple[int, ...]], kept: dict[int, tuple[torch.Tensor, list[KV]]]
                 ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward what the cache lacks; return the batch's cache, mask, next positions and
        last logits, one row per prompt. Prompts in ``kept`` are not forwarded: their KV
        (from the trie) and kept logits join the forwarded rows, left-padded."""
        fed = [u for u in range(len(prompts)) if u not in kept]
        if fed:
            cache, mask, positions, input_ids = self._pack(
                [matched[u][1] for u in fed], [matched[u][0] for u in fed],
                [feeds[u] for u in fed])
            logits = self._forward(input_ids, mask, positions, cache,
                                   last_only=True)[:, -1]  # [fed, vocab]
            self.stats["forward_tokens"] += sum(len(feeds[u]) for u in fed)
            if self.keep_logits:
                for b, u in enumerate(fed):
                    self._keep(prompts[u], logits[b])
            if not kept:
                return cache, mask, positions[:, -1] + 1, logits
        kvs: list[list[KV]] = []
        rows: list[torch.Tensor] = []
        for u in range(len(prompts)):
            if u in kept:
                rows.append(kept[u][0])
                kvs.append(kept[u][1])
            else:
                b = fed.index(u)
                rows.append(logits[b])
                keep = mask[b].nonzero().squeeze(-1)
                kvs.append([[(layer.keys[b][:, keep], layer.values[b][:, keep])
                             for layer in cache.layers]])
        lengths = [len(p) for p in prompts]
        merged, merged_mask = self._pack_past(kvs, lengths)
        return merged, merged_mask, torch.tensor(lengths), torch.stack(rows)

    def _pack(self, kvs: list[list[KV]], lengths: list[int], feeds: list[tuple[int, ...]]
              ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-pad cached prefixes (each as its trie pieces) and new tokens into one batch."""
        batch = len(feeds)
        past = max(lengths)
        new = max(len(f) for f in feeds)
        input_ids = torch.full((batch, new), self.pad_token_id, dtype=torch.long)
        positions = torch.zeros(batch, new, dtype=torch.long)
        cache, past_mask = self._pack_past(kvs, lengths)
        mask = torch.cat([past_mask, torch.zeros(batch, new, dtype=torch.long)], dim=1)
        for b, (m, feed) in enumerate(zip(lengths, feeds, strict=True)):
            n = len(feed)
            input_ids[b, new - n:] = torch.tensor(feed)
            mask[b, past + new - n:] = 1
            positions[b, new - n:] = torch.arange(m, m + n)
        return cache, mask, positions, input_ids

    @staticmethod
    def _pack_past(kvs: list[list[KV]], lengths: list[int]) -> tuple[Any, torch.Tensor]:
        """Left-pad cached prefixes (``lengths[b]`` tokens each, given as pieces that are
        copied straight into place) into one cache and its mask."""
        from treeroll.backends.hf.cache import growing_cache, room_for  # imports transformers

        batch, past = len(lengths), max(lengths)
        mask = torch.zeros(batch, past, dtype=torch.long)
        for b, m in enumerate(lengths):
            mask[b, past - m:] = 1
        if past == 0:
            return growing_cache(), mask
        reference = next(pieces[0] for pieces in kvs if pieces)
        layers, room = [], room_for(past)
        for layer, (k0, v0) in enumerate(reference):
            keys = k0.new_zeros(batch, k0.shape[0], room, k0.shape[2])  # [batch, heads, room, d]
            values = v0.new_zeros(batch, v0.shape[0], room, v0.shape[2])
            for b, (m, pieces) in enumerate(zip(lengths, kvs, strict=True)):
                at = past - m
                for piece in pieces:
                    n = piece[layer][0].shape[1]
                    keys[b, :, at:at + n] = piece[layer][0]
                    values[b, :, at:at + n] = piece[layer][1]
                    at += n
            layers.append((keys, values))
        return growing_cache(layers, past), mask  # the first `past` positions are filled

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: Any, last_only: bool = False) -> torch.Tensor:
        # The batch's ids, mask and positions are built on the CPU and the logits come back
        # there (sampling uses per-request CPU generators, so a seeded request samples the
        # same tokens on any device given the same logits); the KV cache stays on the model's
        # device. On the CPU both moves are no-ops.
        device = model_device(self.model)
        kwargs = {"input_ids": input_ids.to(device), "attention_mask": mask.to(device),
                  "position_ids": positions.to(device), "use_cache": True,
                  cache_argument(self.model): cache}
        if not last_only:
            return self.model(**kwargs).logits.float().cpu()
        # A prefill needs the last position's logits alone (rows are left-padded): with a
        # real model's vocabulary the head over every position is most of the memory (64
        # prompts of 600 tokens: 7.5 GB of float32 logits for SmolLM2) and a fifth of the
        # work. The head runs on the last hidden states, at least LAST_ROWS rows of them (the
        # first row repeated): a matrix product over one row takes another kernel on the CPU,
        # whose rounding differs (~1e-6), and a request's logits must not depend on how many
        # share its batch (tests/test_backend.py); from a few rows on, each row's logits are
        # those the full head gives it.
        if self._head_at_works is None:
            self._head_at_works = head_at_works(self.model)
        if not self._head_at_works:  # no separate head, or one that reshapes its output
            return self.model(**kwargs).logits[:, -1:].float().cpu()
        batch, last = input_ids.shape
        rows = torch.cat([torch.arange(batch), torch.zeros(max(LAST_ROWS - batch, 0),
                                                           dtype=torch.long)]).to(device)
        with head_at(self.model, rows, torch.full_like(rows, last - 1)):
            logits = self.model(**kwargs).logits
        check_logits(self.model, logits, len(rows))
        return logits[:batch, None].float().cpu()  # [batch, 1, vocab]

    def _sample(self, logits: torch.Tensor, rows: list[_Row],
                params: SamplingParams) -> torch.Tensor:
        """Sample one token per row; record its log-probability under the distribution it was
        drawn from: softmax(logits / T), restricted to the nucleus and renormalised when
        ``top_p < 1``."""
        logp = torch.log_softmax(logits / max(params.temperature, 1e-6), dim=-1)  # [rows, vocab]
        tokens = torch.empty(len(rows), dtype=torch.long)
        for b, row in enumerate(rows):
            logprob = logp[b]
            if params.temperature == 0:
                token = int(torch.argmax(logp[b]))
            else:
                probs = logp[b].exp()
                if params.top_p < 1.0:
                    probs = _top_p(probs, params.top_p)
                    logprob = logp[b] - torch.logsumexp(logp[b][probs > 0], dim=0)  # nucleus
                token = int(torch.multinomial(probs, 1, generator=row.generator))
            tokens[b] = token
            row.tokens.append(token)
            row.logprobs.append(float(logprob[token]))
            if params.top_logprobs:
                values, ids = torch.topk(logprob, min(params.top_logprobs, logprob.shape[-1]))
                row.top.append([(int(i), float(v)) for i, v in zip(ids, values, strict=True)])
            if params.entropy_window and len(row.entropies) < params.entropy_window:
                p = logp[b].exp()
                entropy = float(-(p * logp[b]).sum()) / max(float(torch.log(
                    torch.tensor(float(logp.shape[-1])))), 1e-9)
                row.entropies.append(entropy)
        return tokens

    def _keep(self, context: tuple[int, ...], logits: torch.Tensor) -> None:
        """Keep the logits that follow ``context`` (least recently used dropped first, within
        ``max_kept_logits`` entries and ``max_kept_logits_bytes``)."""
        if context in self._logits:
            self._logits.move_to_end(context)
            return
        kept = logits.clone()
        self._logits[context] = kept
        self._kept_bytes += kept.nelement() * kept.element_size()
        while self._logits and (len(self._logits) > self.max_kept_logits
                                or self._kept_bytes > self.max_kept_logits_bytes):
            _, dropped = self._logits.popitem(last=False)
            self._kept_bytes -= dropped.nelement() * dropped.element_size()

    def _replay(self, row: _Row, params: SamplingParams) -> None:
        """Sample ``row`` from kept logits for as long as they follow its context: a turn that
        repeats one an earlier call sampled in the same context (a sharp policy's Tree-GRPO
        expansion re-sampling its chain's turn) costs no forward. The row then either has
        finished (``reused`` = its tokens but the last) or continues from its ``context`` =
        the prompt and the replayed tokens, whose last the prefill feeds (``reused`` = the
        tokens before it; a replay that stops after the first token hands that token to the
        prefill, sampled once). A replay whose context's KV is no longer in the trie is undone
        (generator included) and the row decodes as usual."""
        logits = self._logits.get(row.prompt)
        if logits is None or (row.generator is None and params.temperature != 0):
            return
        if self.trie.match_length(row.prompt) < len(row.prompt):
            return
        state = None if row.generator is None else row.generator.get_state()
        context = row.prompt
        while True:
            self._logits.move_to_end(context)
            token = int(self._sample(logits[None], [row], params)[0])
            if token in params.stop_token_ids:
                row.finish = "stop"
            elif len(row.tokens) >= row.max_new:
                row.finish = "length"
            context += (token,)
            next_logits = self._logits.get(context)
            if row.finish or next_logits is None:
                break
            logits = next_logits
        if row.finish:
            row.reused, row.cached = len(row.tokens) - 1, len(row.prompt)
            return
        if self.trie.match_length(context) >= len(context) - 1:
            row.reused = len(row.tokens) - 1
            return
        if row.generator is not None and state is not None:  # undo: decode as usual
            row.generator.set_state(state)
        row.tokens.clear()
        row.logprobs.clear()
        row.entropies.clear()
        row.top.clear()

    def _store(self, row: _Row, cache: Any, mask: torch.Tensor, b: int) -> None:
        """Put a finished row's KV (all fed tokens, padding removed) into the trie."""
        keep = mask[b].nonzero().squeeze(-1)
        kv = [(layer.keys[b][:, keep], layer.values[b][:, keep]) for layer in cache.layers]
        ids = row.prompt + tuple(row.tokens[:-1])
        assert len(ids) == len(keep), (len(ids), len(keep))
        self.trie.insert(ids, kv)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` [vocab] restricted to the nucleus (the most probable tokens, in order, until
    their mass reaches ``top_p``) and renormalised; zero outside it."""
    sorted_probs, order = torch.sort(probs, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    cut = cumulative - sorted_probs > top_p
    sorted_probs[cut] = 0.0
    out = torch.zeros_like(probs)
    out[order] = sorted_probs
    return out / out.sum()
