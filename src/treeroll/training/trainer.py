"""The training loop: sample tasks -> roll out -> rewards -> advantages -> update -> log.

A run lives in ``<runs_dir>/<name>/``: ``config.yaml`` (resolved), ``metrics.jsonl`` (one JSON
object per step, flushed as written), ``policy/`` (the tokenizer of a from-scratch model;
when the run finishes, the trained policy as a policy folder),
``checkpoints/last.pt`` (model, optimiser, step, RNG; written atomically), ``trees/`` (sampled
trees as JSON), ``eval.json`` and plots. ``resume=True`` continues from the last checkpoint;
Ctrl-C writes a checkpoint first, so an interrupted run folder is usable.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.assemble import assemble
from treeroll.backends import sync_weights
from treeroll.base import (
    AdvantageEstimator,
    BatchAdvantageEstimator,
    LearningScorer,
    plugin_name,
)
from treeroll.config import TrainConfig
from treeroll.config_checks import check_config
from treeroll.credit.estimators import token_credit, weighted
from treeroll.engine.batch import count_status, rollout
from treeroll.policies import build_policy, check_context_length, save_policy
from treeroll.training.behaviour import StaleBehaviour
from treeroll.training.evaluation import (
    EvalResult,
    QuietReporter,
    Reporter,
    evaluate,
    pool_words,
    task_pools,
)
from treeroll.training.lifecycle import Lifecycle
from treeroll.training.loss import TrainItem
from treeroll.training.runfolder import (
    append_jsonl,
    check_state_fits,
    deferred_interrupt,
)
from treeroll.training.sft import adamw
from treeroll.training.sft_run import format_warm_start
from treeroll.training.tensorboard import ScalarLog
from treeroll.training.update import ppo_update
from treeroll.tree import (
    RolloutTree,
    TokenCounts,
    export_trajectories,
    leaves,
    token_counts,
    trajectory_reward,
)
from treeroll.tree_json import save_tree

__all__ = ["ppo_update", "train", "train_items"]


RESUMABLE_CHANGES = ("optim.steps", "eval", "checkpoint_every", "save_trees_every", "threads",
                     "runs_dir", "wandb",
                     "resume", "extend", "force")
"""Settings a resumed run may change (they do not alter what the run computes per step)."""


def train(config: TrainConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run (or resume) a training run; returns the summary also written to ``summary.json``.

    Every setting is checked first (one error lists every invalid value). A resumed run
    continues exactly: the checkpoint holds the model, the optimiser, every RNG and the
    counters, and the metrics after it are dropped and recomputed, so ``kill -9`` then
    ``--resume`` gives the uninterrupted run's metrics and weights. A finished run is resumed
    only with ``--extend`` and more ``--optim.steps``."""
    reporter = reporter or QuietReporter()
    check_config(config)
    lifecycle = Lifecycle(config, resumable=RESUMABLE_CHANGES, extend=config.extend,
                     steps=config.optim.steps, force=config.force)
    with lifecycle.starting():  # a failed start leaves no run folder
        run = _TrainingRun(config, lifecycle, reporter)
    return run.train()


