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

import numpy as np
import torch

from treeroll.backends.weights import model_device
from treeroll.causal_lm import CausalLM
from treeroll.checks import checked
from treeroll.config import EvalConfig, PolicyConfig
from treeroll.engine import RolloutConfig
from treeroll.envs import EnvConfig
from treeroll.heads import check_logits, head_at
from treeroll.training.sft_data import SFTExample, batches_by_tokens

__all__ = ["SFTConfig", "SFTDataConfig", "SFTOptimConfig", "SFTState", "adamw",
           "copy_policy_folder", "lr_factor", "sft_loss", "sft_steps"]


@dataclass
class SFTDataConfig:
    """Where the demonstrations come from."""

    source: str = checked("expert", choices=("expert", "jsonl"))
    """``expert``: episodes of the environment's expert, generated on the fly from training
    task seeds; ``jsonl``: the file ``path`` (TRL ``messages`` or ``input_ids`` +
    ``loss_mask`` lines)."""
    path: str | None = None
    """The JSONL file (``source: jsonl``)."""
    on_bad_line: str = checked("error", choices=("error", "skip"))
    """A malformed JSONL line: ``error`` stops before training (naming the line), ``skip``
    leaves it out with a warning."""
    skill: float = checked(1.0, ge=0, le=1)
    """``expert``: probability that each expert decision is the expert's own (else random)."""
    mask_noise: bool = True
    """``expert``: keep the noise's replies in the context but out of the loss."""
    explain: bool = False
    """``expert``: the expert states what it reads before each action (FrozenLake: its
    cell and the goal's, ``P@2,3 G@4,5``); the policy learns to do the same."""
    explain_style: str = checked("cells", choices=("cells", "words"))
    """``explain``'s form (FrozenLake): ``cells`` writes the ``cell_coordinates`` view's
    words, ``words`` a sentence for a model reading the ``plain`` view (``I am at row 3,
    column 4; the goal is at row 5, column 6.``)."""
    explain_safe_moves: bool = False
    """``expert`` with ``explain`` (FrozenLake): the explanation goes on with ``safe`` and the
    moves that do not land in a hole (``P@2,3 G@4,5 safe Up Left``), as the
    ``cell_coordinates_safe`` view's header shows them, so the policy writes the list right
    before it acts (``docs/sft_recipe/README.md``: the shipped base's recipe)."""
    episodes_per_step: int = checked(16, ge=1)
    """Examples per optimiser step."""
    max_tokens: int = checked(4096, ge=2)
    """Longest example kept (longer ones are cut at this many tokens)."""

    @property
    def expert_explain(self) -> bool | str:
        """What ``expert_reply``'s ``explain`` gets: the style, or False."""
        return self.explain_style if self.explain else False

    def problems(self) -> list[tuple[str, str]]:
        """Cross-field problems, as :func:`treeroll.checks.validate` takes them."""
        if self.source == "jsonl" and not self.path:
            return [("--data.path", "is not set; data.source is 'jsonl': set it to the JSONL "
                     "file")]
        if self.explain_safe_moves and self.source != "expert":
            return [("--data.explain-safe-moves", f"is on but data.source is "
                     f"'{self.source}'; the safe list is written by the environment's expert: "
                     "set --data.source expert, or turn it off")]
        if self.explain_safe_moves and not self.explain:
            return [("--data.explain-safe-moves", "is on but data.explain is off; the safe "
                     "moves go on the explanation line: set --data.explain true")]
        if self.source == "expert" and self.path:
            return [("--data.path", f"is set ({self.path}) but data.source is 'expert'; set "
                     "--data.source jsonl to train on the file")]
        return []


