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
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import yaml

from treeroll.backends.hf import HFBackend
from treeroll.backends.local import build_model, build_word_tokenizer, load_policy
from treeroll.base import Env
from treeroll.config import EvalConfig, PolicyConfig, TrainConfig, config_to_dict
from treeroll.formatting import TurnFormat
from treeroll.plugins import make_env_factory, make_estimator, make_strategy, scorer_name_for
from treeroll.rollout import RolloutConfig, count_status, rollout
from treeroll.strategies import Chain
from treeroll.training.loss import TrainItem, expanded_backward
from treeroll.training.packed import PackingUnsupported, packed_backward, unsupported_reason
from treeroll.tree import (
    RolloutTree,
    TokenCounts,
    export_trajectories,
    leaves,
    save_tree,
    token_counts,
    trajectory_reward,
)

__all__ = ["EvalResult", "Reporter", "evaluate", "task_pools", "train", "wilson_interval"]


class Reporter(Protocol):
    """Receives progress (the CLI shows it with rich progress bars)."""

    def phase(self, text: str, total: int | None = None) -> None:
        """A new phase starts (warm start, evaluation, training)."""
        ...

    def advance(self, done: int, info: dict[str, Any]) -> None:
        """``done`` units of the current phase are finished; ``info`` has live figures."""
        ...


class _Silent:
    def phase(self, text: str, total: int | None = None) -> None:
        pass

    def advance(self, done: int, info: dict[str, Any]) -> None:
        pass


@dataclass
class EvalResult:
    """Held-out success rate with its 95% Wilson interval."""

    success_rate: float
    low: float
    high: float
    tasks: int
    temperature: float

    def as_dict(self) -> dict[str, float]:
        """Plain dict for JSON."""
        return {"success_rate": self.success_rate, "ci95_low": self.low, "ci95_high": self.high,
                "tasks": self.tasks, "temperature": self.temperature}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def task_pools(config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """Training task seeds and held-out seeds (disjoint; held-out drawn from ``eval.seed``)."""
    train = np.random.default_rng(config.env.task_seed).choice(
        1_000_000, size=config.env.train_tasks, replace=False)
    rng = np.random.default_rng(config.eval.seed)
    held_out: list[int] = []
    taken = set(train.tolist())
    needed = max(config.eval.tasks, config.eval.tasks_during)
    while len(held_out) < needed:
        seed = int(rng.integers(1_000_000))
        if seed not in taken:
            taken.add(seed)
            held_out.append(seed)
    return train, np.array(held_out)


def evaluate(backend: HFBackend, turn_format: TurnFormat, make_env: Callable[[], Env],
             seeds: Sequence[int] | np.ndarray, config: EvalConfig, rollout_config: RolloutConfig,
             seed: int = 0) -> EvalResult:
    """Success rate of one trajectory per held-out task."""
    settings = replace(rollout_config, temperature=config.temperature, max_leaves=None,
                       max_generated_tokens=None)
    backend.reset_cache()
    batch = rollout(seeds, make_env, backend, turn_format, Chain(group_size=1),
                    config=settings, seed=seed)
    backend.reset_cache()
    wins = sum(bool(leaf.info.get("success")) for tree in batch.trees for leaf in leaves(tree))
    low, high = wilson_interval(wins, len(seeds))
    return EvalResult(wins / max(len(seeds), 1), low, high, len(seeds), config.temperature)


def build_policy(config: PolicyConfig, make_env: Callable[[], Env], policy_dir: Path
                 ) -> tuple[Any, Any]:
    """Model and tokenizer: from ``model_path``, from the run folder, or built from scratch."""
    if config.model_path:
        return load_policy(config.model_path)
    if (policy_dir / "tokenizer.json").exists():
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(policy_dir)
    else:
        env = make_env()
        texts = env.vocabulary_texts() if hasattr(env, "vocabulary_texts") else []
        if not texts:
            raise ValueError("the environment has no vocabulary_texts(); pass "
                             "policy.model_path with a tokenizer of your own")
        tokenizer = build_word_tokenizer(texts)
        tokenizer.save_pretrained(policy_dir)
    model = build_model(len(tokenizer), config.model, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    return model, tokenizer


def warm_start(model: Any, tokenizer: Any, turn_format: TurnFormat, make_env: Callable[[], Env],
               seeds: np.ndarray, config: PolicyConfig, rng: np.random.Generator,
               reporter: Reporter) -> float:
    """Supervised warm start on synthetic episodes; returns the final loss.

    With ``config.warm_start_skill == 0`` the replies are well formed and their actions
    uniformly random (the first four turns: a *format* warm start that encodes no policy).
    Otherwise whole episodes imitate a noisy planner (``env.expert_reply(rng, skill)``).
    """
    if config.warm_start_skill > 0 and not hasattr(make_env(), "expert_reply"):
        raise ValueError("policy.warm_start_skill > 0 needs an environment with "
                         "expert_reply(rng, skill) (FrozenLake has one); set it to 0")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warm_start_lr)
    reporter.phase("format warm start" if config.warm_start_skill <= 0 else
                   f"imitation warm start (planner skill {config.warm_start_skill:g})",
                   config.warm_start_steps)
    loss_value = float("nan")
    model.train()
    for step in range(config.warm_start_steps):
        sequences, masks = [], []
        for seed in rng.choice(seeds, size=config.warm_start_batch):
            ids, mask = _synthetic_episode(tokenizer, turn_format, make_env(), int(seed), rng,
                                           config.warm_start_skill)
            sequences.append(ids)
            masks.append(mask)
        longest = max(len(s) for s in sequences)
        input_ids = torch.zeros(len(sequences), longest, dtype=torch.long)
        labels = torch.full((len(sequences), longest), -100, dtype=torch.long)
        for b, (ids, mask) in enumerate(zip(sequences, masks, strict=True)):
            input_ids[b, : len(ids)] = torch.tensor(ids)
            labels[b, : len(ids)] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), -100)
        loss = model(input_ids=input_ids, labels=labels).loss  # right padding: no mask needed
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
        reporter.advance(step + 1, {"loss": loss_value})
    model.eval()
    return loss_value