class _TrainingRun:
    """One training run's state: what :func:`train` builds, steps and checkpoints."""

    def __init__(self, config: TrainConfig, lifecycle: Lifecycle, reporter: Reporter) -> None:
        self.config, self.lifecycle, self.reporter = config, lifecycle, reporter
        self.folder = lifecycle.folder
        resolved = lifecycle.resolved
        self._build_plug_ins()
        self.train_seeds, self.held_out = task_pools(config.env, config.eval)
        torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        state = self._load_policy(resolved)
        self.summary: dict[str, Any] = {"chat_template": self._template_report()}
        self.cumulative = {"generated": 0, "chain_computed": 0, "computed": 0}
        self.done = 0  # the last step whose update was applied
        self.updating = False
        if state is not None:
            self._resume_from(state)
        else:
            self._start_eval()
        self._build_behaviour_and_reference(state)
        self._open_logs(resolved)

    def _template_report(self) -> dict[str, Any]:
        """The chat template's report (:meth:`TurnFormat.template_report`), said in one line
        when the template rewrites earlier turns (contexts stay append-only)."""
        report = self.turn_format.template_report()
        if report.get("template") and not report["prefix_preserving"]:
            warnings.warn("the chat template rewrites earlier turns (at token "
                          f"{report['differs_at']}: appended {report['appended']!r}, the "
                          f"template renders {report['template_renders']!r}); treeroll keeps "
                          "contexts append-only, as the model saw them", stacklevel=2)
        return report

    def _build_plug_ins(self) -> None:
        """Environment factory, strategy, estimator and scorer (a bad allocator fails here,
        before any work)."""
        self.parts = assemble(self.config)
        self.make_env, self.strategy = self.parts.make_env, self.parts.strategy
        self.estimator, self.scorer = self.parts.estimator, self.parts.scorer

    def _load_policy(self, resolved: dict[str, Any]) -> dict[str, Any] | None:
        """The policy, its backend and optimiser; the checkpoint's state when resuming
        (checked against the model before the run folder is touched)."""
        config, folder = self.config, self.folder
        run_dir = folder.path
        policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                              self.make_env, run_dir / "policy" if folder.resume else None,
                              system_in_user=config.policy.system_in_user)
        check_context_length(policy, self.make_env, config.rollout.max_turn_tokens,
                             self.train_seeds)
        state = None
        if folder.resume:
            state = self.lifecycle.restore(self.rng)
            check_state_fits(policy.model, state["model"], folder.checkpoint)
        folder.start(resolved)
        if not config.policy.init and not folder.resume:
            policy.tokenizer.save_pretrained(run_dir / "policy")
        self.policy, self.model = policy, policy.model
        self.turn_format = policy.turn_format()
        self.backend = self.parts.backend(policy)
        self.optimizer = adamw(self.model, lr=config.optim.lr,
                               weight_decay=config.optim.weight_decay)
        return state

    def _resume_from(self, state: dict[str, Any]) -> None:
        """Weights, optimiser, step and summary of a checkpoint; later records dropped."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.done = int(state["step"])
        self.summary = dict(state.get("summary", {}))
        self.cumulative.update(self.summary.get("cumulative", {}))
        self.folder.keep_records_until(self.done)

    def _build_behaviour_and_reference(self, state: dict[str, Any] | None) -> None:
        """The lagged behaviour policy (``optim.behaviour_lag``) and the KL reference."""
        config = self.config
        self.behaviour: StaleBehaviour | None = None  # the starting (or resumed) weights
        self.rollout_backend = self.backend
        if config.optim.behaviour_lag:
            self.behaviour = StaleBehaviour(self.model, config.optim.behaviour_lag,
                                            None if state is None else state["behaviour"])
            self.rollout_backend = self.parts.backend(
                replace(self.policy, model=self.behaviour.model))
        self.ref_model = None
        if config.optim.loss.kl_coef:
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

    def _open_logs(self, resolved: dict[str, Any]) -> None:
        """TensorBoard (and W&B) scalars, continuing a resumed run's."""
        config, folder = self.config, self.folder
        mirrors = []
        if config.wandb.project is not None:
            from treeroll.training.wandb_log import WandbLog

            mirrors.append(WandbLog(folder.path, config.wandb, name=config.name,
                                    config=resolved, resume=folder.resume))
        self.scalars = ScalarLog(folder.path, resume_step=self.done if folder.resume else None,
                                 mirrors=mirrors)
        if not folder.resume:
            self.scalars.record(0, {"eval": self.summary["start_eval"]})

    def _start_eval(self) -> None:
        config = self.config
        if config.policy.warm_start_steps and not config.policy.init:
            self.summary["warm_start_loss"] = format_warm_start(
                self.policy, self.make_env, self.train_seeds, config.policy, self.rng,
                self.reporter)
        record = self._evaluate_end("start", "the starting policy")
        append_jsonl(self.folder.metrics, {"step": 0, **record})

    def _evaluate_end(self, end: str, what: str) -> dict[str, Any]:
        """The start's or the end's evaluation, on ``eval.tasks`` tasks (``<end>_eval`` in the
        summary); when the run also evaluates during training (``eval.every``) on fewer
        tasks, the same evaluation read on its first ``eval.tasks_during`` too
        (``<end>_eval_during``: with it the curve compares the same tasks throughout; with
        more tasks during training than at the ends there is none). Returns the metrics
        record's evaluation keys."""
        evaluation = self.config.eval
        result = self._evaluate(evaluation.tasks, what)
        self.summary[f"{end}_eval"] = result.as_dict()
        record = {"eval": self.summary[f"{end}_eval"]}
        if evaluation.every and evaluation.tasks_during < evaluation.tasks:
            self.summary[f"{end}_eval_during"] = result.first(evaluation.tasks_during).as_dict()
            record["eval_during"] = self.summary[f"{end}_eval_during"]
        return record

    def _evaluate(self, tasks: int, what: str | None = None) -> EvalResult:
        """Held-out evaluation on the first ``tasks`` tasks; a phase of its own with
        per-task progress when ``what`` names it (not during training: the training bar
        goes on)."""
        reporter = None
        if what is not None:
            reporter = self.reporter
            reporter.phase(f"evaluating {what} on {tasks} {pool_words(self.config.eval)} tasks",
                           tasks)
        return evaluate(self.backend, self.turn_format, self.make_env, self.held_out[:tasks],
                        self.config.eval, self.config.rollout, reporter=reporter)

    def save(self) -> None:
        """Checkpoint the state after step ``done`` (atomically)."""
        self.summary["cumulative"] = dict(self.cumulative)
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": self.done, "summary": self.summary}
        if self.behaviour is not None:
            state["behaviour"] = self.behaviour.state()
        self.lifecycle.save(state, self.rng)

    def train(self) -> dict[str, Any]:
        """The training loop, then the final evaluation; a crash or Ctrl-C between steps
        checkpoints the last finished step first (an update is never cut in half: Ctrl-C
        during one takes effect after it)."""
        config, run_dir = self.config, self.folder.path
        name = plugin_name(self.strategy)
        self.reporter.phase(f"training with {name}", config.optim.steps)

        def save_whole() -> None:  # a half-applied update is not saved: the last one stands
            if not self.updating:
                self.save()

        with self.lifecycle.interruptible(save_whole, self.summary, lambda: self.done + 1), \
                self.scalars:
            for here, step in enumerate(range(self.done + 1, config.optim.steps + 1), 1):
                tick = time.perf_counter()
                self._step(step)
                self.lifecycle.check_pace(here, step, config.optim.steps,
                                          time.perf_counter() - tick)
                if step % config.checkpoint_every == 0:
                    self.save()
            self.save()
            final = self._evaluate_end("final", "the trained policy")
            self.scalars.record(config.optim.steps, {"eval": self.summary["final_eval"]})
        self.summary["steps"] = config.optim.steps
        self.summary["generated_tokens"] = self.cumulative["generated"]
        self._export()
        self.summary["finished"] = True
        append_jsonl(self.folder.metrics, {"step": config.optim.steps, "final": True, **final})
        self.lifecycle.write_summary(self.summary)
        _write_plots(run_dir)
        return self.summary

    def _export(self) -> None:
        """Write the trained policy as a policy folder, ``<run>/policy`` (weights, tokenizer,
        turn settings and a model card): every command takes it, or the run folder, as
        ``--policy``."""
        config, final = self.config, self.summary.get("final_eval", {})
        card = "\n".join([
            f"# {config.name}", "",
            "A treeroll policy folder exported by `treeroll train` (load it with "
            "`--policy <this folder>` or `--policy <the run folder>`).", "",
            f"- Start: {config.policy.init or 'from scratch'}",
            f"- Training: {config.optim.steps} steps of {config.strategy.name} on "
            f"{config.env.name}",
            f"- Held-out success after training: {final.get('success', float('nan')):.3f} "
            f"({config.eval.tasks} tasks, {pool_words(config.eval)})", ""])
        save_policy(self.policy, self.folder.path / "policy",
                    card=card, meta={"made_by": "treeroll train", "init": config.policy.init,
                                     "steps": config.optim.steps})

    def _step(self, step: int) -> None:
        config, run_dir = self.config, self.folder.path
        tick = time.perf_counter()
        # 1. sample tasks, 2. roll out
        tasks = self.rng.choice(self.train_seeds, size=config.optim.tasks_per_step,
                                replace=False)
        self.model.eval()
        batch = rollout(tasks, self.make_env, self.rollout_backend, self.turn_format,
                        self.strategy,
                        config=config.rollout, scorer=self.scorer,
                        allocator=self.parts.allocator(),
                        seed=int(self.rng.integers(2**62)),
                        first_group_id=step * config.optim.tasks_per_step)
        rollout_seconds = time.perf_counter() - tick
        if isinstance(self.scorer, LearningScorer):  # the value scorer
            self.scorer.observe(batch.trees)
        # 3. rewards and 4. advantages, per task group
        items = train_items(batch.trees, self.estimator, config.optim.drop_zero_variance)
        # 5. update and 6. its record, whole: Ctrl-C during them is taken after them (a
        # checkpoint of step N needs step N's record: a resumed run starts at N + 1)
        tick = time.perf_counter()
        self.updating = True  # a crash now may leave the weights half updated: not saved
        with deferred_interrupt():
            update = ppo_update(self.model, self.optimizer, items, config, self.ref_model,
                             self.rng)
            if self.behaviour is not None:  # part of the update: a checkpoint needs both
                self.behaviour.after_update(self.model)
            self.done, self.updating = step, False
            sync_weights(self.backend, self.model)  # cached KV belongs to the old weights
            if self.behaviour is not None:
                sync_weights(self.rollout_backend, self.behaviour.model)
            update_seconds = time.perf_counter() - tick
            record = _step_record(step, batch.trees, update, rollout_seconds, update_seconds,
                                  batch.timing, self.cumulative)
            if (config.eval.every and step % config.eval.every == 0
                    and step < config.optim.steps):
                record["eval"] = self._evaluate(config.eval.tasks_during).as_dict()
            append_jsonl(self.folder.metrics, record)
            self.scalars.record(step, record)
        if config.save_trees_every and (step % config.save_trees_every == 0
                                        or step == config.optim.steps):  # the last one too
            save_tree(batch.trees[0], run_dir / "trees" / f"step_{step:05d}.json")
        self.reporter.advance(step, {"success": record["success_rate"],
                                     "reward": record["reward_mean"],
                                     "tokens": self.cumulative["generated"],
                                     "saved": record["tokens"]["saved_fraction"],
                                     "loss": record.get("loss", 0.0)})


