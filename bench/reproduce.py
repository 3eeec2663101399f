"""Rerun the figures the README quotes and store each, with the commit it ran on.

Each figure is one command of this repository that prints one JSON object as its last line
(the benchmarks under ``bench/``); its result goes to ``docs/results/<name>.json`` with the
command, the commit, whether the tree had uncommitted code changes, the date, the time it
took and ``depends_on``: the repository files its processes imported or read (code,
configs, the shipped weights, data; traced by ``bench/_trace/sitecustomize.py``) and the
pinned dependencies (``pyproject.toml``). A figure is *stale* when one of those changed since
its commit; ``bench/readme_results.py`` then labels it so in the README, and
``tests/test_results.py`` checks every quoted figure equals its file and carries its label.

    python bench/reproduce.py --list           # every figure: current or stale, last duration
    python bench/reproduce.py --stale          # remake the stale ones, in a worktree of HEAD
    python bench/reproduce.py --stale --at 1a2b3c4   # ... of that commit
    python bench/reproduce.py --quick          # the quick figures (about 15 minutes here)
    python bench/reproduce.py --full           # the quick ones and the long ones (~2.5 hours)
    python bench/reproduce.py --only learning_quick base_policy_quick

``--stale`` runs in a git worktree of the commit (``.remake/<commit>/``, ignored by git), so
the main checkout can change meanwhile; each figure's result and output folders are copied
back into this checkout's ``docs/`` as soon as it ends, and a line per figure is appended to
``docs/results/_remakes.jsonl``; the run folders the figures wrote under the worktree's
``reports/`` are moved to ``reports/remade/<commit>/`` before the worktree is removed. It is
resumable: run it again after an interrupt and it remakes only what is still stale at that
commit. No figure reads another's output, so the dependency order is the order of
``FIGURES``: the quick ones first, so a failure in shared code shows in minutes rather than
after the long comparisons.

``--quick``, ``--full`` and ``--only`` run in this checkout: commit the code first, a figure
measured on uncommitted code is recorded as ``dirty`` and the test refuses it. The commands
run one after another (never two at once: timings on a shared 2-core machine are only
comparable that way).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from staleness import changed_since, git

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
REMAKES = RESULTS / "_remakes.jsonl"
"""One line per figure ``--stale`` remade: what it did, when, on which commit."""
WORKTREES = ROOT / ".remake"
ALWAYS = ("pyproject.toml", "constraints.txt", "src/treeroll/policies", "src/treeroll/data")
"""What every figure depends on besides the files its run imported or read: the pinned
dependencies, and the shipped policies and data, which are also read outside Python's
``open`` (safetensors maps weights from Rust; task files are copied by the sandbox)."""
CODE = ("src", "bench", "configs", "pyproject.toml")
"""Where a code change makes a figure measured on a dirty tree unreliable."""


@dataclass(frozen=True)
class Figure:
    """One reproducible figure: a command printing one JSON object as its last line."""

    name: str
    command: tuple[str, ...]
    quick: bool
    minutes: float
    """About how long it takes here (2 cores), until it has run once."""
    outputs: tuple[str, ...] = ()
    """Folders the command writes besides its JSON line (copied back from a worktree)."""


FIGURES = (
    Figure("base_policy_quick", ("bench/base_policy.py", "--quick"), True, 0.5),
    Figure("swe_fork_quick", ("bench/swe_fork.py", "--quick"), True, 0.3),
    Figure("rollout_cost_quick", ("bench/rollout_cost.py", "--quick"), True, 2),
    Figure("patr_cost_quick", ("bench/patr_cost.py", "--quick"), True, 1),
    Figure("rollout_scaling_quick", ("bench/rollout_scaling.py", "--quick"), True, 1.5),
    Figure("engine_step", ("bench/engine_step.py",), True, 1),
    Figure("train_cost_quick", ("bench/train_cost.py", "--quick"), True, 2),
    Figure("packed_full_step", ("bench/packed_full_step.py",), True, 1.5),
    Figure("server_backend_quick", ("bench/server_backend.py", "--quick"), True, 0.5),
    Figure("ray_scaling_quick", ("bench/ray_scaling.py", "--quick"), True, 1),
    Figure("trl_adapter_quick", ("bench/trl_adapter.py", "--quick"), True, 0.7),
    Figure("early_forks", ("bench/early_forks.py",), True, 3),
    Figure("fuzz_quick", ("bench/fuzz.py", "--quick"), True, 0.2),
    Figure("crash_resume_quick", ("bench/crash_resume.py", "--quick"), True, 1),
    Figure("learning_quick", ("bench/learning.py", "--quick"), True, 6),
    Figure("base_policy", ("bench/base_policy.py",), False, 0.5),
    Figure("probe_shield", ("bench/probe_shield.py",), False, 1.5),
    Figure("sft_base", ("bench/sft_base.py",), False, 5),
    Figure("default_training", ("bench/learning.py", "--seeds", "0", "1", "2", "--keep",
                                "docs/default_training"), False, 50, ("docs/default_training",)),
    Figure("compare_strategies", ("bench/compare_strategies.py", "--fresh", "--copy-to",
                                  "docs/compare_frozenlake"), False, 75,
           ("docs/compare_frozenlake",)),
    Figure("compare_family", ("bench/compare_strategies.py", "--config",
                              "configs/compare_family.yaml", "--fresh", "--copy-to",
                              "docs/compare_family"), False, 30, ("docs/compare_family",)),
    Figure("compare_hard", ("bench/compare_strategies.py", "--config",
                            "configs/compare_hard.yaml", "--copy-to", "docs/compare_hard"),
           False, 240, ("docs/compare_hard",)),
    Figure("compare_budget", ("bench/compare_strategies.py", "--config",
                              "configs/compare_budget.yaml", "--copy-to", "docs/compare_budget"),
           False, 90, ("docs/compare_budget",)),
    Figure("ablations_hard", ("bench/ablations.py", "--copy-to", "docs/ablations"), False,
           180, ("docs/ablations",)),
    Figure("ablations_advantage", ("bench/ablations.py", "--only", "tree_grpo+tree_advantage",
                                   "patr+tree_advantage", "--copy-to", "docs/ablations"),
           False, 45, ("docs/ablations",)),
    Figure("advantage_variance", ("bench/advantage_variance.py", "--threads", "1"), False, 20),
    Figure("allocation_quick", ("bench/allocation.py", "--quick", "--fresh"), False, 15),
    Figure("allocation", ("bench/allocation.py", "--fresh"), False, 30),
    Figure("real_model", ("bench/real_model.py",), False, 180),
    Figure("vllm_cpu", ("bench/vllm_cpu.py",), False, 25),
    Figure("real_model_update", ("bench/real_model.py", "--update-only"), False, 2),
    Figure("real_model_decode", ("bench/real_model_decode.py",), False, 2),
    Figure("real_model_rl", ("bench/real_model.py", "--rl-only"), False, 120),
    Figure("smollm2_compare", ("bench/compare_strategies.py", "--config",
                               "configs/smollm2_compare.yaml", "--copy-to",
                               "docs/smollm2_compare"), False, 100, ("docs/smollm2_compare",)),
    Figure("trl_adapter", ("bench/trl_adapter.py",), False, 3.5),
    Figure("trl_drift", ("bench/trl_drift.py",), False, 5),
)


def cpu_model() -> str:
    """The machine's CPU model (``/proc/cpuinfo``'s model name; ``platform.processor()``
    elsewhere): figures that are not bit-reproducible across CPUs (a long from-scratch SFT
    run) say which one they came from."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def code_is_dirty(root: Path = ROOT) -> bool:
    """Whether the working tree has uncommitted changes to the code figures depend on."""
    return bool(git("status", "--porcelain", "--", *CODE, root=root))


