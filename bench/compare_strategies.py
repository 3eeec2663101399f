"""The strategies compared on the shipped base: `treeroll compare` and its verdict in one line.

Runs ``treeroll compare --config configs/compare_frozenlake.yaml`` (chain, Tree-GRPO, the
random tree and PATR, same per-task generated-token budget and number of updates, five
seeds; an interrupted comparison resumes where it stopped) and summarises its
``results.json``.

    python bench/compare_strategies.py          # about an hour on 2 cores
    python bench/compare_strategies.py --fresh --copy-to docs/compare_frozenlake

``--fresh`` first moves an existing report folder aside (``<folder>.old<N>``), so no run
finished on older code is read back into the figure (``bench/reproduce.py`` passes it);
``--copy-to`` copies the report, its plot and the example trees there afterwards.

Last line: one JSON object with, per strategy, the mean final held-out success over seeds,
its 95% t-interval, the mean start, the mean generated tokens and the tokens at which the
mean held-out curve first reaches chain's final success (``tokens_to_chain_final``, null if
never); then ``patr_minus_chain``, ``patr_separated_from_chain`` (PATR's interval entirely
above chain's) and ``patr_tokens_over_chain`` (PATR's tokens to reach chain's final over
chain's own). With ``targets`` in the config (``configs/compare_hard.yaml``), each strategy
also carries ``seeds`` and ``tokens_to_target``: per target, the mean tokens over seeds with a
bootstrap 95% interval and the ratio to chain's (``treeroll.stats``).

    python bench/compare_strategies.py --config configs/compare_hard.yaml \
        --copy-to docs/compare_hard

Each strategy also carries, from its runs' step records (mean over seeds): ``final_wilson95``
(the first seed's final held-out success with its 95% Wilson interval over the evaluation's
tasks: the interval a single seed has), ``generated_per_leaf`` and ``computed_per_leaf``
(tokens sampled, and tokens the backend computed -- prefill not served from its cache plus
sampled -- per finished trajectory), ``wall_per_step_s``, ``rollout_per_step_s`` and
``update_per_step_s``, and how the leaves ended: ``ended_share`` (the environment ended the
episode: goal or hole, not its turn limit) and ``budget_cut_share`` (the token or leaf
budget ran out first).

A comparison that samples through the vLLM engine (``base.backend.name: vllm``, as
``configs/smollm2_compare.yaml``) runs in the engine's environment (``bench/vllm_env.py``),
and each strategy trains in a process of its own (the engine is made once per process):

    python bench/compare_strategies.py --config configs/smollm2_compare.yaml \
        --copy-to docs/smollm2_compare
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from treeroll.cli.compare import CompareConfig, run_compare
from treeroll.config import load_config
from treeroll.stats import crossing
from treeroll.training.runfolder import move_aside

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def per_leaf(report: Path, arm: str, seeds: list[int]) -> dict:
    """Per-leaf tokens, per-step seconds and how the leaves ended (the shares whose episode
    the environment ended, goal or hole but not its turn limit: ``ended_share``; and that the
    token or leaf budget cut: ``budget_cut_share``) of ``arm`` from
    its runs' step records (mean over ``seeds``), and the first seed's final held-out
    success with its 95% Wilson interval."""
    rows = []
    for seed in seeds:
        run = report / "runs" / f"{arm}_seed{seed}"
        steps = []
        for line in (run / "metrics.jsonl").read_text().splitlines():
            try:  # as treeroll compare: a line cut by a crash is not a step
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "rollout_seconds" in record:
                steps.append(record)
        leaves = sum(r["leaves"] for r in steps)
        rows.append({"generated_per_leaf": sum(r["tokens"]["generated"] for r in steps) / leaves,
                     "computed_per_leaf": sum(r["tokens"]["computed"] for r in steps) / leaves,
                     "wall_per_step_s": float(np.mean([r["rollout_seconds"] + r["update_seconds"]
                                                       for r in steps])),
                     "rollout_per_step_s": float(np.mean([r["rollout_seconds"] for r in steps])),
                     "update_per_step_s": float(np.mean([r["update_seconds"] for r in steps])),
                     "ended_share": sum(r["status"].get("terminal", 0) for r in steps) / leaves,
                     "budget_cut_share": sum(r["status"].get("budget", 0) for r in steps) / leaves})
    final = json.loads((report / "runs" / f"{arm}_seed{seeds[0]}" / "summary.json").read_text())
    final = final["final_eval"]
    out = {key: round(float(np.mean([row[key] for row in rows])), 2) for key in rows[0]}
    out["final_wilson95"] = [round(final["success_rate"], 4), round(final["ci95_low"], 3),
                             round(final["ci95_high"], 3)]
    return out


def arms_apart(config: CompareConfig, config_path: str) -> None:
    """Train each strategy in a process of its own (``treeroll compare --strategies ARM``:
    vLLM's engine is made once per process); ``run_compare`` then finds every run finished
    and writes the report."""
    import vllm_env

    if config.more_seeds or config.jobs > 1:
        raise ValueError(f"{config_path}: a comparison through the vLLM engine trains one arm "
                         "per process, one at a time, over `seeds`: drop more_seeds / "
                         f"more_seeds_for and set jobs: 1 (it has jobs: {config.jobs})")
    for arm in config.strategies:
        subprocess.run([sys.executable, "-m", "treeroll.cli", "compare", "--config",
                        config_path, "--strategies", arm], check=True,
                       env=vllm_env.environment())


def tokens_to_reach(runs: list[dict], target: float) -> float | None:
    """Generated tokens at which the seeds' mean held-out curve first reaches ``target``."""
    points = min(len(r["curve"]) for r in runs)
    for i in range(points):
        tokens = float(np.mean([r["curve"][i][0] for r in runs]))
        if float(np.mean([r["curve"][i][1] for r in runs])) >= target - 1e-12:
            return tokens
    return None


def _mean_crossing(curves: np.ndarray, target: float) -> float:
    """Tokens at which the mean over seeds of ``curves`` (seeds x points x (tokens, success))
    first reaches ``target``, interpolated between evaluations; inf if never."""
    mean = curves.mean(axis=0)
    return crossing([(float(t), float(s)) for t, s in mean], target)


def reach_of(runs: list[dict], chain_runs: list[dict], resamples: int = 2000,
             seed: int = 0) -> dict:
    """Generated tokens at which the seeds' mean curve reaches chain's final mean success,
    over chain's own, with a bootstrap 95% interval: seeds resampled on both sides, chain's
    final re-estimated from each resample (chain's own point ratio is 1; its interval shows
    the noise of the comparison). A
    resample in which the strategy never reaches it, or chain's resampled final is not above
    its start (no ratio), counts as an infinite ratio; with chain's final not above its start
    there is no point ratio (None)."""
    points = min(len(r["curve"]) for r in [*runs, *chain_runs])
    mine = np.array([[p[:2] for p in r["curve"][:points]] for r in runs], dtype=float)
    theirs = np.array([[p[:2] for p in r["curve"][:points]] for r in chain_runs], dtype=float)
    target = float(theirs[:, -1, 1].mean())
    reference = _mean_crossing(theirs, target)
    # chain's final at or below its start: its curve "reaches" it at 0 tokens, no ratio
    ratio = _mean_crossing(mine, target) / reference if reference > 0 else math.nan
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(resamples):
        a = mine[rng.integers(0, len(mine), len(mine))]
        b = theirs[rng.integers(0, len(theirs), len(theirs))]
        final = float(b[:, -1, 1].mean())
        theirs_at = _mean_crossing(b, final)
        # as treeroll.stats.ratio_to: a resample with no ratio counts as never
        samples.append(_mean_crossing(a, final) / theirs_at if theirs_at > 0 else math.inf)
    ordered = np.sort(np.asarray(samples))  # inf sorts last; percentile() would make nan
    low, high = ordered[int(0.025 * resamples)], ordered[int(0.975 * resamples) - 1]
    shown = (lambda x: None if not np.isfinite(x) else round(float(x), 3))
    return {"chain_final": round(target, 4), "ratio_to_chain": shown(ratio),
            "ci95": [shown(low), shown(high)]}


def main() -> None:
    """Run (or resume) the comparison; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "compare_frozenlake.yaml"))
    parser.add_argument("--fresh", action="store_true", help="move an existing report "
                        "folder aside first (runs on older code are not read back)")
    parser.add_argument("--copy-to", default=None, help="copy the report files here after")
    args = parser.parse_args()
    config = load_config(args.config, CompareConfig)
    report = Path(config.report_dir)
    import vllm_env

    engine = vllm_env.reexec_for(config.base.backend)  # a vLLM comparison runs in its env
    if args.fresh:
        move_aside(report)
    if engine:
        arms_apart(config, args.config)
    run_compare(config)
    if args.copy_to:
        target = Path(args.copy_to)
        target.mkdir(parents=True, exist_ok=True)
        for item in report.iterdir():
            if item.is_file():
                shutil.copy2(item, target / item.name)
    results = json.loads((report / "results.json").read_text())
    chain_final = results["chain"]["final_success"] if "chain" in results else None
    out: dict = {"config": Path(args.config).name, "seeds": len(config.seeds),
                 "steps": config.base.optim.steps,
                 "tasks_per_step": config.base.optim.tasks_per_step,
                 "token_budget": config.token_budget, "eval_tasks": config.base.eval.tasks,
                 "jobs": config.jobs}
    for strategy, row in results.items():
        out[strategy] = {
            "final": round(row["final_success"], 4),
            "ci95": None if row["ci95"] is None else [round(x, 4) for x in row["ci95"]],
            "start": round(row["start"], 4),
            "generated_tokens": round(row["generated_tokens"]),
            "seeds": len(row["runs"]), "signal_groups": row["signal_groups"],
            "tokens_to_target": row.get("tokens_to_target"),
            "tokens_to_chain_final": None if chain_final is None
            else tokens_to_reach(row["runs"], chain_final)}
        out[strategy].update(per_leaf(report, strategy, list(config.seeds)))
        if chain_final is not None:
            out[strategy]["reach_chain_final"] = reach_of(row["runs"], results["chain"]["runs"])
    if "patr" in results and "chain" in results:
        patr, chain = results["patr"], results["chain"]
        out["patr_minus_chain"] = round(patr["final_success"] - chain["final_success"], 4)
        out["patr_separated_from_chain"] = (None if patr["ci95"] is None or chain["ci95"] is None
                                            else patr["ci95"][0] > chain["ci95"][1])
        mine, theirs = out["patr"]["tokens_to_chain_final"], out["chain"]["tokens_to_chain_final"]
        out["patr_tokens_over_chain"] = (round(mine / theirs, 3) if mine is not None and theirs
                                         else None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
