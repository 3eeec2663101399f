"""Run folders shared by ``treeroll train`` and ``treeroll sft``: opening one (with the
checks that keep a user's earlier run safe), appending metrics durably, atomic checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from treeroll.causal_lm import CausalLM

__all__ = [
    "RunFolder",
    "append_jsonl",
    "check_state_fits",
    "config_differences",
    "deferred_interrupt",
    "finished_steps",
    "load_checkpoint",
    "move_aside",
    "read_checkpoint",
    "save_checkpoint",
]


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


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's saved state; a file that does not read back (truncated or overwritten
    outside treeroll: treeroll's own writes are atomic) raises a ``ValueError`` naming it,
    not the unpickler's traceback."""
    try:
        state: dict[str, Any] = torch.load(path, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as error:  # torch raises pickle, zip and runtime errors alike
        raise ValueError(f"checkpoint {path} cannot be read ({type(error).__name__}: "
                         f"{error}); it is damaged or not a treeroll checkpoint. Restore it, "
                         "or move the run folder aside and train again") from error
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"checkpoint {path} holds no model state: it is not a treeroll "
                         "checkpoint")
    return state


def load_checkpoint(path: Path, rng: np.random.Generator) -> dict[str, Any]:
    """Read a checkpoint (see :func:`read_checkpoint`) and restore the RNGs it saved into
    ``rng`` and torch."""
    state = read_checkpoint(path)
    rng.bit_generator.state = state["rng"]
    torch.set_rng_state(state["torch_rng"])
    return state


class RunFolder:
    """``<runs_dir>/<name>``: refuses to overwrite a run that holds a checkpoint unless
    resuming, to resume a finished run unless extending it to more ``steps``, and to resume a
    run with another configuration unless forced; writes ``config.yaml`` only once the run
    is known to start (call :meth:`start`)."""

    def __init__(self, runs_dir: str, name: str, resume: bool, *, extend: bool = False,
                 steps: int | None = None) -> None:
        self.path = Path(runs_dir) / name
        self.checkpoint = self.path / "checkpoints" / "last.pt"
        self.metrics = self.path / "metrics.jsonl"
        self.resume = resume
        finished = self.finished_steps()
        if self.checkpoint.exists() and not resume:
            what = (f"a finished run ({finished} steps)" if finished is not None
                    else "an unfinished run's checkpoint")
            extra = (f"; or --extend --optim.steps N (N > {finished}) to train it further"
                     if finished is not None else "; or --resume to continue it")
            raise FileExistsError(f"run folder {self.path} already holds {what}: choose "
                                  f"another --name{extra}")
        if resume and not self.checkpoint.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {self.checkpoint}")
        if resume and finished is not None and not extend:
            raise ValueError(f"--resume: the run in {self.path} finished ({finished} steps); "
                             "to train it further pass --extend with --optim.steps above "
                             f"{finished}, or start a new run with --name")
        if extend and finished is not None and steps is not None and steps <= finished:
            raise ValueError(f"--extend: --optim.steps is {steps}, not above the {finished} "
                             f"steps the run in {self.path} finished with")

    def finished_steps(self) -> int | None:
        """The step count of a finished run in this folder, else None."""
        return finished_steps(self.path)

    def check_config(self, config: dict[str, Any], may_differ: tuple[str, ...] = (),
                     force: bool = False,
                     normalise: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                     ) -> None:
        """On resume, the saved ``config.yaml`` must match ``config`` except in the top-level
        or dotted keys ``may_differ``; the error shows each difference (saved -> now).
        ``force`` accepts the differences: the saved file is kept as ``config.yaml.old<N>``
        and a warning lists them. ``normalise`` reads the saved settings as the current code
        would (a file written by an older treeroll, keys since moved, blocks since added)."""
        if not self.resume:
            return
        saved = yaml.safe_load((self.path / "config.yaml").read_text())
        if normalise is not None:
            saved = normalise(saved)
        differences = config_differences(saved, config, may_differ)
        if not differences:
            return
        shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences[:8])
        if not force:
            raise ValueError(f"--resume: the run in {self.path} was started with other "
                             f"settings ({shown}); resume with the same settings, pass --force "
                             "to continue with these, or start a new run with --name")
        warnings.warn(f"--force: resuming {self.path} with changed settings ({shown})",
                      stacklevel=2)
        move_aside(self.path / "config.yaml")

    def start(self, config: dict[str, Any]) -> None:
        """Create the folder and write the resolved ``config.yaml``. A new run in a folder
        left by an earlier one that never checkpointed first moves that run's
        ``metrics.jsonl`` and ``summary.json`` aside (``*.old``, numbered), so nothing is
        mixed or lost."""
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            for name in ("metrics.jsonl", "summary.json"):
                move_aside(self.path / name)
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


def config_differences(saved: dict[str, Any], now: dict[str, Any],
                       may_differ: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """``(dotted key, saved value, value now)`` of every setting that differs between two
    nested config dicts (lists and tuples compare alike), leaving out the top-level or dotted
    keys ``may_differ`` and everything below them; ``None`` where a side lacks the key."""
    return [(key, _lookup(saved, key), _lookup(now, key)) for key in _diff(saved, now, "")
            if not any(key == k or key.startswith(k + ".") for k in may_differ)]


def _diff(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        a, b = list(a), list(b)
    return [] if a == b else [where]


def finished_steps(run_dir: Path) -> int | None:
    """The step count of the finished run in ``run_dir`` (its ``summary.json`` says
    ``"finished": true``), else None."""
    summary = Path(run_dir) / "summary.json"
    if not summary.is_file():
        return None
    try:
        data = json.loads(summary.read_text())
    except json.JSONDecodeError:
        return None
    return int(data.get("steps", 0)) if data.get("finished") else None


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def move_aside(path: Path) -> None:
    """Rename ``path`` (a file or folder, if it exists) to the first free
    ``<name>.old<N>``: nothing is deleted."""
    if not path.exists():
        return
    number = 1
    while path.with_name(f"{path.name}.old{number}").exists():
        number += 1
    path.replace(path.with_name(f"{path.name}.old{number}"))


def check_state_fits(model: CausalLM, state: dict[str, Any], source: Path) -> None:
    """Raise a clear error, before any work, when a checkpoint's weights do not fit
    ``model`` (other parameter names or shapes): name the first few that differ."""
    own = model.state_dict()
    problems = [f"{key}: checkpoint {tuple(value.shape)}, model {tuple(own[key].shape)}"
                for key, value in state.items() if key in own and own[key].shape != value.shape]
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    problems += [f"{key}: not in the checkpoint" for key in missing[:3]]
    problems += [f"{key}: not in the model" for key in unexpected[:3]]
    if problems:
        raise ValueError(f"the checkpoint {source} does not fit the model built from the "
                         f"settings ({'; '.join(problems[:4])}); resume with the settings the "
                         "run was started with (its config.yaml)")


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back until the block ends: an update is never cut in half, so
    the checkpoint written on Ctrl-C is a whole step. The held-back Ctrl-C then goes to the
    handler that was there before: Python's (which raises ``KeyboardInterrupt``), a user's
    own, or none where SIGINT was ignored (``cmd &`` in a script: a non-interactive shell
    starts background jobs with SIGINT ignored).
    Outside the main thread (where signals cannot be handled) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if not received:
        return
    if callable(previous):  # Python's own handler raises KeyboardInterrupt; a user's runs
        previous(signal.SIGINT, None)
    elif previous is not signal.SIG_IGN:  # SIG_DFL, or a handler not set from Python
        raise KeyboardInterrupt
    # SIG_IGN (a background job started by a non-interactive shell): it stays ignored
