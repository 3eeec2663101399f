"""The ``treeroll sft`` run: data, policy, loop, evaluations, checkpoints, the policy folder.

Everything a run needs is checked before its folder is touched: the configuration, the
policy, and every line of a JSONL data file. See :mod:`treeroll.training.sft` for the loop and
the run folder's layout.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.backends.hf import HFBackend
from treeroll.base import Env, ExpertEnv
from treeroll.config import PolicyConfig, config_to_dict
from treeroll.formatting import TurnFormat
from treeroll.plugins import make_env_factory
from treeroll.policies import Policy, build_policy, save_policy
from treeroll.rollout import RolloutConfig
from treeroll.training.evaluation import Reporter, Silent, evaluate, task_pools
from treeroll.training.runfolder import (
    RunFolder,
    append_jsonl,
    load_checkpoint,
    save_checkpoint,
)
from treeroll.training.sft import (
    SFTConfig,
    SFTDataConfig,
    SFTOptimConfig,
    SFTState,
    copy_policy_folder,
    sft_steps,
)
from treeroll.training.sft_data import SFTExample, expert_episode, read_jsonl

__all__ = ["format_warm_start", "run_sft"]

_RESUMABLE_CHANGES = ("optim.steps", "eval", "checkpoint_every", "log_every", "export",
                      "threads")
"""Settings a resumed run may change (the rest must match the run's config.yaml)."""

EVAL_ROLLOUT = RolloutConfig(max_turn_tokens=24, temperature=0.0)
"""How SFT evaluates: greedy, up to 24 tokens a turn."""


def _cut(example: SFTExample, max_tokens: int) -> SFTExample:
    if len(example.ids) <= max_tokens:
        return example
    return SFTExample(example.ids[:max_tokens], example.loss_mask[:max_tokens])


def make_batches(data: SFTDataConfig, make_env: Callable[[], Env], turn_format: TurnFormat,
                 vocab_size: int, train_seeds: np.ndarray,
                 warn: Callable[[str], None] | None = None
                 ) -> Callable[[np.random.Generator], list[SFTExample]]:
    """The function that draws one step's examples. A JSONL file is read and checked here,
    in full, before any training; an expert source checks that the environment has one."""
    if data.source == "jsonl":
        assert data.path is not None  # SFTDataConfig checks it
        examples = [_cut(e, data.max_tokens) for e in read_jsonl(
            data.path, turn_format, vocab_size, on_bad_line=data.on_bad_line, warn=warn)]

        def from_file(rng: np.random.Generator) -> list[SFTExample]:
            picks = rng.choice(len(examples), size=min(data.episodes_per_step, len(examples)),
                               replace=False)
            return [examples[int(i)] for i in picks]
        return from_file
    probe = make_env()
    if not isinstance(probe, ExpertEnv):
        raise ValueError(f"data.source is 'expert' but the environment "
                         f"{type(probe).__name__} has no expert (treeroll.base.ExpertEnv); "
                         "use data.source: jsonl with data.path")

    def from_expert(rng: np.random.Generator) -> list[SFTExample]:
        seeds = rng.choice(train_seeds, size=data.episodes_per_step)  # training pool only
        return [_cut(expert_episode(make_env(), int(seed), turn_format, rng, skill=data.skill,
                                    mask_noise=data.mask_noise, explain=data.explain),
                     data.max_tokens)
                for seed in seeds]
    return from_expert


def format_warm_start(policy: Policy, make_env: Callable[[], Env], train_seeds: np.ndarray,
                      config: PolicyConfig, rng: np.random.Generator,
                      reporter: Reporter | None = None) -> float:
    """The RL trainer's format warm start for a from-scratch model: ``warm_start_steps`` of
    the SFT loop on the environment's expert at skill 0 (well-formed replies, uniformly
    random actions, all in the loss), constant learning rate. Returns the last loss."""
    reporter = reporter or Silent()
    data = SFTDataConfig(source="expert", skill=0.0, mask_noise=False,
                         episodes_per_step=config.warm_start_batch)
    optim = SFTOptimConfig(steps=config.warm_start_steps, lr=config.warm_start_lr,
                           warmup_steps=0, schedule="constant")
    batches = make_batches(data, make_env, policy.turn_format(), len(policy.tokenizer),
                           train_seeds)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=optim.lr)
    reporter.phase("format warm start", optim.steps)
    loss = float("nan")
    for record in sft_steps(policy.model, optimizer, batches, optim, SFTState(0, rng),
                            pad_token_id=policy.tokenizer.pad_token_id or 0):
        loss = record["loss"]
        reporter.advance(int(record["step"]), {"loss": loss})
    return loss