def _synthetic_episode(tokenizer: Any, turn_format: TurnFormat, env: Any, seed: int,
                       rng: np.random.Generator, skill: float = 0.0, max_turns: int = 4
                       ) -> tuple[list[int], list[int]]:
    """Token ids and model-token mask of one synthetic episode: random well-formed replies for
    the first ``max_turns`` turns (the format is the same in every turn), or with ``skill`` >
    0 a whole episode of the environment's noisy planner."""
    ids, _ = turn_format.prompt(env.system_prompt, env.reset(seed))
    mask = [0] * len(ids)
    turns = max_turns if skill <= 0 else 10_000  # planner episodes run until they end
    for _ in range(turns):
        reply = env.expert_reply(rng, skill) if skill > 0 else env.example_reply(rng)
        reply_ids = list(tokenizer.encode(reply, add_special_tokens=False)) + [
            turn_format.eos_token_id]
        ids += reply_ids
        mask += [1] * len(reply_ids)
        observation, _, terminated, truncated, _ = env.step(reply)
        if terminated or truncated:
            break
        obs_ids, _ = turn_format.observation(observation, action_ended_turn=True)
        ids += obs_ids
        mask += [0] * len(obs_ids)
    return ids, mask


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save_checkpoint(path: Path, model: Any, optimizer: Any, step: int,
                     rng: np.random.Generator, extra: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), **extra},
               tmp)
    tmp.replace(path)


def train(config: TrainConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run (or resume) a training run; returns the summary also written to ``summary.json``."""
    reporter = reporter or _Silent()
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = Path(config.runs_dir) / config.name
    checkpoint = run_dir / "checkpoints" / "last.pt"
    if run_dir.exists() and checkpoint.exists() and not config.resume:
        raise FileExistsError(f"run folder {run_dir} already holds a checkpoint; pass --resume "
                              "to continue it or choose another --name")
    if config.resume and not checkpoint.exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))

    make_env = make_env_factory(config.env)
    strategy = make_strategy(config.strategy)
    estimator = make_estimator(config.advantage)
    scorer = None
    scorer_name = scorer_name_for(config.scorer.name, strategy, config.env.name)
    if scorer_name:
        from treeroll.scorers import make_scorer

        scorer = make_scorer(replace(config.scorer, name=scorer_name))
    train_seeds, held_out = task_pools(config)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    model, tokenizer = build_policy(config.policy, make_env, run_dir / "policy")
    turn_format = TurnFormat(tokenizer)
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id or 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr,
                                  weight_decay=config.optim.weight_decay)
    summary: dict[str, Any] = {}
    start_step = 0
    if config.resume:
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        start_step = int(state["step"])
        summary = dict(state.get("summary", {}))
    else:
        if config.policy.warm_start_steps and not config.policy.model_path:
            summary["warm_start_loss"] = warm_start(model, tokenizer, turn_format, make_env,
                                                    train_seeds, config.policy, rng, reporter)
        reporter.phase(f"evaluating the starting policy on {config.eval.tasks} held-out tasks")
        summary["start_eval"] = evaluate(backend, turn_format, make_env,
                                         held_out[: config.eval.tasks], config.eval,
                                         config.rollout).as_dict()
        _append_jsonl(run_dir / "metrics.jsonl", {"step": 0, "eval": summary["start_eval"]})
    ref_model = None
    if config.optim.loss.kl_coef:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)

    step = start_step
    reporter.phase(f"training with {strategy.name if hasattr(strategy, 'name') else strategy}",
                   config.optim.steps)
    cumulative = {"generated": 0, "chain_computed": 0, "computed": 0}
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
            backend.reset_cache()  # cached KV belongs to the old weights
            update_seconds = time.perf_counter() - tick
            # 6. log
            record = _step_record(step, batch.trees, update, rollout_seconds, update_seconds,
                                  batch.timing, cumulative)
            if config.eval.every and step % config.eval.every == 0 and step < config.optim.steps:
                record["eval"] = evaluate(backend, turn_format, make_env,
                                          held_out[: config.eval.tasks_during], config.eval,
                                          config.rollout).as_dict()
            _append_jsonl(run_dir / "metrics.jsonl", record)
            if config.save_trees_every and step % config.save_trees_every == 0:
                save_tree(batch.trees[0], run_dir / "trees" / f"step_{step:05d}.json")
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                _save_checkpoint(checkpoint, model, optimizer, step, rng, {"summary": summary})
            reporter.advance(step, {"success": record["success_rate"],
                                    "saved": record["tokens"]["saved_fraction"]})
    except KeyboardInterrupt:
        _save_checkpoint(checkpoint, model, optimizer, step - 1, rng, {"summary": summary})
        summary["interrupted_at_step"] = step
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        raise
    _save_checkpoint(checkpoint, model, optimizer, config.optim.steps, rng, {"summary": summary})
    reporter.phase(f"evaluating the trained policy on {config.eval.tasks} held-out tasks")
    summary["final_eval"] = evaluate(backend, turn_format, make_env, held_out[: config.eval.tasks],
                                     config.eval, config.rollout).as_dict()
    summary["steps"] = config.optim.steps
    summary["generated_tokens"] = cumulative["generated"]
    _append_jsonl(run_dir / "metrics.jsonl", {"step": config.optim.steps,
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
