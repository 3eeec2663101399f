"""``kill -9`` a training run at random moments, resume it each time, and count what was lost.

One uninterrupted ``treeroll train`` run (``configs/tiny.yaml``, more steps), then the same run
killed with SIGKILL ``--kills`` times at random moments (a random number of logged steps plus a
random delay, so kills land in rollouts, updates, evaluations and checkpoint writes) and
resumed with ``--resume`` after each kill until it finishes. Then its ``metrics.jsonl`` is
compared with the uninterrupted run's, step by step, wall times left out:

- ``lost_steps``: steps the uninterrupted run logged that the killed one does not have;
- ``duplicated_steps``: steps logged more than once;
- ``resumed_ok``: every resume exited 0, the records are equal and so are the final weights.

Prints one JSON object as its last line. Usage: ``python bench/crash_resume.py --quick``
(5 kills of a 12-step run, about two minutes here).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"rollout_seconds", "update_seconds", "timing"}


def command(runs: Path, name: str, steps: int, *extra: str) -> list[str]:
    """``treeroll train`` on the tiny config."""
    return [sys.executable, "-m", "treeroll.cli", "train", "--config", "configs/tiny.yaml",
            "--runs-dir", str(runs), "--name", name, "--optim.steps", str(steps),
            "--checkpoint-every", "3", "--threads", "1", *extra]


def records(run: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` without wall times."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.append({k: v for k, v in record.items() if k not in TIMING})
    return out


def kill_once(runs: Path, steps: int, chooser: random.Random) -> bool:
    """Start the run (resume it once it has a checkpoint; before its first checkpoint a run
    starts over) and SIGKILL it at a random moment; False if it finished first."""
    resume = (runs / "killed" / "checkpoints" / "last.pt").exists()
    metrics = runs / "killed" / "metrics.jsonl"
    before = metrics.read_text().count('"leaves"') if metrics.exists() else 0
    # a kill lands before the run's last two steps are logged: a promised kill never finds the
    # run already finished (a wait past the end would let it finish, and the kill not land)
    wait_for = min(before + chooser.randint(0, 3), steps - 2)
    delay = chooser.uniform(0.0, 0.5)
    process = subprocess.Popen(command(runs, "killed", steps, *(["--resume"] if resume else [])),
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        logged = metrics.read_text().count('"leaves"') if metrics.exists() else 0
        if logged >= wait_for:
            break
        time.sleep(0.02)
    time.sleep(delay)
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    return True


def main() -> None:
    """Run, kill, resume, compare; print the JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 kills of a 12-step run")
    parser.add_argument("--kills", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    args = parser.parse_args()
    kills = args.kills or (5 if args.quick else 20)
    steps = args.steps or (12 if args.quick else 30)
    chooser = random.Random(args.seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        subprocess.run(command(runs, "whole", steps), cwd=ROOT, check=True,
                       capture_output=True, timeout=1800)
        done_kills = 0
        while done_kills < kills and kill_once(runs, steps, chooser):
            done_kills += 1
        resumes_ok = True
        if not (runs / "killed" / "summary.json").exists() or not json.loads(
                (runs / "killed" / "summary.json").read_text()).get("finished"):
            resume = (runs / "killed" / "checkpoints" / "last.pt").exists()
            finish = subprocess.run(command(runs, "killed", steps,
                                            *(["--resume"] if resume else [])),
                                    cwd=ROOT, capture_output=True, text=True, timeout=1800)
            resumes_ok = finish.returncode == 0
        whole, killed = records(runs / "whole"), records(runs / "killed")
        key = lambda r: (r.get("step"), "final" if r.get("final") else "step")
        seen = Counter(key(r) for r in killed)
        lost = sorted({key(r) for r in whole} - set(seen), key=str)
        duplicated = sorted((k for k, n in seen.items() if n > 1), key=str)
        weights = [torch.load(runs / name / "checkpoints" / "last.pt",
                              weights_only=False)["model"] for name in ("whole", "killed")]
        same_weights = all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    print(json.dumps({
        "kills": done_kills, "kills_promised": kills, "lost_steps": len(lost),
        "duplicated_steps": len(duplicated),
        "resumed_ok": bool(resumes_ok and killed == whole and same_weights),
        "records_equal": killed == whole, "weights_equal": same_weights, "steps": steps,
        "kill_seed": args.seed, "seconds": round(time.perf_counter() - start, 1),
        "config": "configs/tiny.yaml",
    }))


if __name__ == "__main__":
    main()
