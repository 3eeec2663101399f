"""``treeroll sft``: supervised fine-tuning on multi-turn trajectories, in a run folder.

The loss is the mean cross-entropy over the model's tokens only (each reply and its
end-of-turn id; :mod:`treeroll.training.sft_data` builds the masks through the RL turn
format). A run lives in ``<runs_dir>/<name>/``: ``config.yaml``, ``metrics.jsonl`` (one JSON
object per logged step, evaluations included), ``checkpoints/last.pt`` (model, optimiser,
schedule, data position, every RNG; written atomically), and ``policy/``, the fine-tuned
policy as a folder any treeroll command loads (``--policy.init runs/<name>/policy``).
``export`` also writes that folder elsewhere (the shipped base is made this way).
``resume=True`` continues the last checkpoint exactly; Ctrl-C writes one first.

:func:`sft_steps` is the loop itself, also used by the RL trainer's format warm start.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treeroll.config import EnvConfig, EvalConfig, PolicyConfig
from treeroll.rollout import RolloutConfig
from treeroll.training.sft_data import SFTExample, batches_by_tokens

__all__ = ["SFTConfig", "SFTDataConfig", "SFTOptimConfig", "SFTState", "copy_policy_folder",
           "lr_factor", "sft_loss", "sft_steps"]


@dataclass
class SFTDataConfig:
    """Where the demonstrations come from."""

    source: str = "expert"
    """``expert``: episodes of the environment's expert, generated on the fly from training
    task seeds; ``jsonl``: the file ``path`` (TRL ``messages`` or ``input_ids`` +
    ``loss_mask`` lines)."""
    path: str | None = None
    """The JSONL file (``source: jsonl``)."""
    on_bad_line: str = "error"
    """A malformed JSONL line: ``error`` stops before training (naming the line), ``skip``
    leaves it out with a warning."""
    skill: float = 1.0
    """``expert``: probability that each expert decision is the expert's own (else random)."""
    mask_noise: bool = True
    """``expert``: keep the noise's replies in the context but out of the loss."""
    explain: bool = False
    """``expert``: the expert states what it reads before each action (FrozenLake: its
    cell and the goal's, ``P@2,3 G@4,5``); the policy learns to do the same."""
    episodes_per_step: int = 16
    """Examples per optimiser step."""
    max_tokens: int = 4096
    """Longest example kept (longer ones are cut at this many tokens)."""

    def check(self) -> None:
        """Cross-field checks, run once command-line overrides are applied."""
        if self.source == "jsonl" and not self.path:
            raise ValueError("data.source is 'jsonl': set data.path to the JSONL file")
        if self.source == "expert" and self.path:
            raise ValueError(f"data.path is set ({self.path}) but data.source is 'expert'; "
                             "set data.source: jsonl to train on the file")

    def __post_init__(self) -> None:
        if self.source not in ("expert", "jsonl"):
            raise ValueError(f"data.source must be 'expert' or 'jsonl', got {self.source!r}")
        if self.on_bad_line not in ("error", "skip"):
            raise ValueError(f"data.on_bad_line must be 'error' or 'skip', got "
                             f"{self.on_bad_line!r}")
        if not 0.0 <= self.skill <= 1.0:
            raise ValueError(f"data.skill must be in [0, 1], got {self.skill}")
        if self.episodes_per_step < 1:
            raise ValueError(f"data.episodes_per_step must be >= 1, got "
                             f"{self.episodes_per_step}")
        if self.max_tokens < 2:
            raise ValueError(f"data.max_tokens must be >= 2, got {self.max_tokens}")


@dataclass
class SFTOptimConfig:
    """The optimiser and its schedule."""

    steps: int = 500
    """Optimiser steps."""
    lr: float = 2e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 50
    """Linear warm-up from 0 to ``lr``."""
    schedule: str = "cosine"
    """After warm-up: ``cosine`` (to ``min_lr_ratio * lr`` at the last step) or ``constant``."""
    min_lr_ratio: float = 0.0
    """Learning rate at the end of a cosine schedule, as a fraction of ``lr``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    micro_batch_tokens: int = 4096
    """Padded tokens per forward pass (a step's examples are split by length; the gradient
    is that of the whole step)."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"optim.steps must be >= 0, got {self.steps}")
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"optim.schedule must be 'cosine' or 'constant', got "
                             f"{self.schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not self.max_grad_norm > 0 or self.weight_decay < 0:
            raise ValueError(f"optim.max_grad_norm must be > 0 and optim.weight_decay >= 0, got "
                             f"{self.max_grad_norm} and {self.weight_decay}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"optim.micro_batch_tokens must be >= 1, got "
                             f"{self.micro_batch_tokens}")


