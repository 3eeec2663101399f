"""TensorBoard scalars of a run, in ``<run folder>/tensorboard`` (``tensorboard --logdir runs``).

The metrics file (``metrics.jsonl``) stays the record of a run; this is a view of it that
TensorBoard reads live. The training loop writes each ``metrics.jsonl`` record here too::

    from treeroll.training.tensorboard import ScalarLog

    with ScalarLog(run_dir, resume_step=start_step if resumed else None) as scalars:
        scalars.record(0, {"eval": start_eval})         # the step-0 evaluation
        for step in ...:
            record = ...                                # the step's metrics.jsonl record
            scalars.record(step, record)
        scalars.record(steps, {"eval": final_eval})     # the final evaluation

Nested dicts become ``/``-joined tags (``tokens/saved_fraction``, ``eval/success_rate``);
anything that is not a number (strings, lists, None, booleans such as ``final``) is left out,
and so is the ``step`` key itself (it is the x axis).

Resuming: pass ``resume_step``, the step of the checkpoint the run continues from. Events a
crashed or interrupted run wrote after that step (its last checkpoint) would otherwise show
twice, once from each attempt; ``SummaryWriter(purge_step=resume_step + 1)`` marks the new
event file so that TensorBoard's reader discards every event at a step after ``resume_step``
written before it (those at ``resume_step`` and earlier stay). This relies on the new event
file sorting after the old ones, which it does: its name starts with the time it was made.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from torch.utils.tensorboard import SummaryWriter

__all__ = ["ScalarLog", "ScalarSink", "flatten_scalars"]


class ScalarSink(Protocol):
    """Another logger fed the same records (W&B: :class:`treeroll.training.wandb_log.
    WandbLog`)."""

    def record(self, step: int, record: Mapping[str, Any]) -> None:
        """Log ``record`` at ``step``."""
        ...

    def flush(self) -> None:
        """Write pending records."""
        ...

    def close(self) -> None:
        """Finish."""
        ...


def flatten_scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(tag, value)`` for every number in ``record``, nested dicts joined with ``/``;
    booleans and non-numbers are skipped, and so is a top-level ``step``."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten_scalars(value, prefix=f"{tag}/")
        elif (isinstance(value, numbers.Real) and not isinstance(value, bool)
              and tag != "step"):
            yield tag, float(value)


class ScalarLog:
    """Scalars of a run written as TensorBoard event files under ``run_dir / "tensorboard"``.

    ``resume_step``: the checkpoint's step when the run resumes (events written earlier at
    later steps are discarded on reading, see the module docstring); None for a new run.
    ``flush_secs``: how often pending events reach the disk at the latest (``flush()`` and
    ``close()`` write them at once). ``mirrors`` get every record too (and are flushed and
    closed with it). Usable as a context manager, which closes it.
    """

    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None,
                 flush_secs: int = 10, mirrors: Sequence[ScalarSink] = ()) -> None:
        self.mirrors = list(mirrors)
        self.log_dir = Path(run_dir) / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step,
                                    flush_secs=flush_secs)

    def record(self, step: int, record: Mapping[str, Any]) -> None:
        """Write every number of ``record`` (flattened, see :func:`flatten_scalars`) at
        ``step``."""
        for tag, value in flatten_scalars(record):
            self.writer.add_scalar(tag, value, global_step=step)
        for mirror in self.mirrors:
            mirror.record(step, record)

    def flush(self) -> None:
        """Write pending events to disk now."""
        self.writer.flush()
        for mirror in self.mirrors:
            mirror.flush()

    def close(self) -> None:
        """Flush and close the event file (and the mirrors)."""
        self.writer.close()
        for mirror in self.mirrors:
            mirror.close()

    def __enter__(self) -> ScalarLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
