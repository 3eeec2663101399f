"""Tree rollouts in TRL's ``GRPOTrainer`` through its ``rollout_func`` hook.

TRL declined a tree trainer in its core and points to ``rollout_func`` (trl#4294). TRL 1.16
calls ``rollout_func(prompts, trainer)`` with the process's prompts, each repeated
``num_generations`` times in a row (its ``RepeatSampler``), and expects one completion per
entry: ``prompt_ids``, ``completion_ids`` and ``logprobs``, optionally ``env_mask`` (1 = model
token, 0 = environment token, TRL's tool mask); other keys are handed to the reward functions.
It normalises rewards over each block of ``num_generations`` rows. :class:`TreeRolloutFunc`
grows one treeroll tree per distinct prompt and returns that tree's ``G`` leaves as the block
(:mod:`treeroll.adapters.tree_groups` says how a tree is made exactly ``G``), token in / token out:
each row is the tree's exact token path, the environment's tokens masked, the logprobs those
of the sampling distribution at TRL's ``temperature``.

Rewards: pass :func:`env_reward` as the reward function (the environment's reward of the row);
or :func:`tree_credit` to train on treeroll's estimator's credit (``advantage.*``, computed on
the whole tree) instead: TRL then subtracts the group mean again (a no-op for a credit of mean
zero; with ``EarlyForks(on_end="repeat")`` the credit is computed over the distinct leaves, so
its mean over the rows is not zero and this re-centring changes it) and, unless
``scale_rewards="none"``, divides by the group's std.

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
from dataclasses import replace
from typing import Any

import numpy as np

from treeroll.adapters.tree_groups import LeafGroup, TreeGroups
from treeroll.base import Env, ProcessScorer
from treeroll.config import TrainConfig
from treeroll.formatting import TurnFormat
from treeroll.strategies import EarlyForks

__all__ = ["TreeRolloutFunc", "env_reward", "task_dataset", "tree_credit"]


class TreeRolloutFunc:
    """A TRL ``rollout_func`` that samples each prompt's ``num_generations`` completions as the
    leaves of one treeroll tree (see the module docstring).

    Prompts are the tasks' first observations as :meth:`prompt_of` writes them (build the
    dataset with :func:`task_dataset`); a prompt this function did not write is an error
    naming it. ``seed`` makes the rollouts reproducible (each call's seed comes from it, the
    trainer's global step, the process and the mode: :meth:`_seed`). ``last_groups`` holds
    the last call's groups (their trees, for inspection or saving). ``early_forks``: grow
    each tree as :class:`~treeroll.strategies.EarlyForks` (exactly ``num_generations``
    rows, sharing in the early turns; with ``on_end="repeat"`` a leaf may fill several)
    instead of ``config.strategy``; evaluation groups of another size fork one chain.
    """

    def __init__(self, config: TrainConfig, turn_format: TurnFormat, *, num_generations: int,
                 seed: int = 0, make_env: Callable[[], Env] | None = None,
                 scorer: ProcessScorer | None = None, early_forks: EarlyForks | None = None
                 ) -> None:
        self.config, self.turn_format = config, turn_format
        self.make_env, self.scorer = make_env, scorer
        self.early_forks = early_forks
        self.groups = TreeGroups(config, turn_format, group_size=num_generations,
                                 make_env=make_env, scorer=scorer, shape=early_forks)
        self._by_size = {num_generations: self.groups}
        self.num_generations = num_generations
        self.seed = seed
        self._tasks: dict[str, int] = {}
        self._env = self.groups.make_env()  # reset per task by prompt_of
        self._last_step: tuple[int, str] | None = None
        self._calls_at_step = 0
        self.last_groups: list[LeafGroup] = []

    def prompt_of(self, task_seed: int) -> str:
        """The prompt text of task ``task_seed`` (its first observation), remembered so that
        a later call maps it back to the task; another seed with the same prompt is an error
        (TRL hands over prompts only, so the two could not be told apart)."""
        text = self._env.reset(int(task_seed))
        known = self._tasks.setdefault(text, int(task_seed))
        if known != int(task_seed):
            raise ValueError(f"task seeds {known} and {task_seed} give the same prompt; "
                             "TRL passes only the prompt to rollout_func, so keep one of them")
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

    def _groups(self, size: int) -> TreeGroups:
        if size not in self._by_size:  # TRL's num_generations_eval
            shape = None if self.early_forks is None else replace(self.early_forks,
                                                                  group_size=size, chains=1)
            self._by_size[size] = TreeGroups(self.config, self.turn_format, group_size=size,
                                             make_env=self.make_env, scorer=self.scorer,
                                             shape=shape)
        return self._by_size[size]

    def _seed(self, trainer: Any, mode: str) -> int:
        """``SeedSequence([seed, global step, process, train/eval, call at this step])``:
        the same on a resumed run as on the uninterrupted one."""
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0))
        self._calls_at_step = self._calls_at_step + 1 if self._last_step == (step, mode) else 0
        self._last_step = (step, mode)
        process = int(getattr(getattr(trainer, "accelerator", None), "process_index", 0))
        state = np.random.SeedSequence([self.seed, step, process, mode == "eval",
                                        self._calls_at_step])
        return int(state.generate_state(1)[0])

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        """Grow the trees for ``prompts`` (blocks of ``num_generations`` repeats) and return
        TRL's rollout dict, one row per entry of ``prompts``."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        mode = "train" if model.training else "eval"
        g = self.num_generations if mode == "train" else int(
            getattr(trainer, "num_generations_eval", None) or self.num_generations)
        _check_sampling(trainer.args)
        if len(prompts) % g:
            raise ValueError(f"rollout_func got {len(prompts)} prompts, not a multiple of "
                             f"{'num_generations' if mode == 'train' else 'num_generations_eval'}"
                             f"={g}: make per_device_train_batch_size x steps_per_generation "
                             "a multiple of it (TRL repeats each prompt G times in a row, and "
                             "a tree's group must not be split across processes)")
        tasks = [self.task_of(prompts[i]) for i in range(0, len(prompts), g)]
        for block, task in enumerate(tasks):
            for prompt in prompts[block * g:(block + 1) * g]:
                if self.task_of(prompt) != task:
                    raise ValueError(f"rollout_func's block {block} mixes prompts; TRL repeats "
                                     f"each prompt num_generations={g} times in a row")
        self.last_groups = self._groups(g).grow(
            tasks, model, trainer.processing_class, seed=self._seed(trainer, mode),
            temperature=float(getattr(trainer.args, "temperature", 1.0)), top_p=1.0)
        return rollout_dict(self.last_groups)


def _check_sampling(args: Any) -> None:
    """Refuse TRL sampling settings a tree row's logprobs could not honour: the update
    recomputes softmax(logits / temperature) over the whole vocabulary."""
    allowed = {"top_p": (1.0,), "top_k": (0, -1, None), "min_p": (None, 0.0),
               "repetition_penalty": (1.0,)}
    found = [f"{name}={getattr(args, name)!r} (use {ok[0]!r})" for name, ok in allowed.items()
             if getattr(args, name, ok[0]) not in ok]
    if found:
        raise ValueError(f"GRPOConfig {'; '.join(found)}: treeroll's tree rows sample and "
                         "record the full distribution at TRL's temperature only")


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
        "tree_top_up": [int(group.is_top_up(i)) for group in groups
                        for i in range(len(group.leaves))],
    }


