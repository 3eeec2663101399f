"""The ``treeroll sft`` run: data, policy, loop, evaluations, checkpoints, the policy folder.

Everything a run needs is checked before its folder is touched: the configuration, the
policy, and every line of a JSONL data file. See :mod:`treeroll.training.sft` for the loop and
the run folder's layout.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.backends import BackendConfig, make_backend
from treeroll.base import Env, ExpertEnv
from treeroll.causal_lm import CausalLM
from treeroll.checks import ConfigError
from treeroll.config import PolicyConfig, config_to_dict
from treeroll.config_checks import check_config
from treeroll.envs import make_env_factory
from treeroll.formatting import TurnFormat
from treeroll.policies import Policy, build_policy, check_context_length, save_policy
from treeroll.policies.lora import add_lora, weights_fingerprint
from treeroll.training.evaluation import QuietReporter, Reporter, evaluate, pool_words, task_pools
from treeroll.training.lifecycle import Lifecycle
from treeroll.training.runfolder import (
    RunFolder,
    append_jsonl,
)
from treeroll.training.sft import (
    SFTConfig,
    SFTDataConfig,
    SFTOptimConfig,
    SFTState,
    adamw,
    copy_policy_folder,
    sft_steps,
    trainable_parameters,
)
from treeroll.training.sft_data import SFTExample, expert_episode, read_jsonl

__all__ = ["format_warm_start", "run_sft"]


def _cut(example: SFTExample, max_tokens: int) -> SFTExample:
    if len(example.ids) <= max_tokens:
        return example
    return SFTExample(example.ids[:max_tokens], example.loss_mask[:max_tokens])


def _check_expert_reply(probe: ExpertEnv, data: SFTDataConfig, turn_format: TurnFormat,
                        train_seeds: np.ndarray) -> None:
    """Before any work: one expert reply as configured, on the first training task. Refused
    when the expert cannot write it (an expert without ``safe_moves``, or whose environment
    cannot list them) or when the policy's tokenizer does not know its words (``<unk>``:
    the explanation's words belong to a view the policy does not read)."""
    probe.reset(int(train_seeds[0]))
    try:
        reply = (probe.expert_reply(np.random.default_rng(0), explain=data.expert_explain,
                                    safe_moves=True) if data.explain_safe_moves
                 else probe.expert_reply(np.random.default_rng(0), explain=data.expert_explain))
    except (TypeError, ValueError) as error:
        if not data.explain_safe_moves:
            raise
        raise ValueError(f"--data.explain-safe-moves is on, but the expert of "
                         f"{type(probe).__name__} cannot list safe moves ({error}); "
                         "turn it off") from None
    unknown = getattr(turn_format.tokenizer, "unk_token_id", None)
    ids = turn_format.reply(reply.text)
    if unknown is not None and unknown in ids:
        raise ValueError(f"the expert's reply {reply.text!r} has words the policy's tokenizer "
                         "does not know (they would train as <unk>): with --data.explain "
                         "(and --data.explain-safe-moves) read the matching view, "
                         "--policy.view cell_coordinates (cell_coordinates_safe for the safe "
                         "list)")


def make_batches(data: SFTDataConfig, make_env: Callable[[], Env], turn_format: TurnFormat,
                 vocab_size: int, train_seeds: np.ndarray,
                 warn: Callable[[str], None] | None = None,
                 no_expert_hint: str = "use data.source: jsonl with data.path"
                 ) -> Callable[[np.random.Generator], list[SFTExample]]:
    """The function that draws one step's examples. A JSONL file is read and checked here,
    in full, before any training (each step then draws ``episodes_per_step`` distinct lines
    at random); an expert source checks that the environment has one."""
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
        raise ValueError(f"the environment {type(probe).__name__} has no expert (it does not "
                         "implement treeroll.base.ExpertEnv); " + no_expert_hint)
    _check_expert_reply(probe, data, turn_format, train_seeds)

    def from_expert(rng: np.random.Generator) -> list[SFTExample]:
        seeds = rng.choice(train_seeds, size=data.episodes_per_step)  # training pool only
        return [_cut(expert_episode(make_env(), int(seed), turn_format, rng, skill=data.skill,
                                    mask_noise=data.mask_noise, explain=data.expert_explain,
                                    safe_moves=data.explain_safe_moves),
                     data.max_tokens)
                for seed in seeds]
    return from_expert


