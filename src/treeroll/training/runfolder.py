"""Run folders shared by ``treeroll train`` and ``treeroll sft``: opening one (with the
checks that keep a user's earlier run safe), appending metrics durably, atomic checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

__all__ = ["RunFolder", "append_jsonl", "load_checkpoint", "save_checkpoint"]


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and flush it to disk (a crash never loses a written line)."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(path: Path, state: dict[str, Any], rng: np.random.Generator) -> None:
    """Write ``state`` plus every RNG (numpy's ``rng``, torch's) atomically to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        torch.save({**state, "rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state()}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def load_checkpoint(path: Path, rng: np.random.Generator) -> dict[str, Any]:
    """Read a checkpoint and restore the RNGs it saved into ``rng`` and torch."""
    state: dict[str, Any] = torch.load(path, weights_only=False)
    rng.bit_generator.state = state["rng"]
    torch.set_rng_state(state["torch_rng"])
    return state


class RunFolder:
    """``<runs_dir>/<name>``: refuses to overwrite a run that holds a checkpoint unless
    resuming, refuses to resume a run with another configuration, and writes
    ``config.yaml`` only once the run is known to start (call :meth:`start`)."""

    def __init__(self, runs_dir: str, name: str, resume: bool) -> None:
        self.path = Path(runs_dir) / name
        self.checkpoint = self.path / "checkpoints" / "last.pt"
        self.metrics = self.path / "metrics.jsonl"
        self.resume = resume
        if self.checkpoint.exists() and not resume:
            raise FileExistsError(f"run folder {self.path} already holds a checkpoint; pass "
                                  "--resume to continue it or choose another --name")
        if resume and not self.checkpoint.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {self.checkpoint}")

    def check_config(self, config: dict[str, Any], may_differ: tuple[str, ...] = ()) -> None:
        """On resume, the saved ``config.yaml`` must match ``config`` except in the top-level
        or dotted keys ``may_differ`` (and ``resume``); the error lists what differs."""
        if not self.resume:
            return
        saved = yaml.safe_load((self.path / "config.yaml").read_text())
        differences = [key for key in _diff(saved, config, "")
                       if key != "resume" and not any(key == k or key.startswith(k + ".")
                                                      for k in may_differ)]
        if differences:
            raise ValueError(f"--resume: the run in {self.path} was started with another "
                             f"configuration ({', '.join(differences[:6])} differ); resume with "
                             "the same settings or start a new run with --name")

    def start(self, config: dict[str, Any]) -> None:
        """Create the folder and write the resolved ``config.yaml``. A new run in a folder
        left by an earlier one that never checkpointed first moves that run's
        ``metrics.jsonl`` and ``summary.json`` aside (``*.old``, numbered), so nothing is
        mixed or lost."""
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            for name in ("metrics.jsonl", "summary.json"):
                old = self.path / name
                if old.exists():
                    number = 1
                    while (self.path / f"{name}.old{number}").exists():
                        number += 1
                    old.replace(self.path / f"{name}.old{number}")
        (self.path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def keep_records_until(self, step: int) -> None:
        """On resume from a checkpoint at ``step``: drop the metrics records written after
        it (a crash between a record and the next checkpoint would log those steps twice),
        the final records of a finished run (``"final": true``, written again at its new
        end) and a last line cut short by a crash."""
        if not self.metrics.exists():
            return
        kept = []
        for line in self.metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step and not record.get("final"):
                kept.append(line)
        tmp = self.metrics.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.metrics)


def _diff(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        a, b = list(a), list(b)
    return [] if a == b else [where]
