"""Tree rollouts in rLLM: a workflow returning one episode with the tree's trajectories.

rLLM (rllm-org/rllm, read at commit 9beb6e0, version 0.3.0.pre) runs ``Workflow.run(task,
uid) -> Episode``; an episode holds trajectories of steps, and the trainer groups
trajectories by ``f"{episode.task_id}:{trajectory.name}"`` (``task_id`` is the part of the
episode id before ``:``). A tree fits natively: :class:`TreeWorkflow` (made on first access,
importing rLLM only then) grows one treeroll tree per task on rLLM's own rollout engine (its
token-in / token-out ``get_token_output_from_token_input``, through :class:`RLLMEngineBackend`)
and returns one episode whose trajectories are the tree's ``group_size`` leaves, all named
``treeroll``: one group. Run it with one rollout per task (the tree already holds the group).

Each leaf is a trajectory of one step per turn: the step's ``prompt_ids`` are the exact
context before the turn (each step's prompt extends the previous step's prompt and response,
so rLLM's verl transform merges them into one row, observation tokens masked), its
``response_ids`` and ``logprobs`` the turn's sampled action, its ``reward`` the turn's
environment reward; with ``precomputed_advantage=True`` its ``advantage`` is treeroll's
credit of the leaf (a float), for ``rllm.algorithm.use_precomputed_advantage`` on rLLM's
tinker backend (at 9beb6e0 its verl backend turns the float into a per-token list and then
calls ``float`` on it: a TypeError; leave it off there and rLLM's estimator decides). The
trajectory's ``reward`` is the leaf's. Sampling uses the engine's own temperature and top-p.

rLLM is not on the package registries (``pip install rllm`` finds nothing), so the tests here
check :func:`episode_fields` (rLLM's field names, as plain data) and drive the workflow's
backend with a fake engine; the real classes are used when rLLM is importable.
"""

from __future__ import annotations

import asyncio
from typing import Any

from treeroll.adapters.async_backend import AsyncTokenBackend
from treeroll.adapters.tree_groups import LeafGroup, TreeGroups, seed_for
from treeroll.base import GenerationRequest, SamplingParams
from treeroll.tree import context_ids, path_to

__all__ = ["RLLMEngineBackend", "engine_sampling", "episode_fields",
           "tree_episode"]  # and TreeWorkflow (made on first access)

TRAJECTORY_NAME = "treeroll"
"""The name of every trajectory of a tree's episode (one rLLM group per task)."""