def imported_repo_files(trace: Path, root: Path = ROOT) -> set[str]:
    """The repository's files (code, configs, shipped data) among those a traced run
    imported or read, as paths from the root."""
    found = set()
    for line in trace.read_text().splitlines() if trace.exists() else []:
        path = Path(line).resolve()
        relative = path.relative_to(root) if path.is_relative_to(root) else None
        if relative is not None and relative.parts[0] in ("src", "bench", "configs") \
                and "_trace" not in relative.parts and "__pycache__" not in relative.parts \
                and path.is_file():
            found.add(str(relative))
    return found


def run_figure(figure: Figure, root: Path = ROOT) -> dict:
    """Run one figure's command in ``root`` (this checkout or a worktree, whose own ``src``
    is imported); store its record in ``root``'s ``docs/results`` and return it."""
    commit, dirty = git("rev-parse", "HEAD", root=root), code_is_dirty(root)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    trace = Path(tempfile.mkstemp(prefix="treeroll-imports-", suffix=".txt")[1])
    env = {**os.environ, "TREEROLL_TRACE_IMPORTS": str(trace),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(root / "bench" / "_trace"),
                                                       str(root / "src"),
                                                       os.environ.get("PYTHONPATH"))))}
    tick = time.perf_counter()
    done = subprocess.run([sys.executable, *figure.command], cwd=root, capture_output=True,
                          text=True, env=env)
    seconds = time.perf_counter() - tick
    depends_on = sorted(imported_repo_files(trace, root) | {figure.command[0], *ALWAYS})
    trace.unlink(missing_ok=True)
    if done.returncode != 0:
        raise SystemExit(f"{figure.name}: `python {' '.join(figure.command)}` failed "
                         f"({done.returncode}) in {root}:\n{done.stderr[-3000:]}")
    last = done.stdout.strip().splitlines()[-1]
    record = {"name": figure.name, "command": "python " + " ".join(figure.command),
              "commit": commit, "dirty": dirty, "started": started, "cpu": cpu_model(),
              "seconds": round(seconds, 1), "depends_on": depends_on,
              "result": json.loads(last)}
    results = root / "docs" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{figure.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def last_seconds(figure: Figure) -> float:
    """How long the figure's last run took, or the estimate when it never ran with this
    command."""
    record = stored(figure.name)
    same = record is not None and record["command"] == "python " + " ".join(figure.command)
    return record["seconds"] if same else 60 * figure.minutes


def stored(name: str) -> dict | None:
    """A figure's stored record in this checkout, or None if it never ran."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def status(figure: Figure, at: str | None = None) -> tuple[str, list[str]]:
    """``("current" | "stale" | "dirty" | "never run", changed files)`` of a figure against
    the commit ``at`` (None: the working tree)."""
    record = stored(figure.name)
    if record is None:
        return "never run", []
    if record["dirty"]:
        return "dirty", []
    files = changed_since(record["commit"], record["depends_on"], to=at)
    return ("stale" if files else "current"), files


def list_figures() -> None:
    """Print every figure with its status, its last run's duration and commit."""
    total = 0.0
    for figure in FIGURES:
        state, files = status(figure)
        record = stored(figure.name)
        minutes = last_seconds(figure) / 60
        if state != "current":
            total += minutes
        last = (f"{minutes:5.1f} min on {record['commit'][:10]} ({record['started'][:10]})"
                if record else f"~{minutes:g} min (never run)")
        why = f" ({len(files)} files changed, e.g. {files[0]})" if files else ""
        print(f"{figure.name:22s} {'quick' if figure.quick else 'full ':5s} {state:9s} {last}  "
              f"python {' '.join(figure.command)}{why}")
    print(f"remaking every figure not current: about {total:.0f} min here")


def worktree_at(commit: str) -> Path:
    """A git worktree of ``commit`` under ``.remake/`` (made, or found from an earlier run)."""
    path = WORKTREES / commit[:12]
    if path.exists():
        if git("rev-parse", "HEAD", root=path) != commit:
            raise SystemExit(f"{path} exists but is not at {commit}; remove it with "
                             f"`git worktree remove --force {path}`")
        return path
    WORKTREES.mkdir(exist_ok=True)
    git("worktree", "add", "--detach", str(path), commit)
    return path


def copy_back(figure: Figure, worktree: Path) -> None:
    """Copy a figure's stored result and output folders from a worktree into this checkout."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"{figure.name}.json"
    shutil.copyfile(worktree / "docs" / "results" / name, RESULTS / name)
    for output in figure.outputs:
        shutil.rmtree(ROOT / output, ignore_errors=True)
        shutil.copytree(worktree / output, ROOT / output)


def remake_stale(at: str, figures: list[Figure]) -> dict:
    """Remake, in a worktree of commit ``at``, each of ``figures`` that is stale (or never
    run, or dirty) against it, in ``FIGURES`` order; resumable. Returns ``{name: seconds}``."""
    try:
        commit = git("rev-parse", "--verify", f"{at}^{{commit}}")
    except ValueError:
        raise SystemExit(f"--at {at}: not a commit of this repository") from None
    todo = [f for f in FIGURES if f in figures and status(f, commit)[0] != "current"]
    print(f"{len(todo)} figures to remake at {commit[:10]} (about "
          f"{sum(last_seconds(f) for f in todo) / 60:.0f}"
          f" min): {', '.join(f.name for f in todo) or 'none'}", file=sys.stderr, flush=True)
    if not todo:
        return {}
    worktree = worktree_at(commit)
    done = {}
    for figure in todo:
        print(f"{figure.name}: python {' '.join(figure.command)} in {worktree}", file=sys.stderr,
              flush=True)
        record = run_figure(figure, worktree)
        copy_back(figure, worktree)
        done[figure.name] = record["seconds"]
        with REMAKES.open("a") as log:
            log.write(json.dumps({"name": figure.name, "commit": commit,
                                  "finished": datetime.now(UTC).isoformat(timespec="seconds"),
                                  "seconds": record["seconds"],
                                  "outputs": list(figure.outputs)}) + "\n")
        print(f"  {record['seconds']:.0f} s -> docs/results/{figure.name}.json", file=sys.stderr,
              flush=True)
    kept = keep_runs(worktree / "reports", ROOT / "reports" / "remade" / commit[:12])
    if kept:
        print(f"  the run folders it wrote: {kept}", file=sys.stderr, flush=True)
    git("worktree", "remove", "--force", str(worktree))
    return done


def keep_runs(reports: Path, into: Path) -> Path | None:
    """Move a worktree's ``reports/`` (the figures' run folders: metrics, checkpoints, trees)
    to ``into`` before the worktree is removed, so what the remake trained is not lost with it
    (the figure keeps only its summary). Entries already in ``into`` are left as they are and
    the new ones land beside them, suffixed. Returns ``into``, or None when there was nothing."""
    if not reports.is_dir() or not any(reports.iterdir()):
        return None
    into.mkdir(parents=True, exist_ok=True)
    for entry in sorted(reports.iterdir()):
        target, n = into / entry.name, 1
        while target.exists():
            target, n = into / f"{entry.name}.{n}", n + 1
        shutil.move(str(entry), str(target))
    return into


def main(argv: list[str] | None = None) -> None:
    """Run the chosen figures one after another."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=False)
    group.add_argument("--quick", action="store_true", help="the quick figures")
    group.add_argument("--full", action="store_true", help="every figure")
    group.add_argument("--only", nargs="+", metavar="NAME",
                       help="these figures (with --stale: those of them that are stale)")
    group.add_argument("--list", action="store_true",
                       help="every figure with its status and last duration")
    parser.add_argument("--stale", action="store_true",
                        help="remake the stale figures (all, or those of --only) in a worktree "
                             "of --at; resumable")
    parser.add_argument("--at", default="HEAD", metavar="COMMIT",
                        help="with --stale: the commit to remake them on (default HEAD)")
    args = parser.parse_args(argv)
    if not (args.quick or args.full or args.only or args.list or args.stale):
        parser.error("say what to run: --list, --stale, --quick, --full or --only NAME ...")
    by_name = {f.name: f for f in FIGURES}
    unknown = [n for n in args.only or () if n not in by_name]
    if unknown:
        parser.error(f"--only: unknown figure(s) {', '.join(unknown)}; valid: "
                     f"{', '.join(by_name)}")
    if args.stale and (args.quick or args.full or args.list):
        parser.error("--stale takes the stale figures of all (alone) or of --only NAME ...")
    if args.at != "HEAD" and not args.stale:
        parser.error("--at names the commit --stale remakes on; it needs --stale")
    if args.list:
        list_figures()
        return
    if args.stale:
        chosen = [by_name[n] for n in args.only] if args.only else list(FIGURES)
        done = remake_stale(args.at, chosen)
        print(json.dumps({"figures": done, "commit": git("rev-parse", args.at)}))
        return
    if args.only:
        chosen = [by_name[n] for n in args.only]
    else:
        chosen = [f for f in FIGURES if f.quick or args.full]
    if code_is_dirty():
        print("warning: uncommitted code changes; these figures will be recorded as dirty "
              "and refused by tests/test_results.py", file=sys.stderr)
    summary = {}
    for figure in chosen:
        print(f"{figure.name}: python {' '.join(figure.command)} (~{figure.minutes:g} min)",
              file=sys.stderr, flush=True)
        record = run_figure(figure)
        summary[figure.name] = record["seconds"]
        print(f"  {record['seconds']:.0f} s -> docs/results/{figure.name}.json", file=sys.stderr,
              flush=True)
    print(json.dumps({"figures": summary, "commit": git("rev-parse", "HEAD")}))


if __name__ == "__main__":
    main()
