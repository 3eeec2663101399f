"""Exact resume: a run killed with SIGKILL at a random moment and resumed gives the
uninterrupted run's metrics and weights; finished runs, changed settings and models that do
not fit a checkpoint are refused with clear errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from treeroll.training.runfolder import RunFolder, check_state_fits, deferred_interrupt

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"rollout_seconds", "update_seconds", "timing"}


def _command(runs: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "treeroll.cli", "train", "--config", "configs/tiny.yaml",
            "--runs-dir", str(runs), "--name", name, "--optim.steps", "10",
            "--checkpoint-every", "3", "--threads", "1", *extra]


def _records(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_sigkill_then_resume_matches_the_uninterrupted_run(tmp_path) -> None:
    runs = tmp_path / "runs"
    subprocess.run(_command(runs, "whole"), cwd=ROOT, check=True, capture_output=True,
                   timeout=600)
    chooser = random.Random()
    kill_after = chooser.randint(3, 8)  # steps logged before the kill, then a random delay
    delay = chooser.uniform(0.0, 0.4)
    process = subprocess.Popen(_command(runs, "killed"), cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    metrics = runs / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        logged = metrics.read_text().count('"leaves"') if metrics.exists() else 0
        checkpointed = (runs / "killed" / "checkpoints" / "last.pt").exists()
        if logged >= kill_after and checkpointed:  # a checkpoint to resume from
            break
        time.sleep(0.02)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, (
        f"the run ended before the kill (after {kill_after} steps + {delay:.2f} s)")
    subprocess.run(_command(runs, "killed", "--resume"), cwd=ROOT, check=True,
                   capture_output=True, timeout=600)

    whole, killed = runs / "whole", runs / "killed"
    assert _records(killed) == _records(whole), f"kill after {kill_after} steps + {delay:.2f} s"
    weights = [torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]
               for run in (whole, killed)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    summaries = [json.loads((run / "summary.json").read_text()) for run in (whole, killed)]
    assert summaries[1]["generated_tokens"] == summaries[0]["generated_tokens"] > 0
    assert summaries[1]["cumulative"] == summaries[0]["cumulative"]


def _finished_folder(tmp_path: Path, steps: int = 5) -> Path:
    run = tmp_path / "runs" / "done"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    (run / "summary.json").write_text(json.dumps({"finished": True, "steps": steps}))
    (run / "config.yaml").write_text(yaml.safe_dump({"optim": {"steps": steps, "lr": 0.1}}))
    return run


def test_a_finished_run_refuses_resume_and_extends_only_to_more_steps(tmp_path) -> None:
    _finished_folder(tmp_path)
    runs = str(tmp_path / "runs")
    with pytest.raises(FileExistsError, match=r"finished run \(5 steps\).*--extend"):
        RunFolder(runs, "done", resume=False)
    with pytest.raises(ValueError, match=r"finished \(5 steps\).*--extend"):
        RunFolder(runs, "done", resume=True, steps=8)
    with pytest.raises(ValueError, match=r"--optim\.steps is 5, not above the 5"):
        RunFolder(runs, "done", resume=True, extend=True, steps=5)
    assert RunFolder(runs, "done", resume=True, extend=True, steps=8).finished_steps() == 5


def test_changed_settings_on_resume_are_shown_and_refused_unless_forced(tmp_path) -> None:
    run = _finished_folder(tmp_path)
    folder = RunFolder(str(tmp_path / "runs"), "done", resume=True, extend=True, steps=8)
    changed = {"optim": {"steps": 8, "lr": 0.5}}
    with pytest.raises(ValueError, match=r"optim\.lr: 0\.1 -> 0\.5.*--force"):
        folder.check_config(changed, ("optim.steps",))
    folder.check_config({"optim": {"steps": 8, "lr": 0.1}}, ("optim.steps",))  # allowed
    with pytest.warns(UserWarning, match=r"optim\.lr: 0\.1 -> 0\.5"):
        folder.check_config(changed, ("optim.steps",), force=True)
    assert yaml.safe_load((run / "config.yaml.old1").read_text())["optim"]["lr"] == 0.1


def test_a_checkpoint_that_does_not_fit_the_model_names_the_tensor() -> None:
    model = torch.nn.Linear(4, 3)
    check_state_fits(model, torch.nn.Linear(4, 3).state_dict(), Path("x.pt"))
    with pytest.raises(ValueError, match=r"weight: checkpoint \(5, 4\), model \(3, 4\)"):
        check_state_fits(model, torch.nn.Linear(4, 5).state_dict(), Path("x.pt"))


def test_ctrl_c_during_an_update_is_raised_after_it() -> None:
    finished = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt), deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the signal arrives while the block runs
            finished.append(True)
        assert finished == [True]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_held_back_where_sigint_was_ignored_stays_ignored() -> None:
    """A background job of a non-interactive shell (``cmd &`` in a script) starts with SIGINT
    ignored; a SIGINT held back during an update must not become a KeyboardInterrupt there."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_held_back_goes_to_the_users_own_handler_once() -> None:
    calls: list[int] = []
    before = signal.signal(signal.SIGINT, lambda number, frame: calls.append(number))
    try:
        with deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert calls == []  # held back during the block
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_an_update_keeps_that_steps_record_and_the_resume_is_exact(
        tmp_path, monkeypatch) -> None:
    from treeroll.config import load_config
    from treeroll.training import trainer

    config = load_config("configs/tiny.yaml")
    config.runs_dir, config.threads, config.checkpoint_every = str(tmp_path), 1, 100
    config.optim.steps = 4
    config.name = "whole"
    trainer.train(config)
    real, calls = trainer.ppo_update, []

    def interrupted_update(*args, **kwargs):  # Ctrl-C arrives during step 2's update
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "ppo_update", interrupted_update)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        config.name = "cut"
        with pytest.raises(KeyboardInterrupt):
            trainer.train(config)
    finally:
        signal.signal(signal.SIGINT, before)
    cut = tmp_path / "cut"
    assert torch.load(cut / "checkpoints" / "last.pt", weights_only=False)["step"] == 2
    assert [r["step"] for r in _records(cut) if "leaves" in r] == [1, 2]
    monkeypatch.setattr(trainer, "ppo_update", real)
    config.resume = True
    trainer.train(config)
    assert _records(cut) == _records(tmp_path / "whole")


