"""Progress for people and for logs: plain lines when the console is not a terminal, the
evaluation's progress, and TensorBoard scalars that survive a resume without duplicates."""

from __future__ import annotations

import io
import itertools
import json
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from treeroll.cli.reporting import PlainReporter, RichReporter, make_reporter
from treeroll.config import EvalConfig
from treeroll.engine import RolloutConfig
from treeroll.envs import make_frozenlake
from treeroll.training.evaluation import evaluate
from treeroll.training.tensorboard import ScalarLog

from .conftest import ScriptedBackend


class FakeClock:
    """A clock the test moves by hand (no real sleeping)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _reporter(min_interval: float = 5.0) -> tuple[PlainReporter, io.StringIO, FakeClock]:
    out, clock = io.StringIO(), FakeClock()
    return PlainReporter(out, min_interval=min_interval, clock=clock), out, clock


def test_plain_reporter_lines_show_the_figures_present() -> None:
    reporter, out, clock = _reporter()
    reporter.phase("training with tree_grpo", 240)
    clock.now = 1.0
    reporter.advance(2, {"loss": 0.5})
    clock.now = 41.0
    reporter.advance(12, {"success": 0.52, "reward": 0.52, "tokens": 31402, "saved": 0.74,
                          "loss": -0.012, "final": True, "note": "not a figure"})
    lines = out.getvalue().splitlines()
    assert lines[0] == "training with tree_grpo"
    assert lines[1] == "train  step 2/240  loss 0.500  elapsed 0:00:01"
    # 10 steps in 40 s since the first line: 228 steps to go at 0.25 steps/s is 912 s.
    assert lines[2] == ("train  step 12/240  success 0.52  reward 0.52  tokens 31,402  "
                        "saved 74%  loss -0.012  elapsed 0:00:41  eta 0:15:12")


def test_plain_reporter_is_rate_limited_but_prints_first_last_and_regularly() -> None:
    reporter, out, clock = _reporter(min_interval=5.0)
    reporter.phase("sft on expert data", 100)
    printed_at = []
    for done in range(1, 101):
        clock.now = float(done)  # one unit a second
        before = len(out.getvalue().splitlines())
        reporter.advance(done, {"loss": 1.0 / done})
        if len(out.getvalue().splitlines()) > before:
            printed_at.append(done)
    assert printed_at[0] == 1 and printed_at[-1] == 100  # the first and the last unit
    gaps = [later - earlier for earlier, later in itertools.pairwise(printed_at)]
    assert all(gap <= 5 for gap in gaps)  # a line at least every min_interval of calls
    assert all(gap >= 5 for gap in gaps[:-1])  # and not more often (but for the last unit)
    assert len(printed_at) < 30
    assert out.getvalue().splitlines()[-1].startswith("sft  step 100/100  loss 0.010")


def test_plain_reporter_phase_without_total_and_continued_phase() -> None:
    reporter, out, clock = _reporter()
    reporter.phase("training with chain", 10)
    clock.now = 30.0
    reporter.advance(3, {})
    reporter.phase("evaluating step 3 on 16 tasks")
    reporter.advance(7, {"success": 0.25})
    clock.now = 40.0
    reporter.phase("training with chain", 10)  # the same phase again: its clock continues
    reporter.advance(4, {})
    lines = out.getvalue().splitlines()
    assert lines[3] == "eval  task 7  success 0.25  elapsed 0:00:00"
    assert lines[-1].startswith("train  step 4/10  elapsed 0:00:40")


def test_make_reporter_picks_plain_lines_for_a_non_terminal_console() -> None:
    log = io.StringIO()
    with make_reporter(Console(file=log)) as reporter:
        assert isinstance(reporter, PlainReporter)
        reporter.phase("evaluating 4 held-out tasks", 4)
        reporter.advance(4, {"success": 0.5})
    assert log.getvalue().splitlines()[-1].startswith("eval  task 4/4  success 0.50")
    with make_reporter(Console(file=io.StringIO(), force_terminal=True)) as reporter:
        assert isinstance(reporter, RichReporter)


class RecordingReporter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def phase(self, text: str, total: int | None = None) -> None:
        self.calls.append(("phase", text, total))

    def advance(self, done: int, info: dict[str, Any]) -> None:
        self.calls.append(("advance", done, info))


def test_evaluate_advances_by_finished_tasks_to_the_total(byte_format) -> None:
    reporter = RecordingReporter()
    seeds = [1, 2, 3, 4, 5]
    result = evaluate(ScriptedBackend(["```Right```", "```Down```"], choose_by_seed=True),
                      byte_format, lambda: make_frozenlake("rllm", size_min=4, size_max=5),
                      seeds, EvalConfig(tasks=5), RolloutConfig(max_depth=6),
                      reporter=reporter)
    assert all(kind == "advance" for kind, _, _ in reporter.calls)
    dones = [done for _, done, _ in reporter.calls]
    assert dones == sorted(dones) and dones[-1] == len(seeds)
    assert len(dones) > 1 and all(done < len(seeds) for done in dones[:-1])
    assert reporter.calls[-1][2] == {"success": result.success_rate}


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_scalar_log_writes_flattened_numbers_that_read_back(tmp_path: Path) -> None:
    with ScalarLog(tmp_path) as scalars:
        scalars.record(0, {"step": 0, "eval": {"success_rate": 0.5, "ci95_low": 0.25}})
        scalars.record(1, {"step": 1, "success_rate": 0.75, "tokens": {"saved_fraction": 0.5},
                           "final": True, "strategy": "patr", "lengths": [1, 2], "kl": None})
    assert _scalars(tmp_path / "tensorboard") == {
        "eval/success_rate": [(0, 0.5)], "eval/ci95_low": [(0, 0.25)],
        "success_rate": [(1, 0.75)], "tokens/saved_fraction": [(1, 0.5)]}


def _older(log_dir: Path) -> None:
    """Date the event files one second back: a real resume starts at least a second after the
    run it continues, so its event file's name (which starts with that time) sorts after
    theirs; in a test both may share a second."""
    prefix = "events.out.tfevents."
    for path in log_dir.glob(prefix + "*"):
        stamp, tail = path.name[len(prefix):].split(".", 1)
        path.rename(path.with_name(f"{prefix}{int(stamp) - 1:010d}.{tail}"))


@pytest.mark.parametrize("resumed", [True, False])
def test_resumed_scalar_log_drops_the_steps_after_its_checkpoint(tmp_path: Path,
                                                                  resumed: bool) -> None:
    with ScalarLog(tmp_path) as scalars:  # crashed after step 5; its checkpoint is step 3
        for step in range(1, 6):
            scalars.record(step, {"loss": float(step)})
    _older(tmp_path / "tensorboard")
    with ScalarLog(tmp_path, resume_step=3 if resumed else None) as scalars:
        for step in range(4, 7):
            scalars.record(step, {"loss": 10.0 + step})
    loss = _scalars(tmp_path / "tensorboard")["loss"]
    if resumed:
        assert loss == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0), (6, 16.0)]
    else:  # without resume_step both attempts' steps 4 and 5 show
        assert [step for step, _ in loss] == [1, 2, 3, 4, 5, 4, 5, 6]


class PromptScriptedBackend(ScriptedBackend):
    """Replies chosen by the prompt alone: a task's episode does not depend on its batch."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies, choose_by_seed=True)

    def generate(self, requests: Any, params: Any) -> Any:
        """The scripted reply of each request's prompt (its seed replaced by the prompt's)."""
        return super().generate([replace(request, seed=zlib.crc32(str(request.prompt_ids).encode()))
                                 for request in requests], params)


