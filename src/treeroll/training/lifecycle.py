"""One run lifecycle for ``treeroll train`` and ``treeroll sft``.

Both commands keep only their step; what a run folder goes through is here: the folder made
or resumed (a finished run extended), the settings checked against the run's ``config.yaml``,
a new run that fails before its first step leaving no folder behind, checkpoints (weights,
optimiser, counters and every RNG, written atomically), the pace check after the second step
of a process (a step count whose run would outlast a year is refused, with both steps kept),
and what a crash or Ctrl-C leaves: the checkpoint of the last whole step and a
``summary.json`` saying where the run stopped. See :mod:`treeroll.training.runfolder` for the
folder's files.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from treeroll.checks import check_duration
from treeroll.config import as_current, config_to_dict
from treeroll.training.runfolder import RunFolder, load_checkpoint, save_checkpoint

if TYPE_CHECKING:
    from treeroll.config import TrainConfig
    from treeroll.training.sft import SFTConfig

__all__ = ["Lifecycle"]


class Lifecycle:
    """The run folder of one ``train`` or ``sft`` run and what happens to it.

    ``config`` has ``name``, ``runs_dir``, ``resume`` and ``threads``; ``resumable`` names the
    settings a resumed run may change; ``extend`` / ``steps`` continue a finished run to more
    steps; ``force`` resumes although other settings differ."""

    def __init__(self, config: TrainConfig | SFTConfig, *, resumable: tuple[str, ...],
                 extend: bool = False, steps: int | None = None, force: bool = False) -> None:
        if config.threads:
            torch.set_num_threads(config.threads)
        self.folder = RunFolder(config.runs_dir, config.name, config.resume or extend,
                                extend=extend, steps=steps)
        self.resolved = config_to_dict(config)
        self.folder.check_config(self.resolved, resumable, force=force,
                                 normalise=lambda saved: as_current(type(config), saved))
        self.existed = self.folder.path.exists()

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Building the run and its first evaluation: on a failure, a new run's folder is
        removed (a resumed or an existing one is kept)."""
        try:
            yield
        except BaseException:
            if not self.existed and not self.folder.resume:
                shutil.rmtree(self.folder.path, ignore_errors=True)
            raise

    def save(self, state: dict[str, Any], rng: np.random.Generator) -> None:
        """Checkpoint ``state`` with every RNG (atomically)."""
        save_checkpoint(self.folder.checkpoint, state, rng)

    def restore(self, rng: np.random.Generator) -> dict[str, Any]:
        """The last checkpoint's state; ``rng`` and torch's RNGs set back to it."""
        return load_checkpoint(self.folder.checkpoint, rng)

    @staticmethod
    def check_pace(steps_here: int, step: int, total: int, seconds: float) -> None:
        """After this process's second step (the first warms up), refuse a step count whose
        run would outlast a year (``--optim.steps``), naming it."""
        if steps_here == 2:
            check_duration("--optim.steps", total, total - step, seconds)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """``summary.json`` in the run folder."""
        (self.folder.path / "summary.json").write_text(json.dumps(summary, indent=2))

    @contextlib.contextmanager
    def interruptible(self, save: Callable[[], None], summary: dict[str, Any],
                      next_step: Callable[[], int],
                      catch: tuple[type[BaseException], ...] = (BaseException,)
                      ) -> Iterator[None]:
        """The steps: on an exception of ``catch`` (a crash, Ctrl-C), ``save`` (the last
        whole step's checkpoint) and a ``summary.json`` whose ``interrupted_at_step`` is
        ``next_step()``, then the exception goes on."""
        try:
            yield
        except catch:
            save()
            summary["interrupted_at_step"] = next_step()
            self.write_summary(summary)
            raise
