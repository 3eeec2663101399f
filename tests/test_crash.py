"""``kill -9`` during ``treeroll sft`` and ``treeroll compare``, then run again: nothing lost,
nothing logged twice, the same weights as an uninterrupted run (``treeroll train``'s case is
``tests/test_resume.py`` and ``bench/crash_resume.py``)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
WALL = {"seconds", "rollout_seconds", "update_seconds", "timing", "wall_seconds"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "treeroll.cli", *args]


def _records(metrics: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in WALL}
            for line in metrics.read_text().splitlines()]


def _kill_when(command: list[str], ready: Callable[[], bool], delay: float) -> None:
    """Start ``command``, SIGKILL it ``delay`` seconds after ``ready()`` holds; it must not
    have finished before."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None and not ready():
        time.sleep(0.02)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run ended before the kill"


def _weights(checkpoint: Path) -> dict:
    return torch.load(checkpoint, weights_only=False)["model"]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _sft_config(path: Path, runs: Path) -> Path:
    config = {"runs_dir": str(runs), "checkpoint_every": 2, "log_every": 1, "threads": 1,
              "env": {"frozenlake": {"size_min": 2, "size_max": 3}, "train_tasks": 100},
              "policy": {"init": None, "model": {"hidden_size": 32, "num_layers": 1,
                                                 "num_heads": 2, "intermediate_size": 64}},
              "data": {"episodes_per_step": 3, "skill": 0.7},
              "optim": {"steps": 12, "lr": 0.003, "warmup_steps": 1,
                        "micro_batch_tokens": 256},
              "eval": {"tasks": 4, "every": 4, "tasks_during": 2}}
    path.write_text(yaml.safe_dump(config))
    return path


def test_sft_killed_at_a_random_moment_then_resumed_matches_the_uninterrupted_run(
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = _sft_config(tmp_path / "sft.yaml", runs)
    sft = _cli("sft", "--config", str(config))
    subprocess.run([*sft, "--name", "whole"], cwd=ROOT, check=True, capture_output=True,
                   timeout=600)
    seed = random.randrange(2**32)  # a new moment each run; the seed is in every message
    chooser = random.Random(seed)
    after, delay = chooser.randint(3, 9), chooser.uniform(0.0, 0.3)
    metrics = runs / "killed" / "metrics.jsonl"

    def ready() -> bool:
        logged = metrics.read_text().count('"loss"') if metrics.exists() else 0
        return logged >= after and (runs / "killed" / "checkpoints" / "last.pt").exists()

    _kill_when([*sft, "--name", "killed"], ready, delay)
    subprocess.run([*sft, "--name", "killed", "--resume"], cwd=ROOT, check=True,
                   capture_output=True, timeout=600)
    whole, killed = _records(runs / "whole" / "metrics.jsonl"), _records(metrics)
    assert killed == whole, f"killed after {after} steps + {delay:.2f} s (seed {seed})"
    steps = [r["step"] for r in killed if "loss" in r]
    assert steps == sorted(set(steps)) == list(range(1, 13))  # none lost, none twice
    assert _same_weights(runs / "whole" / "checkpoints" / "last.pt",
                         runs / "killed" / "checkpoints" / "last.pt")


def _compare_config(path: Path, report: Path) -> Path:
    base = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    base.update({"checkpoint_every": 2, "threads": 1})
    base["optim"]["steps"] = 6
    base["eval"].update({"tasks": 4, "tasks_during": 2, "every": 3})
    config = {"report_dir": str(report), "strategies": ["chain", "tree_grpo"], "seeds": [0],
              "token_budget": 40, "base": base}
    path.write_text(yaml.safe_dump(config))
    return path


def test_compare_killed_at_a_random_moment_then_rerun_resumes_its_unfinished_run(
        tmp_path: Path) -> None:
    whole_report, killed_report = tmp_path / "whole", tmp_path / "killed"
    whole = _cli("compare", "--config", str(_compare_config(tmp_path / "w.yaml", whole_report)))
    killed = _cli("compare", "--config", str(_compare_config(tmp_path / "k.yaml",
                                                             killed_report)))
    subprocess.run(whole, cwd=ROOT, check=True, capture_output=True, timeout=900)
    seed = random.randrange(2**32)  # a new moment each run; the seed is in every message
    chooser = random.Random(seed)
    victim = chooser.choice(["chain_seed0", "tree_grpo_seed0"])  # the run the kill lands in
    after, delay = chooser.randint(1, 5), chooser.uniform(0.0, 0.3)
    run = killed_report / "runs" / victim

    def ready() -> bool:
        metrics = run / "metrics.jsonl"
        logged = metrics.read_text().count('"leaves"') if metrics.exists() else 0
        return logged >= after and (run / "checkpoints" / "last.pt").exists()

    _kill_when(killed, ready, delay)
    subprocess.run(killed, cwd=ROOT, check=True, capture_output=True, timeout=900)
    for name in ("chain_seed0", "tree_grpo_seed0"):
        a, b = whole_report / "runs" / name, killed_report / "runs" / name
        records = _records(b / "metrics.jsonl")
        assert records == _records(a / "metrics.jsonl"), \
            f"{name}: killed in {victim} after {after} steps + {delay:.2f} s (seed {seed})"
        steps = [r["step"] for r in records if "leaves" in r]
        assert steps == sorted(set(steps)) == list(range(1, 7))
        assert _same_weights(a / "checkpoints" / "last.pt", b / "checkpoints" / "last.pt")
    results = [json.loads((report / "results.json").read_text())
               for report in (whole_report, killed_report)]
    finals = [{s: row["final_success"] for s, row in r.items()} for r in results]
    assert finals[0] == finals[1]