def train_items(trees: list[RolloutTree],
                estimator: AdvantageEstimator | BatchAdvantageEstimator, drop_zero_variance: bool
                ) -> list[TrainItem]:
    """The trajectories a step trains on: each tree's leaves with their per-token credit
    from ``estimator`` (one tree at a time, or the whole batch for a batch estimator); with
    ``drop_zero_variance``, a tree whose leaves all earned the same reward is left out."""
    kept = []
    for tree in trees:
        trajectories = export_trajectories(tree)
        if not trajectories:
            continue
        if drop_zero_variance and len({t.reward for t in trajectories}) == 1:
            continue
        kept.append((tree, trajectories))
    credits = (estimator.over_batch([tree for tree, _ in kept])
               if isinstance(estimator, BatchAdvantageEstimator)
               else [estimator(tree) for tree, _ in kept])
    items: list[TrainItem] = []
    for (tree, trajectories), credit in zip(kept, credits, strict=True):
        advantages = weighted(tree, token_credit(tree, credit))
        items.extend(TrainItem(t, a) for t, a in zip(trajectories, advantages, strict=True))
    return items


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
        # Sampled turns whose reply the environment could parse (each turn once, shared or not).
        "format_ok": float(np.mean(turns_ok)) if (turns_ok := [
            not node.info.get("format_error", False) for tree in trees for node in tree.nodes[1:]
            if node.action_ids]) else 1.0,
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
