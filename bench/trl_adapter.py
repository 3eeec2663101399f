"""TRL's GRPOTrainer with treeroll's rollout_func, beside TRL's own generation.

Runs of TRL's real ``GRPOTrainer`` (``trl==1.16.0``) on CPU, each from a fresh copy of the
shipped base ``frozenlake-tiny``, on the same training prompts (FrozenLake in rLLM's
convention, task seeds from the training pool drawn from seed 0), two tasks per step, the same
optimiser settings:

* ``trl``: TRL's own generation (no ``rollout_func``), ``num_generations`` = 4. TRL samples one
  completion per row with ``transformers.generate`` and cannot step the environment (its
  multi-turn hook, ``environment_factory``, needs a chat template with tool calls, which the
  tiny policy does not have), so each completion is the first reply only, rewarded by one
  environment step;
* ``chain``: :class:`treeroll.adapters.trl.TreeRolloutFunc` with G independent chains (whole
  multi-turn episodes, rewarded by the environment), at G = 4 and G = 8;
* ``tree``: the same with :class:`treeroll.strategies.EarlyForks` (one chain, the other
  G - 1 leaves forked from it as it goes, each at a turn drawn from its first 4: exactly G
  leaves, nothing thrown away), at G = 4 and G = 8;
* ``tree_repeat``: the same with ``EarlyForks(on_end="repeat")`` (a branch that ends before
  its split repeats its row for the rows it still owed, so every row is a sample of the
  policy's episodes; a repeat decodes nothing and counts as a completion), at G = 4 and 8;
* ``tree_grpo_cut``: Tree-GRPO (m=2, n=2, l=1 under a 4-leaf budget) cut to G = 4, the
  adapter's earlier way (a tree grown to its own shape, then cut).

Generated tokens per completion: for treeroll, the tokens the backend decoded for the trees
(every node's action, a shared turn once, top-up chains and leaves not handed over included)
divided by the rows returned; for TRL, its completions' lengths. Wall time per step is the
trainer's ``train_runtime`` over its steps. Prints a table and, as its last line, one JSON
object: ``tree_over_chain_tokens_per_completion`` (G = 4) and ``..._g8``, the same for wall
time per step, ``tree_repeat_over_chain_...`` the same four for ``tree_repeat``,
``tree_grpo_cut_over_chain_tokens_per_completion``,
``model_tokens_per_row_tree`` / ``_chain`` (a row's own model tokens: what an independent
sample of that row would decode), the per-step wall times and, for treeroll, the part of it
spent in the ``rollout_func``.

Usage: ``python bench/trl_adapter.py --quick`` (4 steps each, about a minute here) or without
``--quick`` (20 steps each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from treeroll.adapters.trl import TreeRolloutFunc, env_reward, task_dataset
from treeroll.config import EvalConfig, TrainConfig
from treeroll.envs import EnvConfig, make_frozenlake
from treeroll.policies import load_policy
from treeroll.strategies import Chain, EarlyForks, TreeGRPO
from treeroll.training.evaluation import task_pools


def arguments(steps: int, out: str, max_completion_length: int = 256, group: int = 4) -> Any:
    """The GRPOConfig every run shares (two tasks per step of ``group`` completions each)."""
    from trl import GRPOConfig

    return GRPOConfig(output_dir=out, per_device_train_batch_size=2 * group,
                      num_generations=group,
                      max_steps=steps, learning_rate=5e-4, logging_steps=1, report_to=[],
                      use_cpu=True, beta=0.0, save_strategy="no",
                      max_completion_length=max_completion_length, bf16=False, seed=0,
                      temperature=1.0)


def one_step_reward(completions: list[str], task_seed: list[int], **kwargs: Any) -> list[float]:
    """TRL-native rows: the environment's reward for the reply as the first action."""
    rewards = []
    for text, seed in zip(completions, task_seed, strict=True):
        env = make_frozenlake("rllm")
        env.reset(int(seed))
        rewards.append(float(env.step(text)[1]))
    return rewards


