"""TRL's GRPOTrainer training the shipped base on FrozenLake with treeroll's tree rollouts.

    pip install 'treeroll[trl]'
    python examples/trl_grpo.py --steps 20            # Tree-GRPO trees (the default)
    python examples/trl_grpo.py --strategy patr       # PATR trees, the environment's scorer

Each step TRL hands the rollout function 2 prompts x 4 repeats; treeroll grows one tree per
prompt and returns its 4 leaves (token ids, environment mask, sampling logprobs); TRL
computes the group advantages and the loss. See docs/trainers/trl.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig, GRPOTrainer

from treeroll.adapters.trl import TreeRolloutFunc, env_reward, task_dataset, tree_credit
from treeroll.config import TrainConfig
from treeroll.policies import load_policy
from treeroll.training.evaluation import task_pools


def main() -> None:
    """Train for ``--steps`` TRL steps and print TRL's last logged figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--strategy", default="tree_grpo",
                        help="chain, tree_grpo, patr, random_tree, arpo, rtpo, igrpo")
    parser.add_argument("--credit", action="store_true",
                        help="train on treeroll's tree credit (advantage.name) instead of "
                        "the environment reward")
    args = parser.parse_args()

    policy = load_policy("frozenlake-tiny")
    base = TrainConfig()
    config = replace(base, env=replace(base.env, name="frozenlake_rllm"),
                     strategy=replace(base.strategy, name=args.strategy))
    rollout_func = TreeRolloutFunc(config, policy.turn_format(), num_generations=4)
    train_seeds, _ = task_pools(config.env, config.eval)  # never the held-out tasks
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=policy.model, processing_class=policy.tokenizer,
            reward_funcs=tree_credit if args.credit else env_reward,
            rollout_func=rollout_func,
            train_dataset=task_dataset(rollout_func, train_seeds[:2 * args.steps]),
            args=GRPOConfig(output_dir=out, per_device_train_batch_size=8, num_generations=4,
                            max_steps=args.steps, learning_rate=5e-4, logging_steps=1,
                            report_to=[], use_cpu=True, beta=0.0, save_strategy="no",
                            max_completion_length=256,
                            scale_rewards="none" if args.credit else "group"))
        trainer.train()
    last = [r for r in trainer.state.log_history if "reward" in r][-1]
    print({k: last[k] for k in ("step", "reward", "reward_std", "completions/mean_length")})


if __name__ == "__main__":
    main()
