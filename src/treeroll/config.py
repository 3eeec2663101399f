"""Configuration: one dataclass per component, YAML files with command-line overrides.

Each component receives only its own config. ``load_config`` reads a YAML file into these
dataclasses; an unknown key is an error that names it and lists the valid keys. The checks
across fields and plug-in names are :func:`treeroll.config_checks.check_config`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from treeroll.backends import BackendConfig
from treeroll.checks import checked, field_hints, literal_check
from treeroll.credit import AdvantageConfig
from treeroll.credit.objectives import LossConfig
from treeroll.engine import AllocatorConfig, RolloutConfig
from treeroll.envs import EnvConfig
from treeroll.policies import policy_defaults
from treeroll.policies.lora import LoraSettings
from treeroll.policies.model import ModelConfig
from treeroll.scorers import ScorerConfig
from treeroll.strategies import StrategyConfig

__all__ = [
    "HELD_OUT_RESERVED",
    "EvalConfig",
    "OptimConfig",
    "PolicyConfig",
    "TrainConfig",
    "WandbConfig",
    "as_current",
    "config_to_dict",
    "load_config",
    "merged_config",
    "with_policy_defaults",
]


@dataclass
class PolicyConfig:
    """The policy a run starts from: a shipped base, a policy folder, or a from-scratch build."""

    init: str | None = "frozenlake-tiny"
    """A shipped policy's name (``frozenlake-tiny``: FrozenLake, made by ``treeroll sft``),
    or a local folder written by ``save_pretrained`` / ``treeroll sft`` (model + tokenizer);
    None builds a small model from ``model`` with a word-level tokenizer of the
    environment's texts. Nothing is ever downloaded."""
    view: str | None = None
    """Observation view (``plain`` or ``cell_coordinates``, see treeroll.views); None = the
    policy folder's own (``plain`` for a from-scratch build or a folder without one)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """From-scratch builds only (``init: null``): the model's shape."""
    warm_start_steps: int = checked(60, ge=0)
    """From-scratch builds only: a supervised *format* warm start (the SFT loop on the
    environment's expert at skill 0: well-formed replies, uniformly random actions; it
    teaches the answer format, not a policy). 0 disables it. For a policy, run
    ``treeroll sft`` and pass its folder as ``init``."""
    warm_start_lr: float = checked(3e-3, gt=0)
    """Learning rate of the warm start."""
    system_in_user: bool = False
    """Fold the system prompt into the first user turn, for a chat template that rejects or
    drops a system message (Gemma's, Phi-3's); treeroll refuses such a template without it."""
    warm_start_batch: int = checked(16, ge=1)
    """Episodes per warm-start step."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """``treeroll sft`` only: train a LoRA adapter over ``init`` (``rank`` > 0) and write the
    adapter alone as the policy folder (``treeroll.policies.lora``)."""


@dataclass
class OptimConfig:
    """The RL update."""

    steps: int = checked(60, ge=1)
    """Training steps (each: roll out, advantages, update)."""
    tasks_per_step: int = checked(8, ge=1)
    """Tasks (trees) per step."""
    lr: float = checked(1e-3, gt=0)
    """AdamW learning rate."""
    weight_decay: float = checked(0.0, ge=0)
    """AdamW weight decay."""
    ppo_epochs: int = checked(1, ge=1)
    """Passes over each step's leaves."""
    minibatches: int = checked(1, ge=1)
    """Optimiser steps per epoch: the step's task groups are split into this many
    minibatches of whole groups (at most one per group)."""
    max_grad_norm: float = checked(1.0, gt=0)
    """Gradient clipping."""
    loss: LossConfig = field(default_factory=LossConfig)
    drop_zero_variance: bool = False
    """Skip groups whose rewards are all equal (DAPO-style dynamic sampling, without refill)."""
    packed: bool = True
    """Tree-packed update: every unique token of a tree forwarded once (falls back, with a
    warning, to one sequence per leaf when the model does not support it)."""
    behaviour_lag: int = checked(0, ge=0)
    """Sample each step's rollout with the weights of this many updates earlier (SAO's
    asynchronous sampler, made deterministic: ``treeroll.training.behaviour``); 0 = the
    current weights."""
    turn_order: str = checked("joint", choices=("joint", "reverse"))
    """``joint``: each minibatch is one optimiser step over all its turns. ``reverse``
    (RTPO's turn-level updates, as treeroll reads them): each minibatch becomes one optimiser
    step per turn depth, the deepest depth first (absolute depth: a short leaf's last turn
    waits for its depth), each on the model tokens of that depth only (later steps see the
    weights the earlier ones left). Each step normalises over its own tokens (``seq_mean``:
    a mean per turn), so a minibatch moves the weights about once per depth."""


