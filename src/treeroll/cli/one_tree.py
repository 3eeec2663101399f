"""One tree from a run's settings, for ``treeroll rollout``, ``eval`` and the Ray command: the
run's config and policy loaded, one tree built, and the tree described in the terminal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import yaml
from rich.markup import escape
from rich.tree import Tree as RichTree

from treeroll.assemble import assemble, scorer_name_for
from treeroll.backends import BACKENDS, make_backend
from treeroll.base import Env, GenerationBackend
from treeroll.config import TrainConfig, load_config
from treeroll.engine.batch import rollout
from treeroll.envs import env_spec, make_env_factory
from treeroll.formatting import TurnFormat
from treeroll.policies import Policy, build_policy, check_context_length
from treeroll.policies.lora import LoraSettings
from treeroll.strategies import make_strategy
from treeroll.training.evaluation import task_pools
from treeroll.training.runfolder import read_checkpoint
from treeroll.tree import Node, RolloutTree

__all__ = ["apply_shortcuts", "build_one_tree", "describe_tree", "is_sft_run",
           "load_run_config", "load_run_policy", "starting_policy"]


def apply_shortcuts(config: TrainConfig, *, env: str | None, strategy: str | None,
                    scorer: str | None) -> TrainConfig:
    """``--env/--strategy/--scorer`` of ``treeroll rollout``, with the defaults each implies:
    PATR scores with the environment's own scorer (``treeroll.assemble.scorer_name_for``), and
    the environment's own run defaults apply (:attr:`~treeroll.envs.EnvSpec.run_defaults`: the
    SWE env's scripted agent writes long commands, 4096-token turns, and PATR scores every
    K = 13 turns there, as in the paper)."""
    config = replace(config)
    if env is not None:
        config.env = replace(config.env, name=env)
    if strategy is not None:
        config.strategy = replace(config.strategy, name=strategy)
    if scorer is not None:
        config.scorer = replace(config.scorer, name=scorer)
    else:
        config.scorer = replace(config.scorer, name=scorer_name_for(
            config.scorer.name, make_strategy(config.strategy), config.env.name))
    spec = env_spec(config.env.name)
    if spec is not None and spec.run_defaults is not None:
        config = spec.run_defaults(config)
    return config


def load_run_config(run_dir: Path) -> TrainConfig:
    """The resolved settings a run folder was trained with (its ``config.yaml``). An SFT run
    (``treeroll sft``) is read as the settings of a training that starts from its fine-tuned
    policy, ``<run>/policy``, in its environment."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no config.yaml in {run_dir}: is it a run folder written by "
                                "`treeroll train` or `treeroll sft`?")
    if is_sft_run(run_dir):
        from treeroll.training.sft import SFTConfig

        sft: SFTConfig = load_config(path, SFTConfig)
        # the exported policy is loaded merged: no adapter is trained on top of it
        return TrainConfig(env=sft.env, eval=sft.eval, rollout=sft.rollout, seed=sft.seed,
                           policy=replace(sft.policy, init=str(run_dir / "policy"),
                                          lora=LoraSettings()))
    config: TrainConfig = load_config(path)
    return config


def is_sft_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds an SFT run: its ``config.yaml`` has SFT's ``data`` block."""
    path = run_dir / "config.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return isinstance(data, dict) and "data" in data


def load_run_policy(run_dir: Path) -> tuple[TrainConfig, GenerationBackend, TurnFormat,
                                             Callable[[], Env]]:
    """The config, a backend on the last checkpoint's weights, the turn format and the env."""
    checkpoint = run_dir / "checkpoints" / "last.pt"
    if is_sft_run(run_dir):  # its policy folder holds the fine-tuned weights
        config = load_run_config(run_dir)
        policy = starting_policy(config)
        return config, make_backend(config.backend, policy), policy.turn_format(), \
            make_env_factory(config.env)
    if not checkpoint.exists():
        raise FileNotFoundError(f"no checkpoint at {checkpoint}: is {run_dir} a run folder "
                                "written by `treeroll train`?")
    config = load_run_config(run_dir)
    make_env = make_env_factory(config.env)
    policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                          make_env, run_dir / "policy",
                          system_in_user=config.policy.system_in_user)
    check_context_length(policy, make_env, config.rollout.max_turn_tokens,
                         task_pools(config.env, config.eval)[1])
    policy.model.load_state_dict(read_checkpoint(checkpoint)["model"])
    policy.model.eval()
    return config, make_backend(config.backend, policy), policy.turn_format(), make_env


