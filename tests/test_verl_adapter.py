"""treeroll's verl agent loop and estimator, against verl's real classes (verl 0.9.1 imports on
CPU; it is installed with ``--no-deps`` beside treeroll's pins, see the README).

A fake ``server_manager`` stands in for verl's inference server: it answers
``generate(request_id, prompt_ids=..., sampling_params=...)`` with verl's own ``TokenOutput``,
sampled by treeroll's transformers backend on the shipped base, and counts the requests.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("verl.experimental.agent_loop.agent_loop")

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    _agent_loop_registry,
)
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.workers.rollout.replica import TokenOutput

from treeroll.adapters import verl as tree_verl
from treeroll.backends.hf import HFBackend
from treeroll.base import GenerationRequest, SamplingParams
from treeroll.config import TrainConfig
from treeroll.policies import load_policy
from treeroll.tree import path_to


class FakeServer:
    """verl's server_manager, sampled by treeroll's HF backend (one request at a time)."""

    def __init__(self, policy: Any) -> None:
        self.backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **kwargs: Any) -> TokenOutput:
        self.calls.append({"id": request_id, **sampling_params})
        params = SamplingParams(temperature=sampling_params["temperature"],
                                top_p=sampling_params["top_p"],
                                max_new_tokens=sampling_params["max_tokens"],
                                stop_token_ids=tuple(sampling_params.get("stop_token_ids", ())))
        done = self.backend.generate([GenerationRequest(tuple(prompt_ids),
                                                        seed=sampling_params.get("seed"))],
                                     params)[0]
        return TokenOutput(token_ids=done.token_ids, log_probs=done.logprobs)


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return load_policy("frozenlake-tiny")


def trainer_config(n: int, response_length: int = 512) -> DictConfigWrap:
    """The part of verl's trainer config an agent loop reads."""
    return DictConfigWrap(config=SimpleNamespace(actor_rollout_ref=SimpleNamespace(
        rollout=SimpleNamespace(n=n, prompt_length=512, response_length=response_length))))


def make_loop(policy, server: FakeServer, n: int, config_path: str,
              response_length: int = 512) -> Any:
    """A TreeAgentLoop built with the arguments verl's AgentLoopWorker passes."""
    return tree_verl.TreeAgentLoop(trainer_config=trainer_config(n, response_length),
                                   server_manager=server,
                                   tokenizer=policy.tokenizer, processor=None,
                                   dataset_cls=None, data_config=DictConfigWrap(config={}),
                                   treeroll_config=config_path)


@pytest.fixture()
def config_path(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "tree.yaml"
    path.write_text("env: {name: frozenlake_rllm}\npolicy: {init: frozenlake-tiny}\n"
                    "strategy: {name: tree_grpo}\n")
    return str(path)


def test_the_agent_loop_is_registered_under_its_name_with_verl():
    assert _agent_loop_registry["treeroll_tree"]["_target_"] == (
        "treeroll.adapters.verl.TreeAgentLoop")
    assert get_adv_estimator_fn("treeroll_precomputed") is tree_verl.precomputed_advantage


def test_a_registry_entry_from_verls_yaml_keeps_its_settings_through_hydra(policy,
                                                                           config_path):
    import hydra.utils

    saved = dict(_agent_loop_registry["treeroll_tree"])
    entry = {"_target_": "treeroll.adapters.verl.TreeAgentLoop",
             "treeroll_config": config_path, "credit_as_reward": True}
    _agent_loop_registry["treeroll_tree"] = entry  # what verl's worker loads from the YAML
    try:
        tree_verl._register()  # the module's import-time registration must not replace it
        assert _agent_loop_registry["treeroll_tree"] == entry
        server = FakeServer(policy)
        loops = [hydra.utils.instantiate(
            config=_agent_loop_registry["treeroll_tree"], trainer_config=trainer_config(4),
            server_manager=server, tokenizer=policy.tokenizer, processor=None,
            dataset_cls=None, data_config=DictConfigWrap(config={}), tools=None)
            for _ in range(2)]
        assert all(loop.credit_as_reward for loop in loops)
        assert loops[0].coordinator is loops[1].coordinator
        assert loops[0].coordinator.groups.config.strategy.name == "tree_grpo"
    finally:
        _agent_loop_registry["treeroll_tree"] = saved


def test_a_groups_n_agent_loops_get_the_n_leaves_of_one_tree(policy, config_path):
    server = FakeServer(policy)
    n = 4

    async def samples() -> list[AgentLoopOutput]:
        rows = [(f"uid-{task}", task) for task in (21, 22) for _ in range(n)]
        loops = [make_loop(policy, server, n, config_path) for _ in rows]
        return list(await asyncio.gather(*(
            loop.run({"temperature": 1.0, "top_p": 1.0, "logprobs": True},
                     uid=uid, index=task, raw_prompt=[], extra_info={"task_seed": task})
            for loop, (uid, task) in zip(loops, rows, strict=True))))

    outputs = asyncio.run(samples())
    assert all(isinstance(o, AgentLoopOutput) for o in outputs)
    for block, uid in ((outputs[:n], "uid-21"), (outputs[n:], "uid-22")):
        assert {o.extra_fields["tree_uid"] for o in block} == {uid}
        paths = [tuple(o.extra_fields["tree_node_path"]) for o in block]
        assert len(set(paths)) == n, "two loops of a group got the same leaf"
        for o in block:
            assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs)
            assert o.reward_score == o.extra_fields["tree_reward"]
            assert o.num_turns == len(o.extra_fields["tree_node_path"]) - 1
    generated_turns = len(server.calls)
    row_turns = sum(o.num_turns for o in outputs)
    assert generated_turns < row_turns, (
        f"{generated_turns} requests for {row_turns} row turns: shared turns were generated "
        "more than once")
    assert all(call["logprobs"] is True and "max_tokens" in call for call in server.calls)


