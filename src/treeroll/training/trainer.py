"""The training loop: sample tasks -> roll out -> rewards -> advantages -> update -> log.

A run lives in ``<runs_dir>/<name>/``: ``config.yaml`` (resolved), ``metrics.jsonl`` (one JSON
object per step, flushed as written), ``policy/`` (tokenizer and config of the model),
``checkpoints/last.pt`` (model, optimiser, step, RNG; written atomically), ``trees/`` (sampled
trees as JSON), ``eval.json`` and plots. ``resume=True`` continues from the last checkpoint;
Ctrl-C writes a checkpoint first, so an interrupted run folder is usable.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.config import TrainConfig, config_to_dict
from treeroll.plugins import make_env_factory, make_estimator, make_strategy, scorer_name_for
from treeroll.policies import build_policy
from treeroll.rollout import count_status, rollout
from treeroll.training.evaluation import Reporter, Silent, evaluate, task_pools
from treeroll.training.loss import TrainItem, expanded_backward
from treeroll.training.packed import PackingUnsupported, packed_backward, unsupported_reason
from treeroll.training.runfolder import RunFolder, append_jsonl, load_checkpoint, save_checkpoint
from treeroll.training.sft_run import format_warm_start
from treeroll.tree import (
    RolloutTree,
    TokenCounts,
    export_trajectories,
    leaves,
    save_tree,
    token_counts,
    trajectory_reward,
)

__all__ = ["train"]


def train(config: TrainConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run (or resume) a training run; returns the summary also written to ``summary.json``."""
    reporter = reporter or Silent()
    if config.threads:
        torch.set_num_threads(config.threads)
    folder = RunFolder(config.runs_dir, config.name, config.resume)
    resolved = config_to_dict(config)
    folder.check_config(resolved, ("optim.steps", "eval", "checkpoint_every",
                                   "save_trees_every", "threads"))
    run_dir, checkpoint = folder.path, folder.checkpoint

    make_env = make_env_factory(config.env)
    strategy = make_strategy(config.strategy)
    estimator = make_estimator(config.advantage)
    scorer = None
    scorer_name = scorer_name_for(config.scorer.name, strategy, config.env.name)
    if scorer_name:
        from treeroll.scorers import make_scorer

        scorer = make_scorer(replace(config.scorer, name=scorer_name))
    train_seeds, held_out = task_pools(config.env, config.eval)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                          make_env, run_dir / "policy" if config.resume else None)
    folder.start(resolved)
    if not config.policy.init and not config.resume:
        policy.tokenizer.save_pretrained(run_dir / "policy")
    model, tokenizer, turn_format = policy.model, policy.tokenizer, policy.turn_format()
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id or 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr,
                                  weight_decay=config.optim.weight_decay)
    summary: dict[str, Any] = {}
    start_step = 0
    cumulative = {"generated": 0, "chain_computed": 0, "computed": 0}
    if config.resume:
        state = load_checkpoint(checkpoint, rng)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = int(state["step"])
        summary = dict(state.get("summary", {}))
        cumulative.update(summary.get("cumulative", {}))
        folder.keep_records_until(start_step)
    else:
        if config.policy.warm_start_steps and not config.policy.init:
            summary["warm_start_loss"] = format_warm_start(policy, make_env, train_seeds,
                                                           config.policy, rng, reporter)
        reporter.phase(f"evaluating the starting policy on {config.eval.tasks} held-out tasks")
        summary["start_eval"] = evaluate(backend, turn_format, make_env,
                                         held_out[: config.eval.tasks], config.eval,
                                         config.rollout).as_dict()
        append_jsonl(run_dir / "metrics.jsonl", {"step": 0, "eval": summary["start_eval"]})
    ref_model = None
    if config.optim.loss.kl_coef:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)

    done = start_step  # the last step whose update was applied

    def save() -> None:
        summary["cumulative"] = dict(cumulative)
        save_checkpoint(checkpoint, {"model": model.state_dict(),
                                     "optimizer": optimizer.state_dict(), "step": done,
                                     "summary": summary}, rng)

    reporter.phase(f"training with {strategy.name if hasattr(strategy, 'name') else strategy}",
                   config.optim.steps)
    try:
        for step in range(start_step + 1, config.optim.steps + 1):
            tick = time.perf_counter()
            # 1. sample tasks, 2. roll out
            tasks = rng.choice(train_seeds, size=config.optim.tasks_per_step, replace=False)
            model.eval()
            batch = rollout(tasks, make_env, backend, turn_format, strategy,
                            config=config.rollout, scorer=scorer, seed=int(rng.integers(2**62)),
                            first_group_id=step * config.optim.tasks_per_step)
            rollout_seconds = time.perf_counter() - tick
            if scorer is not None and hasattr(scorer, "observe"):  # learns online (value scorer)
                scorer.observe(batch.trees)
            # 3. rewards and 4. advantages, per task group
            items = _train_items(batch.trees, estimator, config.optim.drop_zero_variance)
            # 5. update
            tick = time.perf_counter()
            update = _update(model, optimizer, items, config, ref_model, rng)
            done = step
            backend.reset_cache()  # cached KV belongs to the old weights
            update_seconds = time.perf_counter() - tick
            # 6. log
            record = _step_record(step, batch.trees, update, rollout_seconds, update_seconds,
                                  batch.timing, cumulative)
            if config.eval.every and step % config.eval.every == 0 and step < config.optim.steps:
                record["eval"] = evaluate(backend, turn_format, make_env,
                                          held_out[: config.eval.tasks_during], config.eval,
                                          config.rollout).as_dict()
            append_jsonl(run_dir / "metrics.jsonl", record)
            if config.save_trees_every and step % config.save_trees_every == 0:
                save_tree(batch.trees[0], run_dir / "trees" / f"step_{step:05d}.json")
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                save()
            reporter.advance(step, {"success": record["success_rate"],
                                    "saved": record["tokens"]["saved_fraction"]})
    except KeyboardInterrupt:
        save()
        summary["interrupted_at_step"] = done + 1
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        raise
    save()
    reporter.phase(f"evaluating the trained policy on {config.eval.tasks} held-out tasks")
    summary["final_eval"] = evaluate(backend, turn_format, make_env, held_out[: config.eval.tasks],
                                     config.eval, config.rollout).as_dict()
    summary["steps"] = config.optim.steps
    summary["generated_tokens"] = cumulative["generated"]
    append_jsonl(run_dir / "metrics.jsonl", {"step": config.optim.steps, "final": True,
                                              "eval": summary["final_eval"]})
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _write_plots(run_dir)
    return summary