def format_warm_start(policy: Policy, make_env: Callable[[], Env], train_seeds: np.ndarray,
                      config: PolicyConfig, rng: np.random.Generator,
                      reporter: Reporter | None = None) -> float:
    """The RL trainer's format warm start for a from-scratch model: ``warm_start_steps`` of
    the SFT loop on the environment's expert at skill 0 (well-formed replies, uniformly
    random actions, all in the loss), constant learning rate. Returns the last loss."""
    reporter = reporter or QuietReporter()
    data = SFTDataConfig(source="expert", skill=0.0, mask_noise=False,
                         episodes_per_step=config.warm_start_batch)
    optim = SFTOptimConfig(steps=config.warm_start_steps, lr=config.warm_start_lr,
                           warmup_steps=0, schedule="constant")
    batches = make_batches(data, make_env, policy.turn_format(), len(policy.tokenizer),
                           train_seeds, no_expert_hint="set policy.warm_start_steps: 0, or "
                           "start from a policy folder with policy.init")
    optimizer = adamw(policy.model, lr=optim.lr, weight_decay=0.0)
    reporter.phase("format warm start", optim.steps)
    loss = float("nan")
    state = SFTState(0, int(rng.integers(2**31)))
    for record in sft_steps(policy.model, optimizer, batches, optim, state,
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


def _check_export(export: str | None, run_policy: Path) -> None:
    """Refuse, before any work, an export target that would overwrite something that is not
    a policy folder, or the run's own policy folder."""
    if not export:
        return
    target = Path(export).resolve()
    if target == run_policy.resolve() or run_policy.resolve().is_relative_to(target):
        raise ValueError(f"export {export!r} is the run's own policy folder or contains it; "
                         "choose another folder")
    if target.exists() and not (target / "treeroll.json").is_file():
        raise ValueError(f"export {export!r} exists and is not a policy folder (no "
                         "treeroll.json): it would be replaced; choose an empty or new folder")


def run_sft(config: SFTConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Run (or resume) ``treeroll sft``; returns the summary also written to
    ``summary.json``."""
    reporter = reporter or QuietReporter()
    lora = config.policy.lora
    check_config(config, config.data.problems() + (
        [("--policy.lora.rank", f"is {lora.rank}, but --policy.init is null: an adapter "
          "adapts a pretrained policy; name one, or set the rank to 0")]
        if lora.rank and not config.policy.init else []))
    lifecycle = Lifecycle(config, resumable=_resumable_changes(config))
    folder, resolved = lifecycle.folder, lifecycle.resolved
    _check_export(config.export, folder.path / "policy")
    make_env = make_env_factory(config.env)
    train_seeds, held_out = task_pools(config.env, config.eval)
    torch.manual_seed(config.seed)
    policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                          make_env, folder.path / "tokenizer" if config.resume else None,
                          system_in_user=config.policy.system_in_user)
    check_context_length(policy, make_env, config.rollout.max_turn_tokens, held_out)
    # the base's weights, recorded in the adapter's folder: loading it over others is refused
    fingerprint = weights_fingerprint(policy.model) if lora.rank else None
    adapter = add_lora(policy.model, lora) if lora.rank else None  # policy.model adapted
    turn_format = policy.turn_format()
    skipped: list[str] = []
    batches = make_batches(config.data, make_env, turn_format, len(policy.tokenizer),
                           train_seeds, warn=skipped.append)
    folder.start(resolved)
    if not config.policy.init and not config.resume:
        policy.tokenizer.save_pretrained(folder.path / "tokenizer")
    model = policy.model
    optimizer = adamw(model, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
    rng = np.random.default_rng(config.seed)
    state = SFTState(0, config.seed)
    backend = make_backend(BackendConfig(), policy)  # the default backend, in process
    summary: dict[str, Any] = {"skipped_lines": skipped} if skipped else {}

    def held_out_eval(tasks: int) -> dict[str, float]:
        """Evaluate after a ``reporter.phase(text, tasks)``: progress per task."""
        tick = time.perf_counter()
        model.eval()
        result = evaluate(backend, turn_format, make_env, held_out[:tasks],
                          replace(config.eval, tasks=tasks), config.rollout,
                          reporter=reporter).as_dict()
        summary["eval_seconds"] = summary.get("eval_seconds", 0.0) + time.perf_counter() - tick
        return result

    if config.resume:
        saved = lifecycle.restore(rng)
        if saved.get("base_fingerprint", fingerprint) != fingerprint:
            raise ValueError(f"--resume: {config.policy.init!r} holds other weights than the "
                             "base this run's adapter was trained over; resume over that base")
        _load_weights(model, saved["model"], adapter is not None)
        optimizer.load_state_dict(saved["optimizer"])
        state.step, summary = int(saved["step"]), dict(saved["summary"])
        folder.keep_records_until(state.step)
    elif config.eval.tasks and config.eval_at_start:
        reporter.phase(f"evaluating the starting policy on {config.eval.tasks} "
                       f"{pool_words(config.eval)} tasks",
                       config.eval.tasks)
        with lifecycle.starting():
            summary["start_eval"] = held_out_eval(config.eval.tasks)
        append_jsonl(folder.metrics, {"step": 0, "eval": summary["start_eval"]})

    def checkpoint() -> None:
        lifecycle.save({"model": _weights(model, adapter is not None),
                   **({"base_fingerprint": fingerprint} if fingerprint is not None else {}),
                   "optimizer": optimizer.state_dict(),
                   "step": state.step, "summary": summary}, rng)

    # Ctrl-C, or a step count found absurd at step 2: the last whole step is kept (state.step
    # counts only the steps whose update was applied)
    with lifecycle.interruptible(checkpoint, summary, lambda: state.step + 1,
                            catch=(KeyboardInterrupt, ConfigError)):
        _loop(config, folder, model, optimizer, batches, state, summary, held_out_eval,
              checkpoint, policy.tokenizer.pad_token_id or 0, reporter)
    checkpoint()
    return _finish(config, folder, policy, summary, held_out_eval, reporter, adapter,
                   fingerprint)


def _weights(model: CausalLM, adapter: bool) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model: every weight, or with an adapter only the
    adapter's (trainable) ones, the base being rebuilt from ``policy.init`` on resume (a few
    megabytes a checkpoint for SmolLM2 instead of half a gigabyte)."""
    if not adapter:
        return model.state_dict()
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def _load_weights(model: CausalLM, state: dict[str, torch.Tensor], adapter: bool) -> None:
    """Load what :func:`_weights` kept; a checkpoint holding other weights than the ones it
    should (a run resumed with or without an adapter it did not have) is refused by name."""
    if not adapter:
        model.load_state_dict(state)
        return
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != trained:
        if trained < set(state):
            raise ValueError("the checkpoint holds every weight, as LoRA checkpoints did before "
                             "they kept the adapter alone: start the run again (a new --name)")
        odd = sorted(set(state) ^ trained)[:3]
        raise ValueError(f"the checkpoint does not hold this run's adapter weights (e.g. "
                         f"{odd}); resume with the settings the run was started with (its "
                         "config.yaml)")
    model.load_state_dict(state, strict=False)


def _resumable_changes(config: SFTConfig) -> tuple[str, ...]:
    """Settings a resumed run may change: the step count only under a constant schedule (a
    cosine schedule's every learning rate depends on it)."""
    steps = ("optim.steps",) if config.optim.schedule == "constant" else ()
    return (*steps, "eval", "checkpoint_every", "log_every", "export", "threads", "runs_dir",
            "resume")


def _loop(config: SFTConfig, folder: RunFolder, model: CausalLM, optimizer: torch.optim.Optimizer,
          batches: Callable[[np.random.Generator], list[SFTExample]], state: SFTState,
          summary: dict[str, Any], held_out_eval: Callable[[int], dict[str, float]],
          checkpoint: Callable[[], None], pad_token_id: int, reporter: Reporter) -> None:
    """The steps of a run: log, evaluate and checkpoint on their schedules."""
    phase = f"sft on {config.data.source} data"
    reporter.phase(phase, config.optim.steps)
    reporter.advance(state.step, {})
    for steps_here, record in enumerate(sft_steps(model, optimizer, batches, config.optim,
                                                  state, pad_token_id=pad_token_id), start=1):
        step = int(record["step"])
        for key in ("seconds", "trained_tokens", "examples"):
            total = "train_seconds" if key == "seconds" else key
            summary[total] = summary.get(total, 0) + record[key]
        if step % config.log_every == 0 or step == config.optim.steps:
            append_jsonl(folder.metrics, record)
        if config.eval.every and step % config.eval.every == 0 and step < config.optim.steps:
            reporter.phase(f"evaluating step {step} on {config.eval.tasks_during} tasks",
                           config.eval.tasks_during)
            append_jsonl(folder.metrics, {"step": step,
                                          "eval": held_out_eval(config.eval.tasks_during)})
            reporter.phase(phase, config.optim.steps)
        if config.checkpoint_every and step % config.checkpoint_every == 0:
            checkpoint()
        reporter.advance(step, {"loss": record["loss"]})
        Lifecycle.check_pace(steps_here, step, config.optim.steps, record["seconds"])


def _finish(config: SFTConfig, folder: RunFolder, policy: Policy, summary: dict[str, Any],
            held_out_eval: Callable[[int], dict[str, float]], reporter: Reporter,
            adapter: Any = None, fingerprint: str | None = None) -> dict[str, Any]:
    """The final evaluation, the policy folder (the adapter alone when there is one), the
    export and ``summary.json``."""
    if config.eval.tasks:
        reporter.phase(f"evaluating the fine-tuned policy on {config.eval.tasks} "
                       f"{pool_words(config.eval)} tasks", config.eval.tasks)
        summary["final_eval"] = held_out_eval(config.eval.tasks)
        append_jsonl(folder.metrics, {"step": config.optim.steps, "final": True,
                                      "eval": summary["final_eval"]})
    policy.model.eval()
    trained = sum(p.numel() for p in trainable_parameters(policy.model))
    # with an adapter, the model's own parameters (what loading the folder gives, merged)
    params = policy.parameters - (trained if adapter is not None else 0)
    summary.update(steps=config.optim.steps, params=params, commit=_git_commit(),
                   trainable_params=trained)
    meta = {"made_by": {"command": "treeroll sft", "config": config_to_dict(config),
                        "commit": summary["commit"]},
            "eval": {k: summary[k] for k in ("start_eval", "final_eval") if k in summary},
            "params": params,
            **({"base_fingerprint": fingerprint} if fingerprint is not None else {})}
    target = save_policy(policy, folder.path / "policy", card=model_card(config, summary),
                         meta=meta, adapter=adapter, base=config.policy.init)
    if config.export:
        copy_policy_folder(target, Path(config.export))
        summary["exported_to"] = config.export
    (folder.path / "summary.json").write_text(json.dumps(summary, indent=2))  # as Lifecycle's
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
             + f"; {summary.get('params', 0):,} parameters"
             + (f" ({summary.get('trainable_params', 0):,} trained: a LoRA adapter of rank "
                f"{config.policy.lora.rank}, alpha {config.policy.lora.alpha:g}, on "
                f"{', '.join(config.policy.lora.targets)}; this folder holds the adapter, "
                "merged into its base when loaded)" if config.policy.lora.rank else "")
             + "; observation view "
             f"`{config.policy.view or 'plain'}`.",
             f"- Data: {_describe_data(config)}; {summary.get('examples', 0):,} examples, "
             f"{summary.get('trained_tokens', 0):,} trained tokens.",
             f"- Optimiser: AdamW, peak lr {config.optim.lr:g}, {config.optim.warmup_steps} "
             f"warm-up steps, {config.optim.schedule} schedule, {config.optim.steps} steps, "
             f"seed {config.seed}.",
             f"- Time: {summary.get('train_seconds', 0.0) / 60:.1f} min of training and "
             f"{summary.get('eval_seconds', 0.0) / 60:.1f} min of evaluation "
             f"({torch.get_num_threads()} CPU threads).", "",
             *_pool_lines(config),
             "| | success | 95% interval | well-formed replies | tasks |",
             "|---|---|---|---|---|"]
    for key in ("start_eval", "final_eval"):
        if key in summary:
            e = summary[key]
            lines.append(f"| {key.replace('_eval', '')} | {e['success_rate']:.3f} | "
                         f"[{e['ci95_low']:.3f}, {e['ci95_high']:.3f}] | {e['format_ok']:.3f} | "
                         f"{e['tasks']} |")
    return "\n".join(lines) + "\n"


def _pool_lines(config: SFTConfig) -> list[str]:
    """The model card's heading and sentence on which tasks its figures come from."""
    pool = config.eval.pool
    where = (f"held-out task seeds drawn from seed {config.eval.seed}" if pool == "held_out"
             else f"validation task seeds drawn from seed {config.eval.validation_seed} "
                  "(the pool settings are chosen on; reported figures use the held-out pool)")
    return [f"## {'Held-out' if pool == 'held_out' else 'Validation'} figures", "",
            f"Environment `{config.env.name}`; {where}, never in the training pool (seed "
            f"{config.env.task_seed}, {config.env.train_tasks} tasks); greedy decoding; 95% "
            "Wilson intervals.", ""]


def _describe_data(config: SFTConfig) -> str:
    if config.data.source == "jsonl":
        return f"the JSONL file `{config.data.path}`"
    return (f"episodes of the `{config.env.name}` expert at skill {config.data.skill:g}"
            + (" (its random replies kept in the context, out of the loss)"
               if config.data.mask_noise and config.data.skill < 1 else "")
            + f", {config.data.episodes_per_step} per step, from the training pool")