def _git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10).stdout
        return commit + ("+uncommitted" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_sft(config: SFTConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run (or resume) ``treeroll sft``; returns the summary also written to
    ``summary.json``."""
    reporter = reporter or Silent()
    if config.threads:
        torch.set_num_threads(config.threads)
    folder = RunFolder(config.runs_dir, config.name, config.resume)
    resolved = config_to_dict(config)
    folder.check_config(resolved, _RESUMABLE_CHANGES)
    make_env = make_env_factory(config.env)
    train_seeds, held_out = task_pools(config.env, config.eval)
    torch.manual_seed(config.seed)
    policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                          make_env, folder.path / "tokenizer")
    turn_format = policy.turn_format()
    batches = make_batches(config.data, make_env, turn_format, len(policy.tokenizer),
                           train_seeds, warn=lambda text: reporter.phase(text))
    folder.start(resolved)
    if not config.policy.init:
        policy.tokenizer.save_pretrained(folder.path / "tokenizer")
    model = policy.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr,
                                  weight_decay=config.optim.weight_decay)
    rng = np.random.default_rng(config.seed)
    state = SFTState(0, rng)
    backend = HFBackend(model, pad_token_id=policy.tokenizer.pad_token_id or 0)
    summary: dict[str, Any] = {}

    def held_out_eval(tasks: int) -> dict[str, float]:
        tick = time.perf_counter()
        result = evaluate(backend, turn_format, make_env, held_out[:tasks],
                          replace(config.eval, tasks=tasks), EVAL_ROLLOUT).as_dict()
        summary["eval_seconds"] = summary.get("eval_seconds", 0.0) + time.perf_counter() - tick
        model.train()
        return result

    if config.resume:
        saved = load_checkpoint(folder.checkpoint, rng)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.step, summary = int(saved["step"]), dict(saved["summary"])
        _keep_records_until(folder.metrics, state.step)
    elif config.eval.tasks:
        reporter.phase(f"evaluating the starting policy on {config.eval.tasks} held-out tasks")
        summary["start_eval"] = held_out_eval(config.eval.tasks)
        append_jsonl(folder.metrics, {"step": 0, "eval": summary["start_eval"]})

    def checkpoint() -> None:
        save_checkpoint(folder.checkpoint, {"model": model.state_dict(),
                                            "optimizer": optimizer.state_dict(),
                                            "step": state.step, "summary": summary}, rng)

    reporter.phase(f"sft on {config.data.source} data", config.optim.steps)
    reporter.advance(state.step, {})
    try:
        for record in sft_steps(model, optimizer, batches, config.optim, state,
                                pad_token_id=policy.tokenizer.pad_token_id or 0):
            step = int(record["step"])
            summary["train_seconds"] = summary.get("train_seconds", 0.0) + record["seconds"]
            summary["trained_tokens"] = summary.get("trained_tokens", 0) + record["trained_tokens"]
            summary["examples"] = summary.get("examples", 0) + config.data.episodes_per_step
            if step % config.log_every == 0 or step == config.optim.steps:
                append_jsonl(folder.metrics, record)
            if config.eval.every and step % config.eval.every == 0 and step < config.optim.steps:
                reporter.phase(f"evaluating step {step} on {config.eval.tasks_during} tasks")
                append_jsonl(folder.metrics, {"step": step,
                                              "eval": held_out_eval(config.eval.tasks_during)})
                reporter.phase(f"sft on {config.data.source} data", config.optim.steps)
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                checkpoint()
            reporter.advance(step, {"loss": record["loss"]})
    except KeyboardInterrupt:
        checkpoint()  # state.step counts only the steps whose update was applied
        raise
    checkpoint()
    return _finish(config, folder, policy, summary, held_out_eval, reporter)


def _keep_records_until(metrics: Path, step: int) -> None:
    """Drop metrics records written after the checkpoint a run resumes from (a crash
    between a record and the next checkpoint would otherwise log those steps twice)."""
    import json

    if not metrics.exists():
        return
    lines = [line for line in metrics.read_text().splitlines()
             if line.strip() and json.loads(line).get("step", 0) <= step]
    tmp = metrics.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(metrics)


def _finish(config: SFTConfig, folder: RunFolder, policy: Policy, summary: dict[str, Any],
            held_out_eval: Callable[[int], dict[str, float]], reporter: Reporter
            ) -> dict[str, Any]:
    import json

    if config.eval.tasks:
        reporter.phase(f"evaluating the fine-tuned policy on {config.eval.tasks} held-out "
                       "tasks")
        summary["final_eval"] = held_out_eval(config.eval.tasks)
        append_jsonl(folder.metrics, {"step": config.optim.steps, "eval": summary["final_eval"]})
    policy.model.eval()
    summary.update(steps=config.optim.steps, params=policy.parameters, commit=_git_commit())
    meta = {"made_by": {"command": "treeroll sft", "config": config_to_dict(config),
                        "commit": summary["commit"]},
            "eval": {k: summary[k] for k in ("start_eval", "final_eval") if k in summary},
            "params": policy.parameters}
    target = save_policy(policy, folder.path / "policy", card=model_card(config, summary),
                         meta=meta)
    if config.export:
        copy_policy_folder(target, Path(config.export))
        summary["exported_to"] = config.export
    (folder.path / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def model_card(config: SFTConfig, summary: dict[str, Any]) -> str:
    """The policy folder's README: how it was made, on what data, and its figures."""
    model = config.policy.model
    lines = [f"# {config.name}", "",
             "A treeroll policy folder made by `treeroll sft` (load it with "
             "`--policy.init <this folder>`).", "",
             "## How it was made", "",
             f"- Command: `treeroll sft` with the configuration in `treeroll.json` "
             f"(`made_by.config`); commit `{summary.get('commit', 'unknown')}`.",
             f"- Start: {config.policy.init or 'from scratch'}"
             + ("" if config.policy.init else
                f" (Llama, {model.num_layers} layers, width {model.hidden_size}, "
                f"{model.num_heads} heads, MLP {model.intermediate_size})")
             + f"; {summary.get('params', 0):,} parameters; observation view "
             f"`{config.policy.view or 'plain'}`.",
             f"- Data: {_describe_data(config)}; {summary.get('examples', 0):,} examples, "
             f"{summary.get('trained_tokens', 0):,} trained tokens.",
             f"- Optimiser: AdamW, peak lr {config.optim.lr:g}, {config.optim.warmup_steps} "
             f"warm-up steps, {config.optim.schedule} schedule, {config.optim.steps} steps, "
             f"seed {config.seed}.",
             f"- Time: {summary.get('train_seconds', 0.0) / 60:.1f} min of training and "
             f"{summary.get('eval_seconds', 0.0) / 60:.1f} min of evaluation "
             f"({torch.get_num_threads()} CPU threads).", "",
             "## Held-out figures", "",
             f"Environment `{config.env.name}`; held-out task seeds drawn from seed "
             f"{config.eval.seed}, never in the training pool (seed {config.env.task_seed}, "
             f"{config.env.train_tasks} tasks); greedy decoding; 95% Wilson intervals.", "",
             "| | success | 95% interval | well-formed replies | tasks |",
             "|---|---|---|---|---|"]
    for key in ("start_eval", "final_eval"):
        if key in summary:
            e = summary[key]
            lines.append(f"| {key.replace('_eval', '')} | {e['success_rate']:.3f} | "
                         f"[{e['ci95_low']:.3f}, {e['ci95_high']:.3f}] | {e['format_ok']:.3f} | "
                         f"{e['tasks']} |")
    return "\n".join(lines) + "\n"


def _describe_data(config: SFTConfig) -> str:
    if config.data.source == "jsonl":
        return f"the JSONL file `{config.data.path}`"
    return (f"episodes of the `{config.env.name}` expert at skill {config.data.skill:g}"
            + (" (its random replies kept in the context, out of the loss)"
               if config.data.mask_noise and config.data.skill < 1 else "")
            + f", {config.data.episodes_per_step} per step, from the training pool")
