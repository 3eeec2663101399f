"""Packed vs expanded update on full default-size steps (8 tasks, as `treeroll train` does).

`bench/train_cost.py --quick` times small batches (2 tasks); this script times the update on
the batch a default training step produces: the default policy after a short format warm
start, FrozenLake rLLM convention, Tree-GRPO (M=4, N=2, L=1) and chains (G=8) on 8 tasks, two
batches each, expanded then packed on identical items in one process. Last line: one JSON
object with the seconds of each and ``packed_over_expanded`` (< 1 means packing is faster).

    python bench/packed_full_step.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from treeroll.advantages import grpo
from treeroll.backends.hf import HFBackend
from treeroll.backends.local import ModelConfig, build_model, build_word_tokenizer
from treeroll.config import PolicyConfig
from treeroll.envs import make_frozenlake
from treeroll.formatting import TurnFormat
from treeroll.rollout import RolloutConfig, rollout
from treeroll.strategies import Chain, TreeGRPO
from treeroll.training.loss import LossConfig, expanded_backward
from treeroll.training.packed import packed_backward
from treeroll.training.trainer import _Silent, _train_items, warm_start


def main() -> None:
    """Time both updates on full-size steps; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    make_env = lambda: make_frozenlake("rllm")
    tokenizer = build_word_tokenizer(make_env().vocabulary_texts())
    turn_format = TurnFormat(tokenizer)
    model = build_model(len(tokenizer), ModelConfig(), pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    rng = np.random.default_rng(0)
    seeds = rng.choice(1_000_000, size=400, replace=False)
    warm_start(model, tokenizer, turn_format, make_env, seeds,
               PolicyConfig(warm_start_steps=20, warm_start_batch=16), rng, _Silent())
    result: dict[str, dict[str, float]] = {}
    for strategy in (TreeGRPO(m=4, n=2, l=1), Chain(group_size=8)):
        seconds = {"expanded": 0.0, "packed": 0.0}
        for batch_index in range(args.batches):
            batch = rollout(seeds[8 * batch_index: 8 * batch_index + 8], make_env,
                            HFBackend(model.eval()), turn_format, strategy,
                            config=RolloutConfig(max_turn_tokens=12), seed=batch_index)
            items = _train_items(batch.trees, grpo, False)
            for name, update in (("expanded", expanded_backward), ("packed", packed_backward)):
                model.zero_grad()
                start = time.perf_counter()
                update(model, items, LossConfig())
                seconds[name] += time.perf_counter() - start
            print(f"{strategy.name} batch {batch_index}: {len(items)} leaves, "
                  f"expanded {seconds['expanded']:.2f}s packed {seconds['packed']:.2f}s "
                  "(cumulative)")
        result[strategy.name] = {**{k: round(v, 2) for k, v in seconds.items()},
                                 "packed_over_expanded":
                                 round(seconds["packed"] / seconds["expanded"], 3)}
    print(json.dumps({"threads": args.threads, "tasks_per_batch": 8, **result}))


if __name__ == "__main__":
    main()
