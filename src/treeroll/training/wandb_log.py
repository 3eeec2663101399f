"""Weights & Biases scalars of a run, beside its TensorBoard files (``--wandb.project``).

The same numbers as ``metrics.jsonl`` and TensorBoard (:func:`treeroll.training.tensorboard.
flatten_scalars`: nested keys joined with ``/``), logged at the run's step, with the resolved
config as the W&B run's config. The W&B run's files live in ``<run folder>/wandb``
(``mode: offline`` keeps them there; ``wandb sync`` uploads them later).

Resuming: the W&B run id is kept in ``<run folder>/wandb.json`` with the last step whose
record reached W&B, so a resumed run continues the same W&B run (``resume="allow"``) and
does not log again the steps an interrupted attempt had logged after its last checkpoint (a
resumed run recomputes them identically; W&B would reject them, steps must increase).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from treeroll.config import WandbConfig
from treeroll.training.tensorboard import flatten_scalars

__all__ = ["WandbLog"]

_STATE = "wandb.json"


class WandbLog:
    """One run's W&B logger: ``record(step, record)``, ``flush()``, ``close()``.

    ``name`` is the W&B run name (the run folder's name); ``config`` the resolved settings;
    ``resume``: the run folder is being resumed (continue its W&B run).
    """

    def __init__(self, run_dir: str | Path, settings: WandbConfig, *, name: str,
                 config: Mapping[str, Any], resume: bool) -> None:
        import wandb

        self.run_dir = Path(run_dir)
        state_file = self.run_dir / _STATE
        state = json.loads(state_file.read_text()) if resume and state_file.is_file() else {}
        self.run_id = state.get("id") or uuid.uuid4().hex[:12]
        self.logged = int(state.get("logged", -1))
        """Highest step whose step record reached W&B (-1: none)."""
        self.skip_through = self.logged
        """Step records up to this step were logged by an earlier attempt."""
        self.run = wandb.init(project=settings.project, entity=settings.entity, name=name,
                              id=self.run_id, resume="allow", dir=str(self.run_dir),
                              mode="offline" if settings.mode == "offline" else "online",
                              config=dict(config), reinit="create_new")
        self._save()

    def _save(self) -> None:
        tmp = self.run_dir / (_STATE + ".tmp")
        tmp.write_text(json.dumps({"id": self.run_id, "logged": self.logged}))
        os.replace(tmp, self.run_dir / _STATE)

    def record(self, step: int, record: Mapping[str, Any]) -> None:
        """Log every number of ``record`` at ``step``, unless it is a training step's record
        an earlier attempt already logged (see the module docstring)."""
        is_step_record = "step" in record
        if is_step_record and step <= self.skip_through:
            return
        scalars = dict(flatten_scalars(record))
        if scalars:
            self.run.log(scalars, step=step)
        if is_step_record and step > self.logged:
            self.logged = step
            self._save()

    def flush(self) -> None:
        """Nothing to do: W&B writes in the background."""

    def close(self) -> None:
        """Finish the W&B run (W&B's service may finish writing its files a moment later)."""
        self.run.finish()