def test_an_evaluation_read_on_its_first_tasks_equals_evaluating_those_tasks_alone(
        byte_format) -> None:
    """The start and the end of a run are read on the in-between evaluations' tasks too:
    where a task's episode does not depend on the tasks beside it (greedy; here replies
    chosen by the prompt), that reading is the evaluation of those tasks alone."""
    seeds = list(range(10, 22))

    def run(count: int) -> Any:
        return evaluate(PromptScriptedBackend(["```Right```", "```Down```", "Up?"]), byte_format,
                        lambda: make_frozenlake("rllm", size_min=3, size_max=5),
                        seeds[:count], EvalConfig(tasks=count), RolloutConfig(max_depth=6))

    whole, alone = run(12), run(5)
    first = whole.first(5)
    assert (first.as_dict(), first.successes) == (alone.as_dict(), alone.successes)
    assert len(first.trees) == 5
    # Not trivially equal: the twelve tasks' figures differ from the first five's.
    assert (whole.success_rate, whole.format_ok) != (alone.success_rate, alone.format_ok)
    assert whole.first(12) is whole
    with pytest.raises(ValueError, match="1 to 12"):
        whole.first(13)


@pytest.mark.parametrize(("every", "tasks_during"), [(1, 2), (1, 4), (1, 6), (0, 2)])
def test_a_run_evaluating_during_training_on_fewer_tasks_reads_its_ends_on_them_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int, tasks_during: int) -> None:
    """The start's and the end's ``eval_during`` are those evaluations read on their first
    ``tasks_during`` tasks; none where the ends have no more tasks, or nothing runs during."""
    from treeroll.config import load_config
    from treeroll.training import trainer
    from treeroll.training.evaluation import EvalResult

    made: list[EvalResult] = []

    def spy(*args: Any, **kwargs: Any) -> EvalResult:
        made.append(evaluate(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(trainer, "evaluate", spy)
    config = load_config("configs/tiny.yaml")
    config.runs_dir, config.threads, config.name = str(tmp_path), 1, "curve"
    config.optim.steps = 2
    config.eval = replace(config.eval, tasks=4, every=every, tasks_during=tasks_during)
    summary = trainer.train(config)
    records = [json.loads(line)
               for line in (tmp_path / "curve" / "metrics.jsonl").read_text().splitlines()]
    start, final = records[0], records[-1]
    assert start["step"] == 0 and final["final"]
    during = [r["eval"]["tasks"] for r in records if "leaves" in r and "eval" in r]
    assert during == ([tasks_during] if every else [])  # step 1 (step 2's is the final one)
    assert [result.tasks for result in made] == [4, *during, 4]
    for record, end, result in ((start, "start", made[0]), (final, "final", made[-1])):
        assert record["eval"] == summary[f"{end}_eval"] == result.as_dict()
        if every and tasks_during < 4:
            expected = result.first(tasks_during).as_dict()
            assert record["eval_during"] == summary[f"{end}_eval_during"] == expected
            assert expected["tasks"] == tasks_during
        else:
            assert "eval_during" not in record and f"{end}_eval_during" not in summary
