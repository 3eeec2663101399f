"""Rollout cost through a llama.cpp server, side by side with the transformers backend.

The same measurement as ``bench/rollout_cost.py``'s ``compare`` (Tree-GRPO vs independent
chains matched task by task to the tree's leaves, FrozenLake in rLLM's convention, the shipped
base policy ``frozenlake-tiny``), run on two backends in one process:

* ``hf``: the in-process transformers backend with its KV-cache trie;
* ``llamacpp``: a real ``llama-server`` (built from PyPI's llama-cpp-python sources, see
  ``treeroll.backends.llamacpp.server``) serving the same policy written as GGUF, reached over
  HTTP with token ids in and out; its prompt-cache accounting is the server's own
  (``timings.cache_n`` / ``prompt_n``). Each slot keeps its last sequence's KV and the server
  routes a request to the slot sharing the longest prefix; idle slots are saved to and
  restored from a host-memory prompt cache (``--cache-ram``);
* ``llamacpp_n_cmpl``: the same server, with requests that continue the same prompt (a
  branch point's children) sent as one ``n_cmpl`` call, so the server evaluates that prompt
  once and copies its KV to the other slots (``share_prompts``; seeds within such a group
  follow the group's first, see ``LlamaCppBackend.generate``).

Every run starts from an empty cache (a new HF backend; a restarted server). Each repeat
first rolls the tree out untimed on that backend (its leaf counts; the two backends sample
different tokens), then times tree and matched chains in alternating order. Prints a table
and, as its last line, one JSON object with, per backend, ``computed_over_unique`` (tokens
the backend computed for the trees / unique tokens of the trees) and
``tree_over_chain_wall_per_leaf`` (median over repeats), and the token figures behind them.

Usage: ``python bench/server_backend.py --quick`` (about two minutes here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_cost import compare
from treeroll.backends.hf import HFBackend
from treeroll.backends.llamacpp import ManagedLlamaCpp
from treeroll.engine import RolloutConfig
from treeroll.envs import make_frozenlake
from treeroll.policies import load_policy
from treeroll.tree import TokenCounts


def summary(walls: dict[str, list[float]], totals: dict[str, TokenCounts]) -> dict[str, Any]:
    """The figures of one backend."""
    t, c = totals["tree"], totals["chain"]
    tree_ms, chain_ms = statistics.median(walls["tree"]), statistics.median(walls["chain"])
    return {
        "computed_over_unique": round(t.computed / max(t.unique, 1), 4),
        "chain_computed_over_unique": round(c.computed / max(c.unique, 1), 4),
        "tree_over_chain_wall_per_leaf": round(tree_ms / chain_ms, 4),
        "tree_computed_per_leaf": round(t.computed / max(t.leaves, 1), 2),
        "chain_computed_per_leaf": round(c.computed / max(c.leaves, 1), 2),
        "tree_wall_per_leaf_ms": round(1000 * tree_ms, 2),
        "chain_wall_per_leaf_ms": round(1000 * chain_ms, 2),
        "tree_leaves": t.leaves, "chain_leaves": c.leaves,
    }


def main() -> None:
    """Run both backends and print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few tasks, two repeats")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16,
                        help="llama.cpp server slots (requests decoded together)")
    parser.add_argument("--cache-ram", type=int, default=1024,
                        help="llama.cpp host-memory prompt cache, MiB (0: off)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    per_batch, repeats = (8, 2) if args.quick else (32, 5)

    policy = load_policy("frozenlake-tiny")
    policy.model.eval()
    turns = policy.turn_format()
    seeds = np.random.default_rng(0).choice(1_000_000, size=400, replace=False)
    settings = RolloutConfig(max_turn_tokens=16)
    server = ManagedLlamaCpp(policy.model, policy.tokenizer, slots=args.slots,
                             ctx_per_slot=1024, threads=args.threads,
                             cache_ram_mib=args.cache_ram)

    def fresh_server(share_prompts: bool) -> Callable[[], ManagedLlamaCpp]:
        def make() -> ManagedLlamaCpp:
            server.reset_cache()  # a restarted process: no KV, no prompt cache
            server.share_prompts = share_prompts
            return server
        return make

    backends: dict[str, Callable[[], Any]] = {
        "hf": lambda: HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0),
        "llamacpp": fresh_server(False),
        "llamacpp_n_cmpl": fresh_server(True),
    }
    results = {}
    try:
        for name, make in backends.items():
            walls, totals, _ = compare(make, turns, lambda: make_frozenlake("rllm"), seeds,
                                       settings, repeats, per_batch)
            results[name] = summary(walls, totals)
    finally:
        server.close()
    print(f"{'':16}{'over unique':>12}{'tree/chain wall':>16}{'tree ms/leaf':>14}"
          f"{'chain ms/leaf':>15}")
    for name, r in results.items():
        print(f"{name:16}{r['computed_over_unique']:>12.3f}"
              f"{r['tree_over_chain_wall_per_leaf']:>16.3f}{r['tree_wall_per_leaf_ms']:>14.2f}"
              f"{r['chain_wall_per_leaf_ms']:>15.2f}")
    line = {
        "computed_over_unique": {k: r["computed_over_unique"] for k, r in results.items()},
        "tree_over_chain_wall_per_leaf": {k: r["tree_over_chain_wall_per_leaf"]
                                          for k, r in results.items()},
        "backends": results,
        "llamacpp_server": {"slots": args.slots, "cache_ram_mib": args.cache_ram,
                            "kv_type": "f32", "threads": args.threads},
        "tasks": per_batch * repeats, "repeats": repeats,
        "policy": "frozenlake-tiny (shipped base)",
        "convention": "frozenlake rllm (non-slippery, sizes 2-9)",
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