def run_tree(strategy: str, seeds: list[int], steps: int, group: int = 4,
             early_forks: EarlyForks | None = None, rollout_seed: int = 0) -> dict[str, Any]:
    """TRL with treeroll's rollout_func (``group`` completions a prompt, grown by
    ``strategy`` or as ``early_forks``, rollouts seeded by ``rollout_seed``); tokens decoded
    and rows returned, in all and per step (``per_step``: generated tokens, rows and mean
    row reward of each call)."""
    from trl import GRPOTrainer

    torch.manual_seed(0)
    policy = load_policy("frozenlake-tiny")
    base = TrainConfig()
    config = replace(base, env=replace(base.env, name="frozenlake_rllm"),
                     strategy=replace(base.strategy, name=strategy,
                                      chain=Chain(group_size=group),
                                      tree_grpo=TreeGRPO(m=2, n=2, l=1)))
    rollout_func = TreeRolloutFunc(config, policy.turn_format(), num_generations=group,
                                   early_forks=early_forks, seed=rollout_seed)
    counts = {"generated": 0, "rows": 0, "row_model_tokens": 0, "rollout_s": 0.0}
    per_step: list[dict[str, float]] = []

    def counting(prompts: Any, trainer: Any) -> dict[str, Any]:
        tick = time.perf_counter()
        out = rollout_func(prompts, trainer)
        counts["rollout_s"] += time.perf_counter() - tick
        generated = sum(len(n.action_ids) for g in rollout_func.last_groups
                        for n in g.tree.nodes)
        counts["generated"] += generated
        counts["rows"] += len(out["completion_ids"])
        counts["row_model_tokens"] += sum(sum(m) for m in out["env_mask"])
        per_step.append({"generated": generated, "rows": len(out["completion_ids"]),
                         "reward": float(np.mean(out["tree_reward"]))})
        return out

    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(model=policy.model, processing_class=policy.tokenizer,
                              reward_funcs=env_reward, rollout_func=counting,
                              train_dataset=task_dataset(rollout_func, seeds),
                              args=arguments(steps, out, group=group))
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
    return {"tokens_per_completion": counts["generated"] / counts["rows"],
            "model_tokens_per_row": counts["row_model_tokens"] / counts["rows"],
            "wall_per_step": wall / steps, "rollout_per_step": counts["rollout_s"] / steps,
            "reward": float(np.mean([r["reward"] for r in trainer.state.log_history
                                     if "reward" in r])),
            "per_step": per_step}


def run_trl(seeds: list[int], steps: int) -> dict[str, float]:
    """TRL's own single-turn generation on the same prompts."""
    from datasets import Dataset
    from trl import GRPOTrainer

    torch.manual_seed(0)
    policy = load_policy("frozenlake-tiny")
    turn_format = policy.turn_format()
    env = make_frozenlake("rllm")
    prompts = []
    for seed in seeds:
        _, text = turn_format.prompt(env.system_prompt, env.reset(seed))
        prompts.append(text)
    dataset = Dataset.from_dict({"prompt": prompts, "task_seed": seeds})
    with tempfile.TemporaryDirectory() as out:
        args = arguments(steps, out, max_completion_length=24)
        trainer = GRPOTrainer(model=policy.model, processing_class=policy.tokenizer,
                              reward_funcs=one_step_reward, train_dataset=dataset, args=args)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
    logs = [r for r in trainer.state.log_history if "completions/mean_length" in r]
    return {"tokens_per_completion": float(np.mean([r["completions/mean_length"]
                                                   for r in logs])),
            "wall_per_step": wall / steps,
            "reward": float(np.mean([r["reward"] for r in logs]))}