def _train_items(trees: list[RolloutTree], estimator: Any, drop_zero_variance: bool
                 ) -> list[TrainItem]:
    items: list[TrainItem] = []
    for tree in trees:
        trajectories = export_trajectories(tree)
        if not trajectories:
            continue
        if drop_zero_variance and len({t.reward for t in trajectories}) == 1:
            continue
        advantages = estimator(tree)
        items.extend(TrainItem(t, float(a))
                     for t, a in zip(trajectories, advantages, strict=True))
    return items


def _update(model: Any, optimizer: Any, items: list[TrainItem], config: TrainConfig,
            ref_model: Any, rng: np.random.Generator) -> dict[str, float]:
    """PPO epochs over ``items`` in minibatches of whole task groups (a tree's leaves stay
    together: packing forwards their shared prefixes once); as many minibatches per epoch as
    ``optim.minibatches`` asks, at most one per group. Returns every metric averaged over the
    minibatches, each weighted by its model tokens, and ``optimizer_steps``."""
    if not items:
        return {"skipped": 1.0}
    # Ratios compare like with like: the update uses the temperature the rollout sampled at.
    loss_config = replace(config.optim.loss, temperature=config.rollout.temperature or 1.0)
    backward = expanded_backward
    if config.optim.packed:
        reason = next((r for r in (unsupported_reason(m) for m in (model, ref_model)
                                   if m is not None) if r), None)
        if reason is None:
            backward = packed_backward
        else:
            warnings.warn(f"optim.packed: {reason}; training on expanded leaves instead",
                          stacklevel=2)
    groups: dict[int, list[TrainItem]] = {}
    for item in items:
        groups.setdefault(item.trajectory.group_id, []).append(item)
    members = list(groups.values())
    totals: dict[str, float] = {}
    weight, steps = 0.0, 0
    model.train()
    for _ in range(config.optim.ppo_epochs):
        order = rng.permutation(len(members))
        for chunk in np.array_split(order, min(config.optim.minibatches, len(members))):
            batch = [item for g in chunk for item in members[g]]
            optimizer.zero_grad()
            try:
                metrics = backward(model, batch, loss_config, ref_model)
            except PackingUnsupported as err:
                warnings.warn(f"optim.packed: {err}; training on expanded leaves instead",
                              stacklevel=2)
                backward = expanded_backward
                optimizer.zero_grad()
                metrics = backward(model, batch, loss_config, ref_model)
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(
                model.parameters(), config.optim.max_grad_norm))
            optimizer.step()
            tokens = float(sum(sum(item.trajectory.response_mask) for item in batch))
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + tokens * value
            weight, steps = weight + tokens, steps + 1
    model.eval()
    averaged = {key: total / max(weight, 1.0) for key, total in totals.items()}
    averaged["optimizer_steps"] = float(steps)
    return averaged


def _step_record(step: int, trees: list[RolloutTree], update: dict[str, float],
                 rollout_seconds: float, update_seconds: float, timing: dict[str, float],
                 cumulative: dict[str, int]) -> dict[str, Any]:
    counts = sum((token_counts(t) for t in trees), TokenCounts())
    per_tree = [leaves(t) for t in trees]
    per_tree_rewards = [[trajectory_reward(leaf) for leaf in group] for group in per_tree]
    group = [leaf for tree_leaves in per_tree for leaf in tree_leaves]
    rewards = [r for tree_rewards in per_tree_rewards for r in tree_rewards]
    cumulative["generated"] += counts.generated
    cumulative["computed"] += counts.computed
    cumulative["chain_computed"] += counts.chain_generated + counts.chain_prefill
    chain = counts.chain_generated + counts.chain_prefill
    return {
        "step": step,
        "success_rate": float(np.mean([bool(leaf.info.get("success")) for leaf in group]))
        if group else 0.0,
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "leaves": len(group),
        # Groups whose leaves' rewards differ: the only ones that give GRPO a gradient.
        "signal_groups": float(np.mean([len(set(r)) > 1 for r in per_tree_rewards]))
        if trees else 0.0,
        "generated_tokens": counts.generated,
        "cumulative_generated_tokens": cumulative["generated"],
        "tokens": {**counts.as_dict(),
                   "saved_fraction": 1 - counts.computed / chain if chain else 0.0},
        "status": count_status(trees),
        "rollout_seconds": rollout_seconds,
        "update_seconds": update_seconds,
        "timing": timing,
        **update,
    }


def _write_plots(run_dir: Path) -> None:
    try:
        from treeroll.viz import plot_metrics

        plot_metrics(run_dir / "metrics.jsonl", run_dir / "metrics.png",
                     keys=("success_rate", "reward_mean", "loss", "entropy", "generated_tokens"))
    except Exception as err:  # a plot must never lose a finished run
        (run_dir / "plot_error.txt").write_text(f"could not plot metrics: {err}\n")
