"""``treeroll compare``: several strategies trained under one budget, over seeds, in a report.

Every strategy gets the same base config, the same number of updates and the same per-task
generated-token budget (``rollout.max_generated_tokens``; leaves are whatever the strategy
makes of it). Each (strategy, seed) is an ordinary training run in ``<report>/runs/``, so a
crashed or interrupted comparison keeps every finished run and is resumed by running the
same command again (finished runs are read back, not retrained). A run folder made with
other settings (a different budget, strategy setting, code default) is refused before any
run trains, rather than read back as one of this comparison's runs.

The report folder holds ``report.md`` (the table), ``results.json``, ``success_vs_tokens.png``
and an example tree per strategy (JSON, PNG and HTML).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from treeroll.base import ScoringStrategy
from treeroll.checks import checked, validate
from treeroll.config import TrainConfig, as_current, config_to_dict
from treeroll.config_checks import check_config
from treeroll.stats import t_interval, target_section
from treeroll.training.evaluation import Reporter
from treeroll.training.runfolder import config_differences, finished_steps
from treeroll.training.trainer import train

__all__ = ["CompareConfig", "arm_config", "run_compare", "settings_changed",
           "train_side_by_side"]


@dataclass
class CompareConfig:
    """Strategies trained under the same generated-token budget and number of updates."""

    report_dir: str = "reports/compare"
    """Where the report (and the runs behind it) are written."""
    strategies: tuple[str, ...] = ("chain", "tree_grpo", "patr")
    """What to compare: strategy names as in `treeroll train --strategy.name`, or
    `STRATEGY+ALLOCATOR` for a strategy under a batch allocator (`chain+vigor`: VIGOR decides
    how much each task gets, chains how; `base.allocator` holds its settings)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Training seeds; each strategy runs once per seed."""
    more_seeds: tuple[int, ...] = ()
    """Further seeds for the strategies of ``more_seeds_for`` only (8 seeds for the main
    strategies, 3 for the rest, say)."""
    more_seeds_for: tuple[str, ...] = ()
    """The strategies (as in ``strategies``) that also run ``more_seeds``."""
    targets: tuple[float, ...] = ()
    """Held-out success levels: the report gives the generated tokens each strategy needed to
    reach each (interpolated between evaluations, mean over seeds, bootstrap 95% interval)
    and its ratio to chain's."""
    token_budget: int = checked(600, ge=1)
    """Generated tokens per task per step, for every strategy (rollout.max_generated_tokens)."""
    patr_scorer: str = "frozenlake_progress"
    """Process scorer PATR uses."""
    jobs: int = checked(1, ge=1)
    """Runs trained at once, each in its own process with ``base.threads // jobs`` threads
    (at least one). A run's seed fixes what it computes, whatever runs beside it (a test
    finds every figure of a two-at-a-time comparison at one thread a run equal to those of a
    one-at-a-time one at two threads); its wall time is then that of a run sharing the
    machine, as the report says. On 2 cores two one-thread training runs side by side took
    49 s where one after the other at two threads each took 80 s (8 steps of the default
    training, 2026-12-02)."""
    base: TrainConfig = field(default_factory=TrainConfig)
    """The training settings every run shares (env, policy, optimiser, evaluation); every
    evaluation of a run is on ``eval.tasks`` held-out tasks (``eval.tasks_during`` is set to
    it), so the points of a curve are comparable."""


def split_arm(arm: str) -> tuple[str, str]:
    """``"chain+vigor"`` -> ``("chain", "vigor")``; ``"patr"`` -> ``("patr", "uniform")``
    (a plain strategy's run keeps ``base.allocator`` as it is)."""
    strategy, _, allocator = arm.partition("+")
    return strategy, allocator or "uniform"


