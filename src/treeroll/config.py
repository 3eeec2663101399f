"""Configuration: one dataclass per component, YAML files with command-line overrides.

Each component receives only its own config. ``load_config`` reads a YAML file into these
dataclasses; an unknown key is an error that names it and lists the valid keys.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from treeroll.backends.local import ModelConfig
from treeroll.rollout import RolloutConfig
from treeroll.strategies import PATR, Chain, RandomTree, TreeGRPO
from treeroll.training.loss import LossConfig

__all__ = [
    "AdvantageConfig",
    "EnvConfig",
    "EvalConfig",
    "OptimConfig",
    "PolicyConfig",
    "ScorerConfig",
    "StrategyConfig",
    "TrainConfig",
    "config_to_dict",
    "load_config",
]


@dataclass
class EnvConfig:
    """Which environment the tasks come from."""

    name: str = "frozenlake_rllm"
    """``frozenlake_rllm`` (PATR's benchmark), ``frozenlake_ragen``, ``swe``, ``gym:<env id>``,
    or ``package.module:factory`` (a zero-argument callable returning an Env)."""
    size_min: int | None = None
    """FrozenLake: smallest map side (None = the convention's)."""
    size_max: int | None = None
    """FrozenLake: largest map side (None = the convention's)."""
    slippery: bool | None = None
    """FrozenLake: slippery dynamics (None = the convention's)."""
    max_turns: int | None = None
    """Cap on turns per episode (None = the convention's)."""
    train_tasks: int = 10_000
    """Task seeds in the training pool (rLLM: 10,000)."""
    task_seed: int = 0
    """Seed of the generator that draws the training pool's task seeds."""


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
    warm_start_steps: int = 60
    """From-scratch builds only: a supervised *format* warm start (the SFT loop on the
    environment's expert at skill 0: well-formed replies, uniformly random actions; it
    teaches the answer format, not a policy). 0 disables it. For a policy, run
    ``treeroll sft`` and pass its folder as ``init``."""
    warm_start_lr: float = 3e-3
    """Learning rate of the warm start."""
    warm_start_batch: int = 16
    """Episodes per warm-start step."""

    def __post_init__(self) -> None:
        if self.warm_start_steps < 0 or self.warm_start_batch < 1 or not self.warm_start_lr > 0:
            raise ValueError("policy.warm_start_steps must be >= 0, policy.warm_start_batch "
                             ">= 1 and policy.warm_start_lr > 0")


@dataclass
class StrategyConfig:
    """Which rollout strategy builds each task's tree, and every strategy's settings."""

    name: str = "chain"
    """``chain``, ``tree_grpo``, ``patr``, ``random_tree``, or ``package.module:object``."""
    chain: Chain = field(default_factory=Chain)
    tree_grpo: TreeGRPO = field(default_factory=TreeGRPO)
    patr: PATR = field(default_factory=PATR)
    random_tree: RandomTree = field(default_factory=RandomTree)


@dataclass
class ScorerConfig:
    """The process scorer PATR uses (ignored by strategies that do not score)."""

    name: str | None = None
    """e.g. ``frozenlake_progress``, ``degeneracy``, ``blend``; None = no scorer."""
    blend_a: str = "frozenlake_progress"
    """``blend``: first scorer."""
    blend_b: str = "degeneracy"
    """``blend``: second scorer."""
    blend_lambda: float = 0.7
    """``blend``: weight of the first scorer."""
    judge_model_path: str | None = None
    """``judge``: a local model directory (``save_pretrained``) for the judge; None = the
    judge needs a backend passed to ``make_scorer`` by the caller."""


@dataclass
class AdvantageConfig:
    """Credit assignment over each task's group of leaves. ``treeroll.plugins.make_estimator``
    passes each option below to the estimator if it takes it; an option the estimator does not
    take must keep its default (else an error names it)."""

    name: str = "grpo"
    """``grpo``, ``dr_grpo``, ``rloo``, ``tree`` or ``package.module:function``."""
    std: str = "population"
    """``grpo``, ``tree``: divide by the ``population`` std (ddof=0, the default) or the
    ``sample`` std (ddof=1, unbiased: verl's and TRL's, hence Tree-GRPO's code's)."""
    singleton: str = "zero"
    """``grpo``, ``dr_grpo``, ``tree``: a group of one gets advantage ``zero`` (default: a
    tree that never branches is exactly chain GRPO) or, ``verl``, its raw reward (verl's
    mean 0 / std 1)."""
    eps: float = 1e-6
    """``grpo``, ``tree``: added to the std before dividing."""

    def __post_init__(self) -> None:
        if self.std not in ("population", "sample"):
            raise ValueError(f"advantage.std must be 'population' or 'sample', got {self.std!r}")
        if self.singleton not in ("zero", "verl"):
            raise ValueError(f"advantage.singleton must be 'zero' or 'verl', got "
                             f"{self.singleton!r}")
        if self.eps < 0:
            raise ValueError(f"advantage.eps must be >= 0, got {self.eps}")


@dataclass
class OptimConfig:
    """The RL update."""

    steps: int = 60
    """Training steps (each: roll out, advantages, update)."""
    tasks_per_step: int = 8
    """Tasks (trees) per step."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    ppo_epochs: int = 1
    """Passes over each step's leaves."""
    minibatches: int = 1
    """Optimiser steps per epoch: the step's task groups are split into this many
    minibatches of whole groups (at most one per group)."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    loss: LossConfig = field(default_factory=LossConfig)
    drop_zero_variance: bool = False
    """Skip groups whose rewards are all equal (DAPO-style dynamic sampling, without refill)."""
    packed: bool = True
    """Tree-packed update: every unique token of a tree forwarded once (falls back, with a
    warning, to one sequence per leaf when the model does not support it)."""


@dataclass
class EvalConfig:
    """Held-out evaluation: task seeds never used in training."""

    tasks: int = 256
    """Held-out tasks at the start and end of training."""
    every: int = 0
    """Also evaluate every this many steps on ``tasks_during`` tasks (0 = only start and end)."""
    tasks_during: int = 64
    """Held-out tasks for evaluations during training."""
    temperature: float = 0.0
    """Sampling temperature of the evaluation (0 = greedy)."""
    seed: int = 42
    """Seed of the held-out task generator (rLLM's test set uses 42)."""


@dataclass
class TrainConfig:
    """Everything ``treeroll train`` needs."""

    name: str = "frozenlake"
    """Run name: the run folder is ``<runs_dir>/<name>``."""
    runs_dir: str = "runs"
    """Where run folders live."""
    seed: int = 0
    """Seed of everything random in the run."""
    resume: bool = False
    """Continue the run folder's last checkpoint instead of starting over."""
    checkpoint_every: int = 10
    """Steps between checkpoints (one is also written at the end and on Ctrl-C)."""
    save_trees_every: int = 10
    """Steps between saved example trees (JSON) in the run folder."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


T = TypeVar("T")


def _build(cls: type[T], data: Any, where: str) -> T:
    """Make ``cls`` from a dict, recursively; unknown keys are errors naming the valid ones."""
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"unknown config key {where + '.' if where else ''}{key}; valid keys "
                             f"there: {', '.join(sorted(fields))}")
        hint = hints[key]
        path = f"{where}.{key}" if where else key
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, path)  # type: ignore[arg-type]
        else:
            kwargs[key] = _check_scalar(hint, value, path)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where or 'config'}: {err}") from None


def _check_scalar(hint: Any, value: Any, path: str) -> Any:
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {path}: expected a list, got {value!r}")
        element = typing.get_args(hint)[0]
        return tuple(_check_scalar(element, v, f"{path}[{i}]") for i, v in enumerate(value))
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
    return _build(cls, data or {}, "")


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain dict (for YAML / JSON) of a config dataclass."""
    return dataclasses.asdict(config)
