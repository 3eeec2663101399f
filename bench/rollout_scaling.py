"""How rollout cost grows with the work in flight: tree vs chain at 8, 32 and 128 tasks.

FrozenLake (rLLM's convention) with the shipped base policy ``frozenlake-tiny`` through the
transformers backend, on the unsynchronised engine. For each number of tasks rolled out
together, Tree-GRPO (M=4, N=2, L=1) and chains with the same leaves per task (matched task by
task, as ``bench/rollout_cost.py`` does) run on the same tasks, in alternating order, and the
bench reports leaves per second for both. The embedded model's decode step is latency-bound
with few sequences in flight (each step costs about the same whatever the batch) and
throughput-bound with many (the cost grows with the batch), and that decides tree versus
chain: the tree pays for its sequential depth in the first regime and wins by its token ratio
in the second. Also reported: the backend's KV-cache
memory per cached token at the end of the largest tree rollout (the trie's storage bytes / its
tokens; nothing is evicted at that size).

Prints a table and, as its last line, one JSON object. ``--quick``: one repeat per size.

    python bench/rollout_scaling.py --quick
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from rollout_cost import MatchedChain  # type: ignore[import-not-found]
from treeroll.backends.hf import HFBackend
from treeroll.engine import RolloutConfig, rollout
from treeroll.envs import make_frozenlake
from treeroll.policies import load_policy
from treeroll.strategies import TreeGRPO
from treeroll.tree import TokenCounts, token_counts

SIZES = (8, 32, 128)


def main() -> None:
    """Run every size and print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat per size")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 1 if args.quick else 3
    policy = load_policy("frozenlake-tiny")
    policy.model.eval()
    pad = policy.tokenizer.pad_token_id or 0
    turn_format = policy.turn_format()
    make_env = lambda: make_frozenlake("rllm")
    settings = RolloutConfig(max_turn_tokens=16, synchronous=False)
    pool = np.random.default_rng(1).choice(1_000_000, size=sum(SIZES) * repeats, replace=False)
    tree = TreeGRPO(m=4, n=2, l=1)
    result: dict[str, object] = {}
    bytes_per_token = 0.0
    offset = 0
    print(f"{'tasks':>6}{'tree leaves/s':>15}{'chain leaves/s':>16}{'tree/chain':>12}")
    for size in SIZES:
        rates: dict[str, list[float]] = {"tree": [], "chain": []}
        for r in range(repeats):
            tasks = pool[offset:offset + size]
            offset += size
            backend = HFBackend(policy.model, pad_token_id=pad)
            sizes = {t.task_seed: token_counts(t).leaves for t in rollout(
                tasks, make_env, backend, turn_format, tree, config=settings, seed=r).trees}
            order = [("tree", tree), ("chain", MatchedChain(sizes))]
            for name, strategy in (order if r % 2 == 0 else order[::-1]):
                backend = HFBackend(policy.model, pad_token_id=pad)
                start = time.perf_counter()
                batch = rollout(tasks, make_env, backend, turn_format, strategy,
                                config=settings, seed=r)
                wall = time.perf_counter() - start
                counts = sum((token_counts(t) for t in batch.trees), TokenCounts())
                rates[name].append(counts.leaves / wall)
                if name == "tree" and size == SIZES[-1]:
                    bytes_per_token = backend.trie.nbytes() / max(backend.trie.num_tokens, 1)
        tree_rate, chain_rate = float(np.median(rates["tree"])), float(np.median(rates["chain"]))
        result[f"tree_leaves_per_s_{size}"] = round(tree_rate, 1)
        result[f"chain_leaves_per_s_{size}"] = round(chain_rate, 1)
        result[f"tree_over_chain_wall_per_leaf_{size}"] = round(chain_rate / tree_rate, 4)
        print(f"{size:>6}{tree_rate:>15.1f}{chain_rate:>16.1f}{chain_rate / tree_rate:>12.3f}")
    result["cache_bytes_per_token"] = round(bytes_per_token, 1)
    result["repeats"] = repeats
    result["policy"] = "frozenlake-tiny (shipped base)"
    result["convention"] = "frozenlake rllm"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