def arm_config(config: CompareConfig, arm: str, seed: int) -> TrainConfig:
    """The training run of one arm (``strategy`` or ``strategy+allocator``) and seed of a
    comparison: the base settings with the arm's strategy (PATR with the comparison's
    scorer), the shared generated-token budget, and its own run folder."""
    base = config.base
    strategy, allocator = split_arm(arm)
    scorer = base.scorer
    block = getattr(base.strategy, strategy, None)  # a registered strategy's settings block
    if isinstance(block, ScoringStrategy) and block.use_scores:  # PATR: its scorer
        scorer = replace(scorer, name=config.patr_scorer)
    return replace(
        base, name=f"{arm}_seed{seed}", runs_dir=str(Path(config.report_dir) / "runs"),
        seed=seed, resume=False,
        strategy=replace(base.strategy, name=strategy), scorer=scorer,
        allocator=replace(base.allocator, name=allocator) if "+" in arm else base.allocator,
        rollout=replace(base.rollout, max_generated_tokens=config.token_budget),
        env=replace(base.env, task_seed=seed),
        # every point of a curve on the same held-out tasks as its start and its end
        eval=replace(base.eval, tasks_during=base.eval.tasks))


def seeds_of(config: CompareConfig, arm: str) -> tuple[int, ...]:
    """The seeds ``arm`` runs: ``seeds``, then ``more_seeds`` if it is in ``more_seeds_for``."""
    return config.seeds + (config.more_seeds if arm in config.more_seeds_for else ())


REUSABLE_DIFFERENCES = ("resume", "extend", "force", "threads", "runs_dir", "checkpoint_every",
                        "save_trees_every", "wandb")
"""Settings a run folder may have been made with, apart from this comparison's, and still be
read back (or resumed) as one of its runs: none of them changes what the run computes."""


def settings_changed(run_config: TrainConfig) -> list[str]:
    """``name (key: saved -> now, ...)`` if the run's folder was made with other settings."""
    saved_file = Path(run_config.runs_dir) / run_config.name / "config.yaml"
    if not saved_file.is_file():
        return []
    saved = as_current(TrainConfig, yaml.safe_load(saved_file.read_text()) or {})
    differences = config_differences(saved, config_to_dict(run_config), REUSABLE_DIFFERENCES)
    if not differences:
        return []
    shown = ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences[:3])
    return [f"{run_config.name} ({shown}{', ...' if len(differences) > 3 else ''})"]


def _collect(run_dir: Path) -> dict[str, Any]:
    records = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    steps = [r for r in records if "success_rate" in r]
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = [(0.0, summary["start_eval"]["success_rate"])]
    for r in steps:
        if "eval" in r:
            curve.append((float(r["cumulative_generated_tokens"]), r["eval"]["success_rate"]))
    generated = sum(r["generated_tokens"] for r in steps)
    curve.append((float(generated), summary["final_eval"]["success_rate"]))
    leaves = sum(r["leaves"] for r in steps)
    signal = [r["signal_groups"] for r in steps if "signal_groups" in r]
    return {
        "final_success": summary["final_eval"]["success_rate"],
        "start_success": summary["start_eval"]["success_rate"],
        "generated_tokens": generated,
        "leaves": leaves,
        "leaves_per_1k_tokens": 1000 * leaves / max(generated, 1),
        "signal_groups": float(np.mean(signal)) if signal else None,
        "scorer_seconds": sum(r["timing"].get("score", 0.0) for r in steps),
        "rollout_seconds": sum(r["rollout_seconds"] for r in steps),
        "wall_seconds": summary.get("wall_seconds", 0.0),
        "curve": curve,
    }