def _column(name: str, values: Sequence[float], completions: Sequence[Any]) -> list[float]:
    if len(values) != len(completions):
        raise ValueError(f"{len(values)} values of {name} for {len(completions)} completions: "
                         "is the rollout_func a TreeRolloutFunc?")
    return [float(v) for v in values]


def env_reward(completions: Sequence[Any], tree_reward: Sequence[float],
               **kwargs: Any) -> list[float]:
    """TRL reward function: each row's environment reward (summed over its turns)."""
    return _column("tree_reward", tree_reward, completions)


def tree_credit(completions: Sequence[Any], tree_credit: Sequence[float],
                **kwargs: Any) -> list[float]:
    """TRL reward function: treeroll's estimator's credit of each row (see the module
    docstring for what TRL does with it)."""
    return _column("tree_credit", tree_credit, completions)


def task_dataset(rollout_func: TreeRolloutFunc, seeds: Sequence[int] | np.ndarray) -> Any:
    """A ``datasets.Dataset`` with one row per task seed: ``prompt`` (the task's first
    observation, as ``rollout_func`` maps it back) and ``task_seed``."""
    from datasets import Dataset

    seeds = [int(s) for s in seeds]
    return Dataset.from_dict({"prompt": [rollout_func.prompt_of(s) for s in seeds],
                              "task_seed": seeds})
