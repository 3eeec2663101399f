"""Tree rollouts in TRL's ``GRPOTrainer`` through its ``rollout_func`` hook.

TRL declined a tree trainer in its core and points to ``rollout_func`` (trl#4294). TRL 1.16
calls ``rollout_func(prompts, trainer)`` with the process's prompts, each repeated
``num_generations`` times in a row (its ``RepeatSampler``), and expects one completion per
entry: ``prompt_ids``, ``completion_ids`` and ``logprobs``, optionally ``env_mask`` (1 = model
token, 0 = environment token, TRL's tool mask); other keys are handed to the reward functions.
It normalises rewards over each block of ``num_generations`` rows. :class:`TreeRolloutFunc`
grows one treeroll tree per distinct prompt and returns that tree's ``G`` leaves as the block
(:mod:`treeroll.adapters.groups` says how a tree is made exactly ``G``), token in / token out:
each row is the tree's exact token path, the environment's tokens masked, the logprobs those
of the sampling distribution at TRL's ``temperature``.

Rewards: pass :func:`env_reward` as the reward function (the environment's reward of the row);
or :func:`tree_credit` to train on treeroll's estimator's credit (``advantage.*``, computed on
the whole tree) instead: TRL then subtracts the group mean again (a no-op for a credit of mean
zero) and, unless ``scale_rewards="none"``, divides by the group's std.

Usage::

    policy = load_policy("frozenlake-tiny")
    rollout_func = TreeRolloutFunc(TrainConfig(...), policy.turn_format(), num_generations=4)
    trainer = GRPOTrainer(model=policy.model, processing_class=policy.tokenizer,
                          reward_funcs=env_reward, rollout_func=rollout_func,
                          train_dataset=task_dataset(rollout_func, seeds), args=GRPOConfig(
                              num_generations=4, ...))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from treeroll.adapters.groups import LeafGroup, TreeGroups
from treeroll.base import Env, ProcessScorer
from treeroll.config import TrainConfig
from treeroll.formatting import TurnFormat

__all__ = ["TreeRolloutFunc", "env_reward", "task_dataset", "tree_credit"]


class TreeRolloutFunc:
    """A TRL ``rollout_func`` that samples each prompt's ``num_generations`` completions as the
    leaves of one treeroll tree (see the module docstring).

    Prompts are the tasks' first observations as :meth:`prompt_of` writes them (build the
    dataset with :func:`task_dataset`); a prompt this function did not write is an error
    naming it. ``seed`` makes the rollouts reproducible: call ``i`` of process ``p`` uses
    ``SeedSequence([seed, i, p])``. ``last_groups`` holds the last call's groups (their
    trees, for inspection or saving).
    """

    def __init__(self, config: TrainConfig, turn_format: TurnFormat, *, num_generations: int,
                 seed: int = 0, make_env: Callable[[], Env] | None = None,
                 scorer: ProcessScorer | None = None) -> None:
        self.groups = TreeGroups(config, turn_format, group_size=num_generations,
                                 make_env=make_env, scorer=scorer)
        self.num_generations = num_generations
        self.seed = seed
        self._tasks: dict[str, int] = {}
        self.last_groups: list[LeafGroup] = []

    def prompt_of(self, task_seed: int) -> str:
        """The prompt text of task ``task_seed`` (its first observation), remembered so that
        a later call maps it back to the task."""
        env = self.groups.make_env()
        text = env.reset(int(task_seed))
        self._tasks.setdefault(text, int(task_seed))
        return text

    def task_of(self, prompt: Any) -> int:
        """The task seed of a prompt written by :meth:`prompt_of` (a plain string, or a chat
        whose last message holds it)."""
        text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        if not isinstance(text, str) or text not in self._tasks:
            shown = repr(text)[:80]
            raise ValueError(f"rollout_func got the prompt {shown}, which is not a task of "
                             "this TreeRolloutFunc: build the dataset with task_dataset(...)")
        return self._tasks[text]

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        """Grow the trees for ``prompts`` (blocks of ``num_generations`` repeats) and return
        TRL's rollout dict, one row per entry of ``prompts``."""
        g = self.num_generations
        if len(prompts) % g:
            raise ValueError(f"rollout_func got {len(prompts)} prompts, not a multiple of "
                             f"num_generations={g}: TRL repeats each prompt G times in a row")
        tasks = [self.task_of(prompts[i]) for i in range(0, len(prompts), g)]
        for block, task in enumerate(tasks):
            for prompt in prompts[block * g:(block + 1) * g]:
                if self.task_of(prompt) != task:
                    raise ValueError(f"rollout_func's block {block} mixes prompts; TRL repeats "
                                     f"each prompt num_generations={g} times in a row")
        process = int(getattr(getattr(trainer, "accelerator", None), "process_index", 0))
        state = np.random.SeedSequence([self.seed, self.groups.calls, process])
        model = trainer.accelerator.unwrap_model(trainer.model)
        temperature = float(getattr(trainer.args, "temperature", 1.0))
        top_p = float(getattr(trainer.args, "top_p", 1.0))
        if top_p != 1.0:
            raise ValueError(f"GRPOConfig.top_p is {top_p}: treeroll's tree rows record the "
                             "full distribution's logprobs only with top_p = 1.0")
        self.last_groups = self.groups.grow(tasks, model, trainer.processing_class,
                                            seed=int(state.generate_state(1)[0]),
                                            temperature=temperature)
        return rollout_dict(self.last_groups)