def test_an_output_is_the_leafs_token_path_with_environment_tokens_masked(policy, config_path):
    config = TrainConfig()
    config = replace(config, env=replace(config.env, name="frozenlake_rllm"),
                     strategy=replace(config.strategy, name="tree_grpo"))
    groups = tree_verl.TreeGroups(config, policy.turn_format(), group_size=4)
    group = groups.grow([7], policy.model, policy.tokenizer, seed=0)[0]
    for index, leaf in enumerate(group.leaves):
        out = tree_verl.agent_loop_output(group, index)
        ids, mask = [], []
        for node in path_to(leaf)[1:]:
            ids += node.action_ids
            mask += [1] * len(node.action_ids)
            if node is not leaf:
                ids += node.observation_ids
                mask += [0] * len(node.observation_ids)
        assert out.prompt_ids == group.tree.root.observation_ids
        assert out.response_ids == ids and out.response_mask == mask
        credited = tree_verl.agent_loop_output(group, index, credit_as_reward=True)
        assert credited.reward_score == pytest.approx(group.scalar_credit()[index])


def test_the_precomputed_estimator_puts_each_rows_credit_on_its_model_tokens():
    rewards = torch.zeros(3, 5)
    rewards[0, 2], rewards[1, 4], rewards[2, 0] = 0.5, -1.0, 0.0
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [1, 0, 0, 0, 0]])
    estimator = get_adv_estimator_fn("treeroll_precomputed")
    advantages, returns = estimator(token_level_rewards=rewards, response_mask=mask,
                                    index=np.array(["a", "a", "b"]), config=None)
    expected = torch.tensor([[0.5, 0.5, 0.5, 0, 0], [-1, 0, -1, -1, -1], [0, 0, 0, 0, 0]])
    assert torch.equal(advantages, expected) and torch.equal(returns, expected)


def test_more_loops_than_the_group_size_name_the_uid(policy, config_path):
    server = FakeServer(policy)

    async def samples() -> None:
        loops = [make_loop(policy, server, 2, config_path) for _ in range(3)]
        for loop in loops:
            await loop.run({"temperature": 1.0, "top_p": 1.0}, uid="u-9", index=9,
                           raw_prompt=[], extra_info={"task_seed": 9})

    with pytest.raises(ValueError, match="uid 'u-9': claim 3 of a group of 2"):
        asyncio.run(samples())


def test_a_row_without_a_task_seed_is_refused_naming_its_keys(policy, config_path):
    loop = make_loop(policy, FakeServer(policy), 2, config_path)
    with pytest.raises(ValueError, match=r"uid 'u-1': the dataset row has no "
                                         r"extra_info.task_seed \(its keys: \['index', "
                                         r"'raw_prompt', 'uid'\]"):
        asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0}, uid="u-1", index=0,
                             raw_prompt=[]))


def test_a_response_longer_than_verls_response_length_is_cut_to_it(policy):
    config = TrainConfig()
    config = replace(config, env=replace(config.env, name="frozenlake_rllm"),
                     strategy=replace(config.strategy, name="tree_grpo"))
    group = tree_verl.TreeGroups(config, policy.turn_format(), group_size=4).grow(
        [7], policy.model, policy.tokenizer, seed=0)[0]
    longest = max(range(4), key=lambda i: len(group.trajectories[i].response_ids))
    full = group.trajectories[longest]
    out = tree_verl.agent_loop_output(group, longest, response_length=5)
    assert out.response_ids == full.response_ids[:5] and len(out.response_mask) == 5
    assert out.response_logprobs == full.response_logprobs[:5]
    assert out.extra_fields["tree_cut"] == len(full.response_ids) - 5
    with pytest.raises(ValueError, match=r"more than rollout.prompt_length=3"):
        tree_verl.agent_loop_output(group, longest, prompt_length=3)


def test_importing_verl_registers_treerolls_loop_and_estimator_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    code = ("from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY\n"
            "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
            "assert 'treeroll_precomputed' in ADV_ESTIMATOR_REGISTRY\n"
            "assert 'treeroll_tree' in _agent_loop_registry\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, ("verl did not load treeroll through its verl.plugins entry "
                                  f"point (is treeroll installed?): {done.stderr[-1500:]}")