def test_a_damaged_checkpoint_is_named_in_a_clear_error_not_an_unpickling_traceback(
        tmp_path) -> None:
    runs = tmp_path / "runs"
    base = [sys.executable, "-m", "treeroll.cli", "train", "--config", "configs/tiny.yaml",
            "--runs-dir", str(runs), "--name", "hurt", "--checkpoint-every", "1",
            "--threads", "1"]
    subprocess.run([*base, "--optim.steps", "1"], cwd=ROOT, check=True, capture_output=True)
    checkpoint = runs / "hurt" / "checkpoints" / "last.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:200])  # a copy cut short
    resumed = subprocess.run([*base, "--optim.steps", "2", "--resume", "--extend"], cwd=ROOT,
                             capture_output=True, text=True,
                             env={**os.environ, "COLUMNS": "400"})  # no wrapped path
    assert resumed.returncode == 2, resumed.stderr
    assert f"checkpoint {checkpoint} cannot be read" in resumed.stderr
    assert "Traceback" not in resumed.stderr


def test_a_step_count_that_would_take_more_than_a_year_stops_after_step_two_and_resumes(
        tmp_path) -> None:
    runs = tmp_path / "runs"
    absurd = _command(runs, "typo")
    absurd[absurd.index("--optim.steps") + 1] = "1000000000000"
    result = subprocess.run(absurd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2
    message = " ".join((result.stdout + result.stderr).split())
    assert "--optim.steps 1,000,000,000,000 is absurd" in message
    assert "more than one" in message and "steps fit in a year" in message
    run = runs / "typo"
    assert [r["step"] for r in _records(run) if "loss" in r] == [1, 2]  # both are kept
    fixed = _command(runs, "typo", "--resume")
    fixed[fixed.index("--optim.steps") + 1] = "3"
    subprocess.run(fixed, cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert [r["step"] for r in _records(run) if "loss" in r] == [1, 2, 3]
