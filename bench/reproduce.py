"""Rerun every figure the README quotes and store each, with the commit it ran on.

Each figure is one command of this repository that prints one JSON object as its last line
(the benchmarks under ``bench/``); its result goes to ``docs/results/<name>.json`` with the
command, the commit, whether the tree had uncommitted code changes, the date, the time it
took and ``depends_on``: the repository files its processes imported or read (code,
configs, the shipped weights, data; traced by ``bench/_trace/sitecustomize.py``) and the
pinned dependencies (``pyproject.toml``).
``tests/test_results.py`` then checks that every figure the README quotes equals its stored
file and that none of the files it depends on changed since the commit it was measured on.

    python bench/reproduce.py --quick          # the quick figures (about 15 minutes here)
    python bench/reproduce.py --full           # the quick ones and the long ones (about 40)
    python bench/reproduce.py --only learning_quick base_policy_quick
    python bench/reproduce.py --list

Commit the code first: a figure measured on uncommitted code is recorded as ``dirty`` and the
test refuses it. The commands run one after another (never two at once: timings on a shared
2-core machine are only comparable that way).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
ALWAYS = ("pyproject.toml", "src/treeroll/policies", "src/treeroll/data")
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
    """About how long it takes here (2 cores)."""


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
    Figure("trl_adapter_quick", ("bench/trl_adapter.py", "--quick"), True, 0.5),
    Figure("fuzz_quick", ("bench/fuzz.py", "--quick"), True, 0.2),
    Figure("crash_resume_quick", ("bench/crash_resume.py", "--quick"), True, 1),
    Figure("learning_quick", ("bench/learning.py", "--quick"), True, 6),
    Figure("base_policy", ("bench/base_policy.py",), False, 0.5),
    Figure("probe_shield", ("bench/probe_shield.py",), False, 1.5),
    Figure("sft_base", ("bench/sft_base.py",), False, 5),
    Figure("default_training", ("bench/learning.py", "--keep", "docs/default_training"), False,
           18),
    Figure("compare_strategies", ("bench/compare_strategies.py", "--fresh", "--copy-to",
                                  "docs/compare_frozenlake"), False, 75),
    Figure("compare_family", ("bench/compare_strategies.py", "--config",
                              "configs/compare_family.yaml", "--fresh", "--copy-to",
                              "docs/compare_family"), False, 30),
    Figure("allocation_quick", ("bench/allocation.py", "--quick", "--fresh"), False, 15),
    Figure("allocation", ("bench/allocation.py", "--fresh"), False, 30),
)


def git(*args: str) -> str:
    """Output of a git command in the repository."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


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


def code_is_dirty() -> bool:
    """Whether the working tree has uncommitted changes to the code figures depend on."""
    return bool(git("status", "--porcelain", "--", *CODE))


def imported_repo_files(trace: Path) -> set[str]:
    """The repository's files (code, configs, shipped data) among those a traced run
    imported or read, as paths from the root."""
    found = set()
    for line in trace.read_text().splitlines() if trace.exists() else []:
        path = Path(line).resolve()
        relative = path.relative_to(ROOT) if path.is_relative_to(ROOT) else None
        if relative is not None and relative.parts[0] in ("src", "bench", "configs") \
                and "_trace" not in relative.parts and "__pycache__" not in relative.parts \
                and path.is_file():
            found.add(str(relative))
    return found


def run_figure(figure: Figure) -> dict:
    """Run one figure's command; store and return its record."""
    commit, dirty = git("rev-parse", "HEAD"), code_is_dirty()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    trace = Path(tempfile.mkstemp(prefix="treeroll-imports-", suffix=".txt")[1])
    env = {**os.environ, "TREEROLL_TRACE_IMPORTS": str(trace),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "bench" / "_trace"),
                                                       os.environ.get("PYTHONPATH"))))}
    tick = time.perf_counter()
    done = subprocess.run([sys.executable, *figure.command], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    seconds = time.perf_counter() - tick
    depends_on = sorted(imported_repo_files(trace) | {figure.command[0], *ALWAYS})
    trace.unlink(missing_ok=True)
    if done.returncode != 0:
        raise SystemExit(f"{figure.name}: `python {' '.join(figure.command)}` failed "
                         f"({done.returncode}):\n{done.stderr[-3000:]}")
    last = done.stdout.strip().splitlines()[-1]
    record = {"name": figure.name, "command": "python " + " ".join(figure.command),
              "commit": commit, "dirty": dirty, "started": started, "cpu": cpu_model(),
              "seconds": round(seconds, 1), "depends_on": depends_on,
              "result": json.loads(last)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{figure.name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def main() -> None:
    """Run the chosen figures one after another."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--quick", action="store_true", help="the quick figures")
    group.add_argument("--full", action="store_true", help="every figure")
    group.add_argument("--only", nargs="+", metavar="NAME", help="these figures")
    group.add_argument("--list", action="store_true", help="list the figures")
    args = parser.parse_args()
    by_name = {f.name: f for f in FIGURES}
    if args.list:
        for f in FIGURES:
            print(f"{f.name:20s} {'quick' if f.quick else 'full ':5s} ~{f.minutes:g} min  "
                  f"python {' '.join(f.command)}")
        return
    if args.only:
        unknown = [n for n in args.only if n not in by_name]
        if unknown:
            raise SystemExit(f"unknown figure(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(by_name)}")
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