@dataclass
class WandbConfig:
    """Weights & Biases logging beside TensorBoard (``treeroll.training.wandb_log``): the
    same scalars as ``metrics.jsonl``; off unless ``project`` is set (needs ``pip install
    'treeroll[wandb]'``)."""

    project: str | None = None
    """W&B project to log to; None = no W&B logging."""
    entity: str | None = None
    """W&B entity (team or user); None = your default."""
    mode: str = checked("online", choices=("online", "offline"))
    """``offline`` writes the run under ``<run folder>/wandb`` only (``wandb sync`` it
    later); ``online`` also streams it to the server."""


HELD_OUT_RESERVED = 4096
"""The held-out pool is the first this many seeds of its generator (skipping training seeds);
evaluations take a prefix of it, and the validation pool never draws from it."""


@dataclass
class EvalConfig:
    """Evaluation on task seeds never used in training: the held-out pool (reported figures)
    or the validation pool (choosing settings), disjoint from each other and from training."""

    tasks: int = checked(256, ge=1, le=HELD_OUT_RESERVED)
    """Evaluation tasks at the start and end of training."""
    every: int = checked(0, ge=0)
    """Also evaluate every this many steps on ``tasks_during`` tasks (0 = only start and end)."""
    tasks_during: int = checked(64, ge=1, le=HELD_OUT_RESERVED)
    """The pool's first tasks evaluated during training (train reads its ends on them too)."""
    temperature: float = checked(0.0, ge=0)
    """Sampling temperature of the evaluation (0 = greedy)."""
    seed: int = checked(42, ge=0)
    """Seed of the held-out task generator (rLLM's test set uses 42)."""
    pool: str = checked("held_out", choices=("held_out", "validation"))
    """Which tasks evaluations use: ``held_out`` for figures that are reported, ``validation``
    for runs that choose a setting (a learning rate, a penalty, a step count), so that the
    held-out tasks never influence a choice."""
    validation_seed: int = checked(7, ge=0)
    """Seed of the validation task generator; its seeds skip the training pool and the first
    ``HELD_OUT_RESERVED`` held-out seeds, so the three pools never share a task."""