def run_compare(config: CompareConfig, reporter: Reporter | None = None) -> str:
    """Train every (strategy or strategy+allocator, seed), then write the report; returns
    the report's path."""
    problems = [("--strategies", "is empty; name at least one")] if not config.strategies else []
    problems += [("--seeds", "is empty; give at least one")] if not config.seeds else []
    for option, seeds in (("--seeds", config.seeds), ("--more-seeds", config.more_seeds)):
        negative = [seed for seed in seeds if seed < 0]
        problems += [(option, f"holds {negative}; seeds must be >= 0")] if negative else []
    overlap = sorted(set(config.seeds) & set(config.more_seeds))
    problems += [("--more-seeds", f"repeats {overlap} of --seeds")] if overlap else []
    twice = sorted({s for s in config.more_seeds if config.more_seeds.count(s) > 1})
    problems += [("--more-seeds", f"holds {twice} twice")] if twice else []
    if bool(config.more_seeds) != bool(config.more_seeds_for):
        given, missing = (("--more-seeds", "--more-seeds-for") if config.more_seeds else
                          ("--more-seeds-for", "--more-seeds"))
        problems.append((missing, f"is empty while {given} is set: give both (the extra seeds "
                                  "and the strategies that run them) or neither"))
    unknown = [arm for arm in config.more_seeds_for if arm not in config.strategies]
    problems += [("--more-seeds-for", f"names {unknown}, not in --strategies "
                                      f"{list(config.strategies)}")] if unknown else []
    outside = [t for t in config.targets if not 0.0 < t <= 1.0]
    problems += [("--targets", f"holds {outside}; a held-out success lies in (0, 1]")] \
        if outside else []
    bad_arms = [arm for arm in config.strategies if arm.count("+") > 1 or arm.startswith("+")
                or arm.endswith("+")]
    if bad_arms:
        problems.append(("--strategies", f"holds {bad_arms}; write STRATEGY or "
                                         "STRATEGY+ALLOCATOR (e.g. chain+vigor)"))
    validate(config, extra=problems)
    # seed-major: every strategy's first seed, then every strategy's second, ..., so a
    # comparison stopped part way holds the same seeds for each strategy it reached
    arms = sorted(((arm, seed) for arm in config.strategies for seed in seeds_of(config, arm)),
                  key=lambda a: (seeds_of(config, a[0]).index(a[1]),
                                 config.strategies.index(a[0])))
    runs = [arm_config(config, arm, seed) for arm, seed in arms]
    for run_config in runs:  # every run's settings, before the first one trains
        check_config(run_config)
    stale = [problem for run_config in runs for problem in settings_changed(run_config)]
    if stale:
        raise ValueError(f"{config.report_dir} holds runs made with other settings, which "
                         "would be read back as if made with these: "
                         + "; ".join(stale[:4]) + ("; ..." if len(stale) > 4 else "")
                         + f". Move {Path(config.report_dir) / 'runs'} aside or choose "
                         "another --report-dir")
    report = Path(config.report_dir)
    report.mkdir(parents=True, exist_ok=True)
    todo = [run for run in runs if finished_steps(Path(run.runs_dir) / run.name) is None]
    if config.jobs > 1 and len(todo) > 1:
        train_side_by_side(todo, config.jobs, reporter)
    else:
        for run_config in todo:
            _train_run(run_config, reporter)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in config.strategies}
    for (arm, _), run_config in zip(arms, runs, strict=True):
        results[arm].append(_collect(Path(run_config.runs_dir) / run_config.name))
    _write_report(config, results)
    return str(report / "report.md")