@dataclass
class SFTOptimConfig:
    """The optimiser and its schedule."""

    steps: int = checked(500, ge=0)
    """Optimiser steps."""
    lr: float = checked(2e-3, gt=0)
    """Peak AdamW learning rate."""
    warmup_steps: int = checked(50, ge=0)
    """Linear warm-up from 0 to ``lr``."""
    schedule: str = checked("cosine", choices=("cosine", "constant"))
    """After warm-up: ``cosine`` (to ``min_lr_ratio * lr`` at the last step) or ``constant``."""
    min_lr_ratio: float = checked(0.0, ge=0, le=1)
    """Learning rate at the end of a cosine schedule, as a fraction of ``lr``."""
    weight_decay: float = checked(0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = checked(1.0, gt=0)
    """Gradient clipping."""
    micro_batch_tokens: int = checked(4096, ge=1)
    """Padded tokens per forward pass (a step's examples are split by length; the gradient
    is that of the whole step)."""
    compute_dtype: str = checked("float32", choices=("float32", "bfloat16"))
    """The forward and backward's compute: ``bfloat16`` runs them under ``torch.autocast``
    (the weights, the optimiser and the loss's softmax stay float32), as the RL update's
    ``optim.loss.compute_dtype``: about 1.6x the speed on a CPU with native bfloat16."""



@dataclass
class SFTConfig:
    """Everything ``treeroll sft`` needs."""

    name: str = "sft"
    """Run name: the run folder is ``<runs_dir>/<name>``."""
    runs_dir: str = "runs"
    """Where run folders live."""
    seed: int = checked(0, ge=0)
    """Seed of everything random in the run."""
    resume: bool = False
    """Continue the run folder's last checkpoint instead of starting over."""
    checkpoint_every: int = checked(50, ge=0)
    """Steps between checkpoints (one is also written at the end and on Ctrl-C)."""
    log_every: int = checked(10, ge=1)
    """Steps between loss records in metrics.jsonl."""
    threads: int = checked(0, ge=0)
    """torch CPU threads (0 = torch's default)."""
    export: str | None = None
    """Also write the final policy folder here (e.g. the package's shipped base)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(tasks=256, every=100,
                                                                tasks_during=128))
    eval_at_start: bool = True
    """Evaluate the starting policy too (off for a model whose untrained replies run to every
    turn's cap: SmolLM2's zero-shot evaluation takes ~30 s a task here)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How the held-out evaluations sample (their temperature is ``eval.temperature``); use
    the RL run's settings so that the figures compare (FrozenLake: 16 tokens a turn)."""



def trainable_parameters(model: CausalLM) -> list[torch.nn.Parameter]:
    """``model``'s parameters that train (all but a frozen base under a LoRA adapter)."""
    return [p for p in model.parameters() if p.requires_grad]


def adamw(model: CausalLM, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters (a LoRA adapter's alone over a frozen base),
    fused (one kernel over all of them: on two CPU
    cores a step over SmolLM2-135M's parameters takes ~1.3 s fused against ~10 s with the
    default per-tensor loop; the update is the same rule)."""
    return torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=weight_decay,
                             fused=True)


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


def sft_loss(model: CausalLM, examples: list[SFTExample], pad_token_id: int = 0,
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
    targets = labels[:, 1:]
    rows, cols = (targets != -100).nonzero(as_tuple=True)  # hidden t predicts token t + 1
    device = model_device(model)
    wanted = targets[rows, cols].to(device)
    with head_at(model, rows.to(device), cols.to(device)):  # head and softmax where read
        logits = model(input_ids=input_ids.to(device)).logits
    check_logits(model, logits, len(rows))
    total = torch.nn.functional.cross_entropy(logits.float(), wanted, reduction="sum")
    count = len(rows)
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


def sft_steps(model: CausalLM, optimizer: torch.optim.Optimizer,
              batches: Callable[[np.random.Generator], list[SFTExample]],
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
            with torch.autocast(model_device(model).type, dtype=torch.bfloat16,
                                enabled=config.compute_dtype == "bfloat16"):
                loss, _ = sft_loss(model, micro, pad_token_id, normaliser=count)
            loss.backward()
            total += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable_parameters(model),
                                                         config.max_grad_norm))
        optimizer.step()
        state.step = step + 1
        record = {"step": step + 1, "loss": total, "lr": optimizer.param_groups[0]["lr"],
                  "trained_tokens": count, "examples": len(examples), "grad_norm": grad_norm,
                  "seconds": time.perf_counter() - tick}
        model.eval()  # the caller may evaluate between two steps
        yield record


def rebase_adapter(folder: Path, was: Path, now: Path) -> None:
    """An adapter folder's base, when it is a folder written relative to the adapter, made
    relative to where the adapter now goes (``now``) instead of where it was (``was``)."""
    import json
    import os

    from treeroll.policies import adapter_base

    meta_file = folder / "treeroll.json"
    if not meta_file.is_file():
        return
    meta = json.loads(meta_file.read_text())
    base = meta.get("base")
    if not isinstance(base, str):
        return
    resolved = adapter_base(was, base)
    if resolved != base:  # a folder beside the old place
        meta["base"] = os.path.relpath(Path(resolved).resolve(), now.resolve())
        meta_file.write_text(json.dumps(meta, indent=2) + "\n")


def copy_policy_folder(source: Path, target: Path) -> None:
    """Replace ``target`` with a copy of the policy folder ``source`` (copied beside it
    first, then swapped in, so a failed copy leaves the old folder); an adapter's folder base
    is rewritten relative to ``target``."""
    staging = target.with_name(target.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(source, staging)
    rebase_adapter(staging, source, target)
    if target.exists():
        shutil.rmtree(target)
    staging.replace(target)