def rollout_dict(groups: Sequence[LeafGroup]) -> dict[str, Any]:
    """TRL's rollout dict for ``groups``, rows in group order: the token fields, ``env_mask``,
    and the extra columns :func:`env_reward` and :func:`tree_credit` read
    (``tree_reward``, ``tree_credit``), plus ``tree_node_path`` (the row's node ids) and
    ``tree_top_up`` (1 for a top-up chain)."""
    rows = [(group, t, credit) for group in groups
            for t, credit in zip(group.trajectories, group.scalar_credit(), strict=True)]
    return {
        "prompt_ids": [list(t.prompt_ids) for _, t, _ in rows],
        "completion_ids": [list(t.response_ids) for _, t, _ in rows],
        "logprobs": [list(t.response_logprobs) for _, t, _ in rows],
        "env_mask": [list(t.response_mask) for _, t, _ in rows],
        "tree_reward": [float(t.reward) for _, t, _ in rows],
        "tree_credit": [float(c) for _, _, c in rows],
        "tree_node_path": [list(t.node_path) for _, t, _ in rows],
        "tree_top_up": [int(leaf.info.get("top_up", False))
                        for group in groups for leaf in group.leaves],
    }


def env_reward(completions: Sequence[Any], tree_reward: Sequence[float],
               **kwargs: Any) -> list[float]:
    """TRL reward function: each row's environment reward (summed over its turns)."""
    if len(tree_reward) != len(completions):
        raise ValueError(f"{len(tree_reward)} tree rewards for {len(completions)} completions: "
                         "is the rollout_func a TreeRolloutFunc?")
    return [float(r) for r in tree_reward]


def tree_credit(completions: Sequence[Any], tree_credit: Sequence[float],
                **kwargs: Any) -> list[float]:
    """TRL reward function: treeroll's estimator's credit of each row (see the module
    docstring for what TRL does with it)."""
    if len(tree_credit) != len(completions):
        raise ValueError(f"{len(tree_credit)} tree credits for {len(completions)} completions: "
                         "is the rollout_func a TreeRolloutFunc?")
    return [float(c) for c in tree_credit]


def task_dataset(rollout_func: TreeRolloutFunc, seeds: Sequence[int] | np.ndarray) -> Any:
    """A ``datasets.Dataset`` with one row per task seed: ``prompt`` (the task's first
    observation, as ``rollout_func`` maps it back) and ``task_seed``."""
    from datasets import Dataset

    seeds = [int(s) for s in seeds]
    return Dataset.from_dict({"prompt": [rollout_func.prompt_of(s) for s in seeds],
                              "task_seed": seeds})