@dataclass
class SFTConfig:
    """Everything ``treeroll sft`` needs."""

    name: str = "sft"
    """Run name: the run folder is ``<runs_dir>/<name>``."""
    runs_dir: str = "runs"
    """Where run folders live."""
    seed: int = 0
    """Seed of everything random in the run."""
    resume: bool = False
    """Continue the run folder's last checkpoint instead of starting over."""
    checkpoint_every: int = 50
    """Steps between checkpoints (one is also written at the end and on Ctrl-C)."""
    log_every: int = 10
    """Steps between loss records in metrics.jsonl."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    export: str | None = None
    """Also write the final policy folder here (e.g. the package's shipped base)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(tasks=256, every=100,
                                                                tasks_during=128))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How the held-out evaluations sample (their temperature is ``eval.temperature``); use
    the RL run's settings so that the figures compare (FrozenLake: 12 tokens a turn)."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0 or self.log_every < 1 or self.threads < 0:
            raise ValueError(f"checkpoint_every must be >= 0, log_every >= 1 and threads >= 0, "
                             f"got {self.checkpoint_every}, {self.log_every} and {self.threads}")


def lr_factor(step: int, config: SFTOptimConfig) -> float:
    """Multiplier of ``config.lr`` for optimiser step ``step`` (0-based): linear warm-up over
    steps ``0 .. warmup_steps - 1`` ending just below the peak, the peak at ``warmup_steps``,
    then constant or cosine reaching ``min_lr_ratio`` exactly at the last step."""
    if step < config.warmup_steps:
        return (step + 1) / (config.warmup_steps + 1)
    if config.schedule == "constant":
        return 1.0
    span = max(config.steps - 1 - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi
                                                                                 * progress))


def sft_loss(model: Any, examples: list[SFTExample], pad_token_id: int = 0,
             normaliser: int | None = None) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy of ``model`` on the masked tokens of ``examples`` (one padded
    forward pass), divided by ``normaliser`` (default: the number of masked tokens); returns
    the loss and the number of masked tokens. Right padding needs no attention mask."""
    longest = max(len(e.ids) for e in examples)
    input_ids = torch.full((len(examples), longest), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)  # [batch, tokens]
    for row, example in enumerate(examples):
        ids = torch.tensor(example.ids)
        input_ids[row, : len(ids)] = ids
        labels[row, : len(ids)] = torch.where(torch.tensor(example.loss_mask) == 1, ids, -100)
    logits = model(input_ids=input_ids).logits[:, :-1]  # [batch, tokens - 1, vocab]
    targets = labels[:, 1:]
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                              targets.reshape(-1), reduction="sum")
    count = int((targets != -100).sum())
    return total / max(normaliser or count, 1), count


@dataclass
class SFTState:
    """What :func:`sft_steps` needs to continue exactly: the steps done and the data seed.

    Step ``k`` draws its examples from ``numpy.random.default_rng([seed, k])``, so a run
    stopped anywhere (even inside a step) and resumed at ``step`` draws the same data as an
    uninterrupted one."""

    step: int
    seed: int

    def rng(self, step: int) -> np.random.Generator:
        """The generator step ``step`` draws its examples from."""
        return np.random.default_rng([self.seed, step])


def sft_steps(model: Any, optimizer: Any, batches: Callable[[np.random.Generator],
                                                            list[SFTExample]],
              config: SFTOptimConfig, state: SFTState, *, pad_token_id: int = 0,
              until: int | None = None) -> Iterator[dict[str, float]]:
    """Optimiser steps from ``state.step`` up to ``until`` (default ``config.steps``), one
    record per step (``step``, ``loss``, ``lr``, ``trained_tokens``, ``examples``,
    ``grad_norm``, ``seconds``). ``batches(rng)`` draws one step's examples; ``state.step``
    counts the steps whose update was applied, so a checkpoint taken at any time resumes
    exactly."""
    for step in range(state.step, config.steps if until is None else until):
        model.train()
        tick = time.perf_counter()
        examples = batches(state.rng(step))
        for group in optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(step, config)
        count = sum(e.trained_tokens for e in examples)  # the step's mean is over all of them
        optimizer.zero_grad()
        total = 0.0
        for micro in batches_by_tokens(examples, config.micro_batch_tokens):
            loss, _ = sft_loss(model, micro, pad_token_id, normaliser=count)
            loss.backward()
            total += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                         config.max_grad_norm))
        optimizer.step()
        state.step = step + 1
        record = {"step": step + 1, "loss": total, "lr": optimizer.param_groups[0]["lr"],
                  "trained_tokens": count, "examples": len(examples), "grad_norm": grad_norm,
                  "seconds": time.perf_counter() - tick}
        model.eval()  # the caller may evaluate between two steps
        yield record


def copy_policy_folder(source: Path, target: Path) -> None:
    """Replace ``target`` with a copy of the policy folder ``source`` (copied beside it
    first, then swapped in, so a failed copy leaves the old folder)."""
    staging = target.with_name(target.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(source, staging)
    if target.exists():
        shutil.rmtree(target)
    staging.replace(target)
