"""The default `treeroll train` step with the tree-packed update vs the expanded one, one run.

`bench/train_cost.py --quick` times the loss alone on small batches (2 tasks); this script
times whole training steps as the default config (`configs/frozenlake_rllm.yaml`, rLLM's
FrozenLake convention: Tree-GRPO M=4 N=2 L=1, 8 tasks per step, 2 threads) runs them: the
same policy building and format warm start, then ``--steps`` steps of rollout followed by the
trainer's own update (``ppo_update``: PPO epochs, minibatches, gradient clipping, AdamW step),
once with ``optim.packed`` on and once off, on copies of the same model and optimiser and the
same items, the order alternating per step. Training continues from the packed copy. Both
updates must reach the same weights (checked); the seconds are summed over the steps.

``--strategy chain`` times GRPO's chains instead (G = 8 per task, same everything else).
Last line: one JSON object with ``rollout_s``, ``update_expanded_s``, ``update_packed_s``,
``step_expanded_s``/``step_packed_s`` (rollout + update) and ``packed_over_expanded`` (update
time ratio; < 1 means packing is faster).

    python bench/packed_full_step.py                 # 6 default steps (~2 minutes)
    python bench/packed_full_step.py --strategy chain
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.cli.one_tree import starting_policy
from treeroll.config import load_config
from treeroll.credit import ADVANTAGES
from treeroll.engine.batch import rollout
from treeroll.envs import make_env_factory
from treeroll.strategies import Chain, StrategyConfig, make_strategy
from treeroll.training.evaluation import task_pools
from treeroll.training.packed import unique_tokens
from treeroll.training.trainer import ppo_update, train_items

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "frozenlake_rllm.yaml"


def main() -> None:
    """Time both updates on default training steps; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--strategy", choices=("default", "chain"), default="default")
    args = parser.parse_args()
    config = load_config(args.config)
    if args.strategy == "chain":
        config = replace(config, strategy=StrategyConfig(name="chain", chain=Chain(group_size=8)))
    torch.set_num_threads(config.threads or torch.get_num_threads())
    make_env = make_env_factory(config.env)
    strategy = make_strategy(config.strategy)
    estimator = ADVANTAGES.get(config.advantage.name)
    train_seeds, _ = task_pools(config.env, config.eval)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    policy = starting_policy(config)
    model, tokenizer, turn_format = policy.model, policy.tokenizer, policy.turn_format()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr,
                                  weight_decay=config.optim.weight_decay)
    variants = {"expanded": replace(config, optim=replace(config.optim, packed=False)),
                "packed": replace(config, optim=replace(config.optim, packed=True))}
    seconds = {"rollout": 0.0, "expanded": 0.0, "packed": 0.0}
    tokens = {"expanded": 0, "packed": 0}
    for step in range(1, args.steps + 1):
        tasks = rng.choice(train_seeds, size=config.optim.tasks_per_step, replace=False)
        model.eval()
        tick = time.perf_counter()
        batch = rollout(tasks, make_env, HFBackend(model, pad_token_id=tokenizer.pad_token_id
                                                   or 0), turn_format, strategy,
                        config=config.rollout, seed=int(rng.integers(2**62)),
                        first_group_id=step * config.optim.tasks_per_step)
        seconds["rollout"] += time.perf_counter() - tick
        items = train_items(batch.trees, estimator, config.optim.drop_zero_variance)
        tokens["expanded"] += sum(len(i.trajectory.prompt_ids) + len(i.trajectory.response_ids)
                                  for i in items)
        tokens["packed"] += unique_tokens(items)
        update_seed = int(rng.integers(2**62))
        results = {}
        order = ("expanded", "packed") if step % 2 else ("packed", "expanded")
        for name in order:
            copy_model = copy.deepcopy(model)
            copy_optimizer = torch.optim.AdamW(copy_model.parameters(), lr=config.optim.lr,
                                               weight_decay=config.optim.weight_decay)
            copy_optimizer.load_state_dict(optimizer.state_dict())
            tick = time.perf_counter()
            metrics = ppo_update(copy_model, copy_optimizer, items, variants[name], None,
                                 np.random.default_rng(update_seed))
            seconds[name] += time.perf_counter() - tick
            results[name] = (copy_model, copy_optimizer, metrics)
        losses = [results[name][2]["loss"] for name in ("packed", "expanded")]
        difference = abs(losses[0] - losses[1]) / max(abs(losses[1]), 1e-12)
        model, optimizer, _ = results["packed"]
        print(f"step {step}: {len(items)} leaves, rollout {seconds['rollout']:.1f}s, update "
              f"expanded {seconds['expanded']:.1f}s packed {seconds['packed']:.1f}s "
              f"(cumulative), mean loss relative difference {difference:.1e}",
              flush=True)
        if difference > 1e-3:
            raise SystemExit(f"packed and expanded updates disagree (loss {losses})")
    result = {
        "config": Path(args.config).name, "strategy": strategy.name, "steps": args.steps,
        "threads": torch.get_num_threads(), "tasks_per_step": config.optim.tasks_per_step,
        "rollout_s": round(seconds["rollout"], 2),
        "update_expanded_s": round(seconds["expanded"], 2),
        "update_packed_s": round(seconds["packed"], 2),
        "step_expanded_s": round((seconds["rollout"] + seconds["expanded"]) / args.steps, 2),
        "step_packed_s": round((seconds["rollout"] + seconds["packed"]) / args.steps, 2),
        "tokens_ratio": round(tokens["expanded"] / max(tokens["packed"], 1), 3),
        "packed_over_expanded": round(seconds["packed"] / seconds["expanded"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
