"""Tree rollouts in verl: an agent loop fed by a per-group tree coordinator, and an advantage
estimator for treeroll's tree credit.

verl (0.9) runs one ``AgentLoopBase.run`` per sample; the trainer repeats each prompt
``rollout.n`` times under one ``uid``, and a loop talks to verl's inference server through
``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` (token ids in,
``TokenOutput(token_ids, log_probs)`` out). :class:`TreeAgentLoop` (registered as
``treeroll_tree``) turns the ``n`` loops of a group into the ``n`` leaves of one tree:

- the :class:`TreeCoordinator` of the process holds one tree per ``uid``: the group's first
  loop grows the whole tree (``n`` leaves, :mod:`treeroll.adapters.tree_groups`) on verl's own
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
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
    register,
)
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from treeroll.adapters.async_backend import AsyncTokenBackend
from treeroll.adapters.tree_groups import LeafGroup, TreeGroups, seed_for
from treeroll.base import GenerationRequest, SamplingParams

__all__ = ["TreeAgentLoop", "TreeCoordinator", "VerlServerBackend", "agent_loop_output",
           "precomputed_advantage"]

logger = logging.getLogger(__name__)


class VerlServerBackend(AsyncTokenBackend):
    """A treeroll :class:`~treeroll.base.GenerationBackend` over verl's ``server_manager``
    (:class:`~treeroll.adapters.async_backend.AsyncTokenBackend`): each request is one
    ``server_manager.generate`` with verl's sampling parameters of the loop
    (``sampling_params``: top-k, repetition penalty, ...), treeroll's on top, and
    ``logprobs=True``."""

    def __init__(self, server_manager: Any, loop: asyncio.AbstractEventLoop,
                 sampling_params: dict[str, Any] | None = None, *, uid: str = "") -> None:
        super().__init__(loop)
        self.server_manager = server_manager
        self.base_params = dict(sampling_params or {})
        self.uid = uid
        self._ids = itertools.count()

    async def send(self, request: GenerationRequest, params: SamplingParams) -> Any:
        """One ``server_manager.generate`` call (verl's ``TokenOutput`` back). Request ids
        are ``treeroll-<uid>-<k>``: unique across groups and within one (vLLM refuses two
        live requests with one id; verl's router is sticky by request id, so a tree's
        requests are spread over the replicas, not kept on one)."""
        options = {**self.base_params, **self.options(request, params), "logprobs": True}
        return await self.server_manager.generate(f"treeroll-{self.uid}-{next(self._ids)}",
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
    claim takes the next of its ``group_size`` leaves (see the module docstring). At most
    ``max_open`` groups wait for claims; the oldest beyond that is forgotten with a warning
    (a group that never claims all its leaves: validation with ``val_kwargs.n`` other than
    ``rollout.n``, or a group split across workers)."""

    def __init__(self, groups: TreeGroups, max_open: int = 4096) -> None:
        self.groups = groups
        self.max_open = max_open
        self._by_uid: OrderedDict[str, _Group] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()
        """uids whose every leaf was handed out (the last 65,536): a later claim is an
        error, not a second tree (verl's uids are fresh per prompt and step)."""
        self._lock = threading.Lock()  # held for dict updates only, never across an await

    def _over_claimed(self, uid: str, index: int) -> ValueError:
        """The error of claim ``index`` (0-based) of a group that has no leaf left."""
        return ValueError(f"uid {uid!r}: claim {index + 1} of a group of "
                          f"{self.groups.group_size}; rollout.n must equal the tree's "
                          "group size")

    async def claim(self, uid: str, task_seed: int, backend: VerlServerBackend, *,
                    seed: int, temperature: float | None = None,
                    top_p: float | None = None) -> tuple[LeafGroup, int]:
        """The tree of ``uid`` and the index of the leaf this caller gets."""
        with self._lock:
            if uid in self._finished:
                raise self._over_claimed(uid, self.groups.group_size)
            entry = self._by_uid.get(uid)
            first = entry is None
            if entry is None:
                entry = self._by_uid[uid] = _Group()
                while len(self._by_uid) > self.max_open:
                    stale, _ = self._by_uid.popitem(last=False)
                    logger.warning("treeroll: forgot the tree of uid %r, whose group never "
                                   "claimed all its %d leaves (validation with "
                                   "val_kwargs.n != rollout.n, or a group split across "
                                   "agent-loop workers)", stale, self.groups.group_size)
            index = entry.claimed
            entry.claimed += 1
        if index >= self.groups.group_size:
            raise self._over_claimed(uid, index)
        if first:
            try:
                grown = await asyncio.to_thread(self.groups.grow_on, backend, [task_seed],
                                                seed=seed, temperature=temperature,
                                                top_p=top_p)
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


def agent_loop_output(group: LeafGroup, index: int, *, uid: str = "",
                      prompt_length: int | None = None, response_length: int | None = None,
                      credit_as_reward: bool = False) -> AgentLoopOutput:
    """verl's ``AgentLoopOutput`` for leaf ``index`` of ``group`` (of verl group ``uid``).

    verl pads rows to ``rollout.prompt_length`` / ``response_length`` but does not cut them:
    a longer response is cut to ``response_length`` (ids, mask and logprobs alike;
    ``extra_fields["tree_cut"]`` says how many tokens went), a longer root prompt is an
    error naming both lengths."""
    trajectory = group.trajectories[index]
    credit = group.row_credit(index)
    if prompt_length is not None and len(trajectory.prompt_ids) > prompt_length:
        raise ValueError(f"task {group.tree.task_seed}: the prompt has "
                         f"{len(trajectory.prompt_ids)} tokens, more than "
                         f"rollout.prompt_length={prompt_length}")
    keep = len(trajectory.response_ids) if response_length is None else response_length
    return AgentLoopOutput(
        prompt_ids=list(trajectory.prompt_ids), response_ids=trajectory.response_ids[:keep],
        response_mask=trajectory.response_mask[:keep],
        response_logprobs=trajectory.response_logprobs[:keep],
        reward_score=float(credit if credit_as_reward else trajectory.reward),
        num_turns=trajectory.num_turns, metrics=AgentLoopMetrics(),
        extra_fields={"tree_uid": uid, "tree_cut": max(0, len(trajectory.response_ids) - keep),
                      "tree_node_path": list(trajectory.node_path),
                      "tree_credit": float(credit), "tree_reward": float(trajectory.reward),
                      "tree_top_up": int(group.is_top_up(index))})


_COORDINATORS: dict[tuple[str, int], TreeCoordinator] = {}
"""One coordinator per (settings file, group size) in a process: verl builds a new agent-loop
object for every sample, the coordinator must outlive them."""


class TreeAgentLoop(AgentLoopBase):
    """A verl agent loop whose ``rollout.n`` samples are the leaves of one treeroll tree (see
    the module docstring): ``treeroll_config`` is a treeroll YAML (None: the defaults),
    ``credit_as_reward`` reports treeroll's credit as the reward (for
    ``treeroll_precomputed``)."""

    def __init__(self, *args: Any, treeroll_config: str | None = None,
                 credit_as_reward: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        n = int(self.rollout_config.n)
        key = (str(treeroll_config), n)
        if key not in _COORDINATORS:
            _COORDINATORS[key] = TreeCoordinator(TreeGroups.from_file(
                treeroll_config, self.tokenizer, group_size=n))
        self.coordinator = _COORDINATORS[key]
        self.credit_as_reward = credit_as_reward

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Claim this sample's leaf of its group's tree (growing the tree if first)."""
        uid = str(kwargs["uid"])
        extra = kwargs.get("extra_info") or {}
        if "task_seed" not in extra:
            raise ValueError(f"uid {uid!r}: the dataset row has no extra_info.task_seed (its "
                             f"keys: {sorted(kwargs)}; extra_info: {sorted(extra)}); treeroll "
                             "needs the environment's task seed there")
        task = int(extra["task_seed"])
        backend = VerlServerBackend(self.server_manager, asyncio.get_running_loop(),
                                    sampling_params, uid=uid)
        group, index = await self.coordinator.claim(
            uid, task, backend, seed=seed_for(uid, task),
            temperature=sampling_params.get("temperature"), top_p=sampling_params.get("top_p"))
        return agent_loop_output(group, index, uid=uid,
                                 prompt_length=_length(self.rollout_config, "prompt_length"),
                                 response_length=_length(self.rollout_config,
                                                         "response_length"),
                                 credit_as_reward=self.credit_as_reward)


def _length(rollout_config: Any, name: str) -> int | None:  # Any: verl's rollout config
    value = getattr(rollout_config, name, None)
    return int(value) if value is not None else None


def precomputed_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                          index: np.ndarray | None = None,
                          config: Any = None,  # Any: verl's algorithm config, passed by verl
                          **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``treeroll_precomputed``: each row's reward (treeroll's
    credit, with ``credit_as_reward=True``) is the advantage of every model token of the row,
    without renormalising (the credit is already relative to its tree). Returns
    ``(advantages, returns)``, both ``[rows, response_length]``."""
    score = token_level_rewards.sum(dim=-1, keepdim=True)
    advantages = score * response_mask
    return advantages, advantages


def _register() -> None:
    """Register the loop as ``treeroll_tree`` unless verl already holds an entry of that name
    (its worker loads ``agent_loop_config_path`` first: that entry carries the loop's settings
    and must not be replaced), and the estimator as ``treeroll_precomputed``. Runs on import;
    verl imports this module in every process through the ``verl.plugins`` entry point."""
    if "treeroll_tree" not in _agent_loop_registry:
        register("treeroll_tree")(TreeAgentLoop)
    if ADV_ESTIMATOR_REGISTRY.get("treeroll_precomputed") is not precomputed_advantage:
        register_adv_est("treeroll_precomputed")(precomputed_advantage)


_register()