@dataclass
class TrainConfig:
    """Everything ``treeroll train`` needs."""

    name: str = "frozenlake"
    """Run name: the run folder is ``<runs_dir>/<name>``."""
    runs_dir: str = "runs"
    """Where run folders live."""
    seed: int = checked(0, ge=0)
    """Seed of everything random in the run."""
    resume: bool = False
    """Continue the run folder's last checkpoint instead of starting over (exactly: the
    metrics after the checkpoint are recomputed). A finished run needs ``extend``."""
    extend: bool = False
    """Continue a finished run to a larger ``optim.steps`` (implies ``resume``)."""
    force: bool = False
    """With ``resume``: continue although settings differ from the run's ``config.yaml``
    (the differences are shown; the old file is kept as ``config.yaml.old<N>``)."""
    checkpoint_every: int = checked(10, ge=1)
    """Steps between checkpoints (one is also written at the end and on Ctrl-C)."""
    save_trees_every: int = checked(10, ge=0)
    """Steps between saved example trees (JSON) in the run folder."""
    threads: int = checked(0, ge=0)
    """torch CPU threads (0 = torch's default)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def _build(cls: type[T], data: Any, where: str) -> T:
    """Make ``cls`` from a dict, recursively; every unknown key (naming the valid ones) and
    every value of the wrong type is collected and reported in one error."""
    problems: list[str] = []
    built = _collect(cls, data, where, problems)
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else
                         f"{len(problems)} problems in the config:\n  " + "\n  ".join(problems))
    return built


def _collect(cls: type[T], data: Any, where: str, problems: list[str]) -> T:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        problems.append(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
        return cls()
    hints = field_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for key, value in data.items():
        if key not in fields:
            problems.append(f"unknown config key {where + '.' if where else ''}{key}; valid "
                            f"keys there: {', '.join(sorted(fields))}")
            continue
        hint = hints.get(key)
        path = f"{where}.{key}" if where else key
        if hint is None:  # a hint that does not resolve (field_hints): the value as written
            kwargs[key] = value
            continue
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _collect(hint, value, path, problems)  # type: ignore[arg-type]
            continue
        try:
            kwargs[key] = _check_scalar(hint, value, path)
        except ValueError as err:
            problems.append(str(err))
    if len(problems) > before:
        return cls()
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        problems.append(f"{where or 'config'}: {err}")
        return cls()


def _check_scalar(hint: Any, value: Any, path: str) -> Any:
    if typing.get_origin(hint) is dict:  # a user plug-in's block: values kept as YAML text
        if not isinstance(value, dict):
            raise ValueError(f"config key {path}: expected a mapping, got {value!r}")
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {path}: expected a list, got {value!r}")
        element = typing.get_args(hint)[0]
        return tuple(_check_scalar(element, v, f"{path}[{i}]") for i, v in enumerate(value))
    literal = literal_check(hint)  # the rule validate() applies, with its message
    if literal is not None:
        problem = literal.problem(value)
        if problem:
            raise ValueError(f"config key {path}: {problem}")
        return value
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    for option in options:
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option in (str, bool) and isinstance(value, option):
            return value
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise ValueError(f"config key {path}: expected {names}, got {value!r}")


def load_config(path: str | Path | None, cls: type[T] = TrainConfig) -> T:  # type: ignore[assignment]
    """Read a YAML config into ``cls`` (defaults for missing keys)."""
    if path is None:
        return cls()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist (see configs/ for examples)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from None
    if not data:
        raise ValueError(f"config file {path} is empty: it would run every default; leave "
                         "--config out to run the defaults, or write the settings you mean")
    return _build(cls, data, "")


def _merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay``'s keys on top of ``base``'s, recursively."""
    out = dict(base)
    for key, value in overlay.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merged(base[key], value) if both else value
    return out


def as_current(cls: type, saved: dict[str, Any]) -> dict[str, Any]:
    """Settings a run folder saved (its ``config.yaml``), read as this version of ``cls``
    would write them: blocks added since get their defaults, so that comparing them with a
    config of today shows only real differences. A file that no longer reads is returned as
    it is (the comparison then names what differs)."""
    try:
        return config_to_dict(_build(cls, saved, ""))
    except ValueError:
        return saved


def merged_config(base: T, overlay: dict[str, Any]) -> T:
    """``base`` with a config mapping (a YAML file's) on top, recursively; its keys and
    values are checked as a config file's are."""
    return _build(type(base), _merged(config_to_dict(base), overlay), "")


def config_to_dict(config: DataclassInstance) -> dict[str, Any]:
    """A plain dict (for YAML / JSON) of a config dataclass."""
    return dataclasses.asdict(config)


def with_policy_defaults(config: T, spec: str | None, prefix: tuple[str, ...] = ()) -> T:
    """``config`` (a config dataclass) with the defaults of policy ``spec``
    (:func:`policy_defaults`) under ``prefix`` (e.g. ``("train",)`` for ``treeroll
    rollout``'s settings) merged in; keys the config does not have (a section only another
    command has) are left out. The command line and a config file go on top of this."""
    defaults = policy_defaults(spec)
    if not defaults:
        return config
    for key in reversed(prefix):
        defaults = {key: defaults}
    known = _known(type(config), defaults)
    return merged_config(config, known) if known else config


def _known(cls: Any, mapping: dict[str, Any]) -> dict[str, Any]:
    """The part of ``mapping`` whose keys are fields of the dataclass ``cls`` (recursively)."""
    hints = field_hints(cls)
    out: dict[str, Any] = {}
    for item in dataclasses.fields(cls):
        if item.name not in mapping:
            continue
        value, kind = mapping[item.name], hints.get(item.name)
        if isinstance(value, dict) and dataclasses.is_dataclass(kind):
            inner = _known(kind, value)
            if inner:
                out[item.name] = inner
        elif not isinstance(value, dict):
            out[item.name] = value
    return out