def main(argv: list[str] | None = None) -> None:
    """Run the three trainers and print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 steps per run (else 20)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = 4 if args.quick else 20
    train, _ = task_pools(EnvConfig(name="frozenlake_rllm"), EvalConfig())
    seeds = [int(s) for s in train[:2 * steps]]
    results = {"trl": run_trl(seeds, steps), "chain": run_tree("chain", seeds, steps),
               "tree_grpo_cut": run_tree("tree_grpo", seeds, steps),
               "tree": run_tree("chain", seeds, steps, early_forks=EarlyForks(group_size=4)),
               "chain_g8": run_tree("chain", seeds, steps, group=8),
               "tree_g8": run_tree("chain", seeds, steps, group=8,
                                   early_forks=EarlyForks(group_size=8)),
               "tree_repeat": run_tree("chain", seeds, steps,
                                       early_forks=EarlyForks(group_size=4, on_end="repeat")),
               "tree_repeat_g8": run_tree("chain", seeds, steps, group=8,
                                          early_forks=EarlyForks(group_size=8,
                                                                 on_end="repeat"))}
    print(f"{'run':14s} {'tokens/completion':>18s} {'wall/step s':>12s} {'mean reward':>12s}",
          file=sys.stderr)
    for name, r in results.items():
        print(f"{name:14s} {r['tokens_per_completion']:18.2f} {r['wall_per_step']:12.3f} "
              f"{r['reward']:12.3f}", file=sys.stderr)
    tree, chain, trl = results["tree"], results["chain"], results["trl"]
    cut, tree8, chain8 = results["tree_grpo_cut"], results["tree_g8"], results["chain_g8"]

    def ratio(a: dict[str, float], b: dict[str, float], key: str) -> float:
        return round(a[key] / b[key], 4)

    print(json.dumps({
        "tree_over_chain_tokens_per_completion": ratio(tree, chain, "tokens_per_completion"),
        "tree_over_chain_tokens_per_completion_g8": ratio(tree8, chain8,
                                                          "tokens_per_completion"),
        "tree_over_chain_wall_per_step": ratio(tree, chain, "wall_per_step"),
        "tree_over_chain_wall_per_step_g8": ratio(tree8, chain8, "wall_per_step"),
        "tree_repeat_over_chain_tokens_per_completion": ratio(results["tree_repeat"], chain,
                                                              "tokens_per_completion"),
        "tree_repeat_over_chain_tokens_per_completion_g8": ratio(results["tree_repeat_g8"],
                                                                 chain8, "tokens_per_completion"),
        "tree_repeat_over_chain_wall_per_step": ratio(results["tree_repeat"], chain,
                                                      "wall_per_step"),
        "tree_repeat_over_chain_wall_per_step_g8": ratio(results["tree_repeat_g8"], chain8,
                                                         "wall_per_step"),
        "tree_grpo_cut_over_chain_tokens_per_completion": ratio(cut, chain,
                                                                "tokens_per_completion"),
        "tree_over_trl_tokens_per_completion": ratio(tree, trl, "tokens_per_completion"),
        "tree_tokens_per_completion": round(tree["tokens_per_completion"], 2),
        "chain_tokens_per_completion": round(chain["tokens_per_completion"], 2),
        "tree_grpo_cut_tokens_per_completion": round(cut["tokens_per_completion"], 2),
        "tree_g8_tokens_per_completion": round(tree8["tokens_per_completion"], 2),
        "chain_g8_tokens_per_completion": round(chain8["tokens_per_completion"], 2),
        "trl_tokens_per_completion": round(trl["tokens_per_completion"], 2),
        "model_tokens_per_row_tree": round(tree["model_tokens_per_row"], 2),
        "model_tokens_per_row_chain": round(chain["model_tokens_per_row"], 2),
        "tree_wall_per_step": round(tree["wall_per_step"], 3),
        "chain_wall_per_step": round(chain["wall_per_step"], 3),
        "tree_g8_wall_per_step": round(tree8["wall_per_step"], 3),
        "chain_g8_wall_per_step": round(chain8["wall_per_step"], 3),
        "trl_wall_per_step": round(trl["wall_per_step"], 3),
        "tree_rollout_per_step": round(tree["rollout_per_step"], 3),
        "chain_rollout_per_step": round(chain["rollout_per_step"], 3),
        "tree_over_trl_wall_per_step": ratio(tree, trl, "wall_per_step"),
        "steps": steps, "num_generations": [4, 8], "tasks_per_step": 2,
        "early_forks": {"chains": 1, "within": 4},
    }))


if __name__ == "__main__":
    main()