class RLLMEngineBackend(AsyncTokenBackend):
    """A treeroll backend over an rLLM ``RolloutEngine`` that supports token-in / token-out
    (``supports_token_in_token_out``): one ``get_token_output_from_token_input`` per
    request, treeroll's sampling options as its keyword arguments."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        if not getattr(engine, "supports_token_in_token_out", False):
            raise ValueError(f"{type(engine).__name__} does not support token-in/token-out "
                             "generation, which tree rollouts need (every branch continues "
                             "an exact token prefix)")
        super().__init__(loop)
        self.engine = engine

    async def send(self, request: GenerationRequest, params: SamplingParams) -> Any:
        """One ``get_token_output_from_token_input`` call."""
        return await self.engine.get_token_output_from_token_input(
            token_input=list(request.prompt_ids), **self.options(request, params))


def episode_fields(group: LeafGroup, uid: str, task: Any = None, *,
                   advantage: bool = False) -> dict[str, Any]:
    """rLLM's ``Episode`` of ``group`` as plain data (rLLM's field names; ``model_output``
    holds ``ModelOutput``'s token fields): one trajectory per leaf, one step per turn.
    ``advantage``: set each step's ``advantage`` to treeroll's credit of its leaf (else
    None, and rLLM's own estimator decides)."""
    if ":" not in uid:
        raise ValueError(f"uid {uid!r}: rLLM episode ids are 'task_id:rollout_idx'")
    trajectories: list[dict[str, Any]] = []
    rows = zip(group.leaves, group.trajectories, group.scalar_credit(), strict=True)
    for index, (leaf, trajectory, credit) in enumerate(rows):
        steps = []
        path = path_to(leaf)
        for node in path[1:]:
            assert node.parent is not None
            prompt = context_ids(node.parent)
            steps.append({
                "prompt_ids": prompt, "response_ids": list(node.action_ids),
                "logprobs": list(node.action_logprobs), "reward": float(node.reward),
                "done": node is leaf, "advantage": float(credit) if advantage else None,
                "observation": node.parent.observation_text,
                "model_response": node.action_text,
                "model_output": {"prompt_ids": prompt, "completion_ids": list(node.action_ids),
                                 "logprobs": list(node.action_logprobs),
                                 "prompt_length": len(prompt),
                                 "completion_length": len(node.action_ids),
                                 "finish_reason": node.finish_reason or None},
                "metadata": {"tree_node": node.id},
            })
        trajectories.append({
            "name": TRAJECTORY_NAME, "task": task, "steps": steps,
            "reward": float(trajectory.reward),
            "metadata": {"tree_node_path": list(trajectory.node_path),
                         "top_up": group.is_top_up(index)},
        })
    return {"id": uid, "task": task, "trajectories": trajectories,
            "is_correct": any(t.success for t in group.trajectories),
            "metrics": {"tree_leaves": len({leaf.id for leaf in group.leaves}),  # repeats once
                        "tree_nodes": len(group.tree.nodes),
                        "tree_top_up": group.topped_up},
            "metadata": {"tree_id": group.tree.tree_id, "task_seed": group.tree.task_seed}}


def tree_episode(group: LeafGroup, uid: str, task: Any = None, *,
                 advantage: bool = False) -> Any:
    """rLLM's real ``Episode`` of ``group`` (needs rLLM importable; see :func:`episode_fields`
    for the layout)."""
    from rllm.engine.rollout.rollout_engine import ModelOutput
    from rllm.types import Episode, Step, Trajectory

    fields = episode_fields(group, uid, task, advantage=advantage)
    trajectories = []
    for t in fields["trajectories"]:
        steps = [Step(**{**s, "model_output": ModelOutput(**s["model_output"])})
                 for s in t["steps"]]
        trajectories.append(Trajectory(**{**t, "steps": steps}))
    return Episode(**{**fields, "trajectories": trajectories})


def engine_sampling(engine: Any) -> tuple[float | None, float | None]:
    """The rollout engine's own temperature and top-p (its validation ones while it
    validates), so that the tree samples the distribution the trainer recomputes; None where
    the engine has none."""
    params = (getattr(engine, "val_sampling_params", None) if getattr(engine, "is_validation",
                                                                      False)
              else getattr(engine, "train_sampling_params", None)) or {}
    temperature, top_p = params.get("temperature"), params.get("top_p")
    return (None if temperature is None else float(temperature),
            None if top_p is None else float(top_p))


def _make_workflow() -> type:
    try:
        from rllm.workflows.workflow import Workflow
    except ImportError as err:
        raise ImportError("treeroll.adapters.rllm.TreeWorkflow needs rLLM, which is not on "
                          "the package registries: install it from its repository "
                          "(rllm-org/rllm)") from err

    class TreeWorkflow(Workflow):
        """An rLLM workflow whose episode is one treeroll tree (module docstring):
        ``treeroll_config`` a treeroll YAML (None: the defaults), ``group_size`` the leaves
        per task, ``precomputed_advantage`` sets the steps' ``advantage`` to treeroll's
        credit; the task dict gives the environment's seed as ``task_seed``."""

        def __init__(self, rollout_engine: Any, executor: Any, *,
                     treeroll_config: str | None = None, group_size: int = 8,
                     precomputed_advantage: bool = False, **kwargs: Any) -> None:
            super().__init__(rollout_engine, executor, **kwargs)
            self.groups = TreeGroups.from_file(treeroll_config, rollout_engine.tokenizer,
                                               group_size=group_size)
            self.precomputed_advantage = precomputed_advantage

        async def run(self, task: dict[str, Any], uid: str, **kwargs: Any) -> Any:
            """Grow the task's tree on the rollout engine; one episode of its leaves."""
            self.reset(task=task, uid=uid)
            if "task_seed" not in task:
                raise ValueError(f"episode {uid!r}: the task has no task_seed (its keys: "
                                 f"{sorted(task)}); treeroll needs the environment's seed")
            seed = int(task["task_seed"])
            backend = RLLMEngineBackend(self.rollout_engine, asyncio.get_running_loop())
            temperature, top_p = engine_sampling(self.rollout_engine)
            groups = await asyncio.to_thread(self.groups.grow_on, backend, [seed],
                                             seed=seed_for(uid, seed),
                                             temperature=temperature, top_p=top_p)
            return tree_episode(groups[0], uid, task, advantage=self.precomputed_advantage)

    TreeWorkflow.__module__ = __name__
    TreeWorkflow.__qualname__ = "TreeWorkflow"
    return TreeWorkflow


def __getattr__(name: str) -> Any:
    """``TreeWorkflow`` is made on first access (importing rLLM only then)."""
    if name == "TreeWorkflow":
        made = _make_workflow()
        globals()["TreeWorkflow"] = made
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