def _threads_per_run(threads: int, jobs: int) -> int:
    """Threads each of ``jobs`` side-by-side runs gets out of ``threads`` (0: torch's
    default), at least one."""
    return max(1, (threads or torch.get_num_threads()) // jobs)


def _train_run(run_config: TrainConfig, reporter: Reporter | None) -> None:
    """Train one run to its end (an interrupted one continues exactly from its last
    checkpoint) and store its summary with the wall time."""
    run_dir = Path(run_config.runs_dir) / run_config.name
    resume = (run_dir / "checkpoints" / "last.pt").exists()
    start = time.perf_counter()
    summary = train(replace(run_config, resume=resume), reporter)
    summary["wall_seconds"] = summary.get("wall_seconds", 0.0) + time.perf_counter() - start
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def _train_child(run: TrainConfig, outcome: Connection) -> None:
    """A spawned process's whole life: one run, its outcome sent back (None: finished; else
    the exception, or its text where it does not pickle). It leaves the terminal's process
    group first, so a Ctrl-C reaches the comparison alone, which passes it on exactly once."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    try:
        _train_run(run, None)
    except BaseException as error:
        try:
            outcome.send(error)
        except Exception:  # an exception that does not pickle: its type and text
            outcome.send(RuntimeError(f"{type(error).__name__}: {error}"))
        raise SystemExit(130 if isinstance(error, KeyboardInterrupt) else 1) from None
    outcome.send(None)


def train_side_by_side(todo: list[TrainConfig], jobs: int, reporter: Reporter | None) -> None:
    """At most ``jobs`` runs at a time, each in a fresh spawned process with its share of
    the threads, started in order. A run that fails stops the start of further runs; the
    running ones finish, then its error is raised naming it (a ``ValueError`` stays one, so
    the command line shows it as a usage error). Ctrl-C is passed on to every running run,
    which writes its checkpoint at a whole step (as a single ``treeroll train`` does); then
    ``KeyboardInterrupt`` is raised. Every finished run stays finished, every interrupted one
    resumes exactly: the same command goes on where it stopped."""
    split = [replace(run, threads=_threads_per_run(run.threads, jobs)) for run in todo]
    if reporter is not None:
        reporter.phase(f"training {len(split)} runs, {jobs} at a time, "
                       f"{split[0].threads} thread(s) each", len(split))
    context = multiprocessing.get_context("spawn")  # no forked torch state in a run
    waiting = list(reversed(split))
    running: dict[BaseProcess, tuple[TrainConfig, Connection]] = {}
    failure: tuple[TrainConfig, BaseException] | None = None
    finished = 0
    try:
        while running or (waiting and failure is None):
            while waiting and failure is None and len(running) < jobs:
                run = waiting.pop()
                receive, send = context.Pipe(duplex=False)
                child: BaseProcess = context.Process(target=_train_child, args=(run, send),
                                                     name=run.name)
                child.start()
                send.close()
                running[child] = (run, receive)
            wait([process.sentinel for process in running])
            for process in [process for process in running if not process.is_alive()]:
                run, receive = running.pop(process)
                process.join()
                error = receive.recv() if receive.poll() else RuntimeError(
                    f"its process ended with exit code {process.exitcode} (killed?)")
                if error is None:
                    finished += 1
                    if reporter is not None:
                        reporter.advance(finished, {})
                elif failure is None:
                    failure = (run, error)
    except KeyboardInterrupt:
        for process in running:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGINT)
        for process in running:
            process.join()
        raise
    if failure is not None:
        run, error = failure
        where = Path(run.runs_dir) / run.name
        if isinstance(error, ValueError):
            raise ValueError(f"run {where}: {error}") from error
        raise RuntimeError(f"run {where} failed: {type(error).__name__}: {error}; the "
                           "finished runs are kept, and running the same command again "
                           "resumes the others") from error


def _write_report(config: CompareConfig, results: dict[str, list[dict[str, Any]]]) -> None:
    """``report.md`` (the table, the curves, the tokens-to-target section), ``results.json``
    and an example tree per strategy in ``config.report_dir``."""
    from treeroll.viz import plot_compare

    report = Path(config.report_dir)
    lines = _report_header(config)
    summary: dict[str, Any] = {}
    curves: dict[str, list[tuple[float, float, float, float]]] = {}
    for strategy, runs in results.items():
        summary[strategy], line = _strategy_row(strategy, runs)
        lines.append(line)
        curves[strategy] = _mean_curve(runs)
        _example_tree(report, strategy, config.seeds[0])
    plot_compare(curves, report / "success_vs_tokens.png")
    lines += ["", "![held-out success vs generated tokens](success_vs_tokens.png)", ""]
    section, reached = target_section(results, config.targets)
    lines += section
    for arm, per_target in reached.items():
        summary[arm]["tokens_to_target"] = per_target
    (report / "report.md").write_text("\n".join(lines) + "\n")
    (report / "results.json").write_text(json.dumps(summary, indent=2))


def _report_header(config: CompareConfig) -> list[str]:
    """The report's title, the settings it ran with, and the table's head."""
    return [
        f"# treeroll compare: {', '.join(config.strategies)}",
        "",
        f"Environment `{config.base.env.name}`; {config.base.optim.steps} updates of "
        f"{config.base.optim.tasks_per_step} tasks; budget {config.token_budget} generated "
        f"tokens per task per step; seeds {list(config.seeds)}"
        + (f" (and {list(config.more_seeds)} for {', '.join(config.more_seeds_for)})"
           if config.more_seeds and config.more_seeds_for else "")
        + f"; held-out success on "
        f"{config.base.eval.tasks} tasks never trained on, the same tasks at every "
        f"evaluation of a curve (temperature {config.base.eval.temperature}); intervals "
        "are 95% t-intervals over seeds, clipped to [0, 1]. "
        "Groups with signal: the share of a step's task groups whose leaves' rewards differ "
        "(the only groups that give a group-relative gradient), averaged over steps. "
        + (f"Wall s: a run's own wall time, up to {config.jobs} runs trained at a time "
           f"({_threads_per_run(config.base.threads, config.jobs)} thread(s) each)."
           if config.jobs > 1 else
           f"Wall s: a run's own wall time, one run at a time "
           f"({_threads_per_run(config.base.threads, 1)} thread(s))."),
        "",
        "| strategy | held-out success | 95% interval | per seed | start | generated tokens | "
        "leaves / 1k tokens | groups with signal | scorer s | rollout s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]


def _strategy_row(strategy: str, runs: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """One strategy's summary over its seeds (``results.json``) and its line of the table."""
    mean, low, high = t_interval([r["final_success"] for r in runs])
    low, high = max(low, 0.0), min(high, 1.0)  # a success rate lies in [0, 1]
    start = float(np.mean([r["start_success"] for r in runs]))
    row: dict[str, Any] = {key: float(np.mean([r[key] for r in runs]))
                           for key in ("generated_tokens", "leaves_per_1k_tokens",
                                       "scorer_seconds", "rollout_seconds", "wall_seconds")}
    signal = [r["signal_groups"] for r in runs if r.get("signal_groups") is not None]
    row["signal_groups"] = float(np.mean(signal)) if signal else None
    interval_bounds = [low, high] if len(runs) > 1 else None  # one seed: no interval
    summary = {"final_success": mean, "ci95": interval_bounds, "start": start, **row,
               "runs": runs}
    per_seed = " / ".join(f"{r['final_success']:.3f}" for r in runs)
    shown = "n/a" if row["signal_groups"] is None else f"{row['signal_groups']:.2f}"
    interval = f"[{low:.3f}, {high:.3f}]" if len(runs) > 1 else "n/a (one seed)"
    line = (f"| {strategy} | {mean:.3f} | {interval} | {per_seed} | {start:.3f} | "
            f"{row['generated_tokens']:.0f} | {row['leaves_per_1k_tokens']:.2f} | {shown} | "
            f"{row['scorer_seconds']:.1f} | {row['rollout_seconds']:.0f} | "
            f"{row['wall_seconds']:.0f} |")
    return summary, line


def _mean_curve(runs: list[dict[str, Any]]) -> list[tuple[float, float, float, float]]:
    """Held-out success against generated tokens, averaged over seeds point by point (mean
    tokens, mean success and its t-interval)."""
    curve = []
    for i in range(len(runs[0]["curve"])):
        xs = [r["curve"][i][0] for r in runs if len(r["curve"]) > i]
        ys = [r["curve"][i][1] for r in runs if len(r["curve"]) > i]
        m, lo, hi = t_interval(ys)
        curve.append((float(np.mean(xs)), m, lo, hi))
    return curve


def _example_tree(report: Path, strategy: str, seed: int) -> None:
    """The last saved tree of the strategy's first seed, copied and drawn beside the report."""
    from treeroll.tree_json import load_tree
    from treeroll.viz import render_tree_html, render_tree_png

    trees = sorted((report / "runs" / f"{strategy}_seed{seed}" / "trees").glob("*.json"))
    if trees:
        tree = load_tree(trees[-1])
        shutil.copy(trees[-1], report / f"tree_{strategy}.json")
        render_tree_png(tree, report / f"tree_{strategy}.png")
        render_tree_html(tree, report / f"tree_{strategy}.html")
