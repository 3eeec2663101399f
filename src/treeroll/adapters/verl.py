"""Tree rollouts in verl: an agent loop fed by a per-group tree coordinator, and an advantage
estimator for treeroll's tree credit.

verl (0.9) runs one ``AgentLoopBase.run`` per sample; the trainer repeats each prompt
``rollout.n`` times under one ``uid``, and a loop talks to verl's inference server through
``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` (token ids in,
``TokenOutput(token_ids, log_probs)`` out). :class:`TreeAgentLoop` (registered as
``treeroll_tree``) turns the ``n`` loops of a group into the ``n`` leaves of one tree:

- the :class:`TreeCoordinator` of the process holds one tree per ``uid``: the group's first
  loop grows the whole tree (``n`` leaves, :mod:`treeroll.adapters.groups`) on verl's own
  server through :class:`VerlServerBackend`, the others wait for it, and each loop claims the
  next leaf. A shared turn is generated once, whatever the number of loops reading it;
- a group is never split: every loop of a ``uid`` must run in the same agent-loop worker
  (verl chunks the repeated batch evenly over ``agent.num_workers``, so keep
  ``data.train_batch_size`` a multiple of it); a group whose loops would need more leaves
  than its tree holds is an error naming the ``uid``.

Each output is the leaf's exact token path (``response_mask`` 0 on environment tokens), the
sampling logprobs verl's server returned (set ``rollout.logprobs_mode=processed_logprobs`` so
that they are the sampling distribution's, trl#4159 / verl's own note), the environment's
reward as ``reward_score``, and ``extra_fields`` with the tree id, node path and treeroll's
credit. With ``credit_as_reward=True`` the ``reward_score`` is treeroll's credit instead, and
the estimator registered as ``treeroll_precomputed`` (``algorithm.adv_estimator=
treeroll_precomputed``) uses it as the advantage of every model token of the row, since verl's
estimators see only token rewards, the mask and the ``uid``.

The environment's task comes from the dataset row: ``extra_info["task_seed"]`` (else the
row's ``index``). The loop's settings are a treeroll YAML (``treeroll_config``: the same file
``treeroll train`` reads; its optimiser settings are verl's business), passed as an extra
constructor argument in verl's ``agent_loop_config_path`` file::

    - name: treeroll_tree
      _target_: treeroll.adapters.verl.TreeAgentLoop
      treeroll_config: configs/frozenlake_rllm.yaml
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.trainer.ppo.core_algos import register_adv_est

from treeroll.adapters.async_backend import AsyncTokenBackend
from treeroll.adapters.groups import LeafGroup, TreeGroups
from treeroll.base import GenerationRequest, SamplingParams
from treeroll.config import TrainConfig, load_config
from treeroll.formatting import TurnFormat

__all__ = ["TreeAgentLoop", "TreeCoordinator", "VerlServerBackend", "agent_loop_output",
           "precomputed_advantage"]


class VerlServerBackend(AsyncTokenBackend):
    """A treeroll :class:`~treeroll.base.GenerationBackend` over verl's ``server_manager``
    (:class:`~treeroll.adapters.async_backend.AsyncTokenBackend`): each request is one
    ``server_manager.generate`` with verl's sampling parameters of the loop
    (``sampling_params``: top-k, repetition penalty, ...), treeroll's on top, and
    ``logprobs=True``."""

    def __init__(self, server_manager: Any, loop: asyncio.AbstractEventLoop,
                 sampling_params: dict[str, Any] | None = None) -> None:
        super().__init__(loop)
        self.server_manager = server_manager
        self.base_params = dict(sampling_params or {})
        self._ids = itertools.count()

    async def send(self, request: GenerationRequest, params: SamplingParams) -> Any:
        """One ``server_manager.generate`` call (verl's ``TokenOutput`` back)."""
        options = {**self.base_params, **self.options(request, params), "logprobs": True}
        return await self.server_manager.generate(f"treeroll-{next(self._ids)}",
                                                  prompt_ids=list(request.prompt_ids),
                                                  sampling_params=options)


@dataclass
class _Group:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    group: LeafGroup | None = None
    error: BaseException | None = None
    claimed: int = 0


class TreeCoordinator:
    """One tree per ``uid`` in this process: the first claim of a ``uid`` grows it, every
    claim takes the next of its ``group_size`` leaves (see the module docstring)."""

    def __init__(self, groups: TreeGroups) -> None:
        self.groups = groups
        self._by_uid: dict[str, _Group] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        """uids whose every leaf was handed out (the last 65,536): a later claim is an
        error, not a second tree (verl's uids are fresh per prompt and step)."""
        self._lock = threading.Lock()  # held for dict updates only, never across an await

    async def claim(self, uid: str, task_seed: int, backend: VerlServerBackend, *,
                    seed: int, temperature: float | None = None) -> tuple[LeafGroup, int]:
        """The tree of ``uid`` and the index of the leaf this caller gets."""
        with self._lock:
            if uid in self._finished:
                raise ValueError(f"uid {uid!r}: claim {self.groups.group_size + 1} of a group "
                                 f"of {self.groups.group_size}; rollout.n must equal the "
                                 "tree's group size")
            entry = self._by_uid.get(uid)
            first = entry is None
            if entry is None:
                entry = self._by_uid[uid] = _Group()
            index = entry.claimed
            entry.claimed += 1
        if index >= self.groups.group_size:
            raise ValueError(f"uid {uid!r}: claim {index + 1} of a group of "
                             f"{self.groups.group_size}; rollout.n must equal the tree's "
                             "group size")
        if first:
            try:
                grown = await asyncio.to_thread(self.groups.grow_on, backend, [task_seed],
                                                seed=seed, temperature=temperature)
                entry.group = grown[0]
            except BaseException as err:  # every waiting loop of the group sees it
                entry.error = err
                raise
            finally:
                entry.ready.set()
        await entry.ready.wait()
        if entry.error is not None:
            raise RuntimeError(f"uid {uid!r}: growing its tree failed") from entry.error
        assert entry.group is not None
        if index == self.groups.group_size - 1:
            with self._lock:  # every leaf handed out: forget the tree, remember the uid
                self._by_uid.pop(uid, None)
                self._finished[uid] = None
                while len(self._finished) > 65_536:
                    self._finished.popitem(last=False)
        return entry.group, index


def agent_loop_output(group: LeafGroup, index: int, *,
                      credit_as_reward: bool = False) -> AgentLoopOutput:
    """verl's ``AgentLoopOutput`` for leaf ``index`` of ``group``."""
    trajectory = group.trajectories[index]
    credit = group.scalar_credit()[index]
    return AgentLoopOutput(
        prompt_ids=list(trajectory.prompt_ids), response_ids=list(trajectory.response_ids),
        response_mask=list(trajectory.response_mask),
        response_logprobs=list(trajectory.response_logprobs),
        reward_score=float(credit if credit_as_reward else trajectory.reward),
        num_turns=trajectory.num_turns, metrics=AgentLoopMetrics(),
        extra_fields={"tree_uid": f"{group.tree.task_seed}:{group.tree.tree_id}",
                      "tree_node_path": list(trajectory.node_path),
                      "tree_credit": float(credit), "tree_reward": float(trajectory.reward),
                      "tree_top_up": int(bool(group.leaves[index].info.get("top_up")))})


_COORDINATORS: dict[tuple[str, int], TreeCoordinator] = {}
"""One coordinator per (settings file, group size) in a process: verl builds a new agent-loop
object for every sample, the coordinator must outlive them."""


@register("treeroll_tree")
class TreeAgentLoop(AgentLoopBase):
    """A verl agent loop whose ``rollout.n`` samples are the leaves of one treeroll tree (see
    the module docstring): ``treeroll_config`` is a treeroll YAML (None: the defaults),
    ``credit_as_reward`` reports treeroll's credit as the reward (for
    ``treeroll_precomputed``)."""

    def __init__(self, *args: Any, treeroll_config: str | None = None,
                 credit_as_reward: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from treeroll.policies import load_policy

        config = load_config(treeroll_config) if treeroll_config is not None else TrainConfig()
        n = int(self.rollout_config.n)
        key = (str(treeroll_config), n)
        if key not in _COORDINATORS:
            view = load_policy(config.policy.init).view if config.policy.init else "plain"
            turn_format = TurnFormat(self.tokenizer, view=config.policy.view or view)
            _COORDINATORS[key] = TreeCoordinator(TreeGroups(config, turn_format, group_size=n))
        self.coordinator = _COORDINATORS[key]
        self.credit_as_reward = credit_as_reward

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Claim this sample's leaf of its group's tree (growing the tree if first)."""
        uid = str(kwargs["uid"])
        extra = kwargs.get("extra_info") or {}
        task = int(extra.get("task_seed", kwargs.get("index", 0)))
        seed = int(np.random.SeedSequence([zlib.crc32(uid.encode()), task])
                   .generate_state(1)[0])
        backend = VerlServerBackend(self.server_manager, asyncio.get_running_loop(),
                                    sampling_params)
        group, index = await self.coordinator.claim(uid, task, backend, seed=seed,
                                                    temperature=sampling_params.get(
                                                        "temperature"))
        return agent_loop_output(group, index, credit_as_reward=self.credit_as_reward)


def precomputed_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                          index: np.ndarray | None = None, config: Any = None,
                          **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``treeroll_precomputed``: each row's reward (treeroll's
    credit, with ``credit_as_reward=True``) is the advantage of every model token of the row,
    without renormalising (the credit is already relative to its tree). Returns
    ``(advantages, returns)``, both ``[rows, response_length]``."""
    score = token_level_rewards.sum(dim=-1, keepdim=True)
    advantages = score * response_mask
    return advantages, advantages


register_adv_est("treeroll_precomputed")(precomputed_advantage)