def starting_policy(config: TrainConfig) -> Policy:
    """The policy ``treeroll train`` would start from (before any RL step): ``policy.init``
    loaded, or a from-scratch build after its format warm start."""
    make_env = make_env_factory(config.env)
    policy = build_policy(config.policy.init, config.policy.model, config.policy.view,
                          make_env, system_in_user=config.policy.system_in_user)
    train_seeds, held_out = task_pools(config.env, config.eval)
    check_context_length(policy, make_env, config.rollout.max_turn_tokens, held_out)
    if config.policy.warm_start_steps and not config.policy.init:
        from treeroll.training.sft_run import format_warm_start

        torch.manual_seed(config.seed)
        format_warm_start(policy, make_env, train_seeds, config.policy,
                          np.random.default_rng(config.seed))
    policy.model.eval()
    return policy


def _policy_for(config: TrainConfig, run_dir: Path | None
                ) -> tuple[GenerationBackend, TurnFormat, Callable[[], Env]]:
    make_env = make_env_factory(config.env)
    if run_dir is not None:  # the run's policy, in the environment ``config`` asks for
        _, backend, turn_format, _ = load_run_policy(run_dir)
        return backend, turn_format, make_env
    spec = env_spec(config.env.name)
    if spec is not None and spec.actor is not None:
        name = config.env.name
        if config.policy.init != TrainConfig().policy.init:
            raise ValueError(f"--policy {config.policy.init!r} is not used with --env {name}: "
                             f"rollout runs its {spec.actor} backend there (no shipped policy "
                             f"reads its tasks); leave --policy out, or roll out a run that "
                             f"was trained on its tasks with --run")
        actor = BACKENDS.get(spec.actor)
        assert actor.tokenizer is not None, f"backend {spec.actor} acts without a policy"
        backend = actor.build(replace(config.backend, name=spec.actor), None)
        return backend, TurnFormat(actor.tokenizer()), make_env
    policy = starting_policy(config)
    return make_backend(config.backend, policy), policy.turn_format(), make_env


def build_one_tree(config: TrainConfig, task_seed: int, run_dir: Path | None = None
                   ) -> RolloutTree:
    """One tree for ``task_seed`` with the configured strategy, scorer and budget; with
    ``run_dir``, sampled by that run's trained policy (``config`` still decides the rest:
    ``treeroll rollout --run`` starts it from the run's own ``config.yaml``)."""
    backend, turn_format, make_env = _policy_for(config, run_dir)
    parts = assemble(config, make_env=make_env)
    batch = rollout([task_seed], make_env, backend, turn_format, parts.strategy,
                    config=config.rollout, scorer=parts.scorer, seed=config.seed)
    tree = batch.trees[0]
    tree.meta["timing"] = batch.timing
    return tree


def _label(node: Node) -> str:
    action = node.action_text.strip().replace("\n", " ")
    if len(action) > 40:
        action = action[:37] + "..."
    parts = [f"#{node.id}"]
    if node.parent is not None:
        parts.append(f"[cyan]{action!r}[/cyan]")
        parts.append(f"r={node.reward:g}")
    parts.append(f"[magenta]{node.status}[/magenta]")
    if node.score is not None:
        parts.append(f"s={node.score:.2f}")
    if node.info.get("success"):
        parts.append("[green]success[/green]")
    if node.note:
        parts.append(f"[dim]{node.note}[/dim]")
    return " ".join(parts)


def describe_tree(tree: RolloutTree) -> RichTree:
    """A terminal rendering: one line per node, under the headline the tree's pictures carry
    (``viz.tree_headline``: the same token figures in the same words)."""
    from treeroll.viz import tree_headline

    root = RichTree(escape("\n".join(tree_headline(tree))))

    def add(node: Node, branch: RichTree) -> None:
        for child in node.children:
            add(child, branch.add(_label(child)))

    add(tree.root, root.add(_label(tree.root)))
    return root
