"""treeroll's rLLM workflow: one episode per tree, in rLLM's field layout.

rLLM is not on the package registries, so its classes cannot be installed here: the layout
is checked as plain data (:func:`episode_fields`, rLLM's field names), the workflow's backend
is driven by a fake token-in / token-out engine, and the test that builds rLLM's real
``Episode`` runs only where rLLM is importable.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from treeroll.adapters.rllm import (
    RLLMEngineBackend,
    engine_sampling,
    episode_fields,
    tree_episode,
)
from treeroll.adapters.tree_groups import TreeGroups
from treeroll.backends.hf import HFBackend
from treeroll.base import GenerationRequest, SamplingParams
from treeroll.config import TrainConfig
from treeroll.policies import load_policy


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return load_policy("frozenlake-tiny")


def settings() -> TrainConfig:
    config = TrainConfig()
    return replace(config, env=replace(config.env, name="frozenlake_rllm"),
                   strategy=replace(config.strategy, name="tree_grpo"))


class FakeEngine:
    """rLLM's RolloutEngine token-in/token-out, sampled by treeroll's HF backend."""

    supports_token_in_token_out = True

    def __init__(self, policy: Any) -> None:
        self.backend = HFBackend(policy.model, pad_token_id=policy.tokenizer.pad_token_id or 0)
        self.calls: list[dict[str, Any]] = []

    async def get_token_output_from_token_input(self, token_input: list[int],
                                                **kwargs: Any) -> SimpleNamespace:
        self.calls.append(kwargs)
        params = SamplingParams(temperature=kwargs["temperature"], top_p=kwargs["top_p"],
                                max_new_tokens=kwargs["max_tokens"],
                                stop_token_ids=tuple(kwargs.get("stop_token_ids", ())))
        done = self.backend.generate([GenerationRequest(tuple(token_input),
                                                        seed=kwargs.get("seed"))], params)[0]
        return SimpleNamespace(token_ids=done.token_ids, log_probs=done.logprobs)


def grow_on_fake_engine(policy, group_size: int = 4):  # type: ignore[no-untyped-def]
    groups = TreeGroups(settings(), policy.turn_format(), group_size=group_size)
    engine = FakeEngine(policy)

    async def grow():  # type: ignore[no-untyped-def]
        backend = RLLMEngineBackend(engine, asyncio.get_running_loop())
        return await asyncio.to_thread(groups.grow_on, backend, [13], seed=3)

    return asyncio.run(grow())[0], engine


def test_an_episode_holds_one_trajectory_per_leaf_with_one_step_per_turn(policy):
    group, engine = grow_on_fake_engine(policy)
    episode = episode_fields(group, "task13:0", {"task_seed": 13}, advantage=True)
    assert episode["id"] == "task13:0" and len(episode["trajectories"]) == 4
    plain = episode_fields(group, "task13:0", {"task_seed": 13})
    assert all(s["advantage"] is None for t in plain["trajectories"] for s in t["steps"])
    credits = group.scalar_credit()
    for trajectory, leaf_row, credit in zip(episode["trajectories"], group.trajectories,
                                            credits, strict=True):
        assert trajectory["name"] == "treeroll"
        assert trajectory["reward"] == leaf_row.reward
        steps = trajectory["steps"]
        assert len(steps) == leaf_row.num_turns and steps[-1]["done"]
        assert steps[0]["prompt_ids"] == leaf_row.prompt_ids
        flat = [t for s in steps for t in s["response_ids"]]
        assert flat == [t for t, m in zip(leaf_row.response_ids, leaf_row.response_mask,
                                          strict=True) if m]
        for before, after in itertools.pairwise(steps):
            grown = before["prompt_ids"] + before["response_ids"]
            assert after["prompt_ids"][:len(grown)] == grown, (
                "a step's prompt does not extend the previous step (rLLM merges on it)")
        assert all(s["advantage"] == pytest.approx(credit) for s in steps)
        assert all(s["model_output"]["completion_ids"] == s["response_ids"] for s in steps)
        assert all(len(s["logprobs"]) == len(s["response_ids"]) for s in steps)
    assert sum(len(t["steps"]) for t in episode["trajectories"]) > len(engine.calls), (
        "every row turn was generated separately: the tree shared nothing")


def test_the_engine_backend_sends_treerolls_sampling_options(policy):
    _, engine = grow_on_fake_engine(policy)
    assert engine.calls and all({"temperature", "top_p", "max_tokens", "seed"} <= set(c)
                                for c in engine.calls)


def test_an_engine_without_token_in_token_out_and_a_bad_uid_are_refused(policy):
    with pytest.raises(ValueError, match="token-in/token-out"):
        RLLMEngineBackend(SimpleNamespace(supports_token_in_token_out=False), None)  # type: ignore[arg-type]
    group, _ = grow_on_fake_engine(policy)
    with pytest.raises(ValueError, match="'task_id:rollout_idx'"):
        episode_fields(group, "no-colon")


RLLM = importlib.util.find_spec("rllm") is not None


@pytest.mark.skipif(RLLM, reason="rLLM is installed: the workflow builds")
def test_the_workflow_without_rllm_says_how_to_get_it():
    from treeroll.adapters import rllm as adapter

    with pytest.raises(ImportError, match="not on the package registries"):
        adapter.TreeWorkflow  # noqa: B018


@pytest.mark.skipif(not RLLM, reason="rLLM is not on the package registries (not installed)")
def test_the_real_rllm_episode_validates_and_names_its_task(policy):
    group, _ = grow_on_fake_engine(policy)
    episode = tree_episode(group, "task13:0", {"task_seed": 13})
    assert episode.task_id == "task13" and len(episode.trajectories) == 4
    first = episode.trajectories[0].steps[0]
    assert first.model_output.prompt_ids == group.tree.root.observation_ids


def test_the_tree_samples_at_the_engines_own_temperature_and_top_p():
    engine = SimpleNamespace(is_validation=False,
                             train_sampling_params={"temperature": 0.7, "top_p": 0.95},
                             val_sampling_params={"temperature": 0.0, "top_p": 1.0})
    assert engine_sampling(engine) == (0.7, 0.95)
    engine.is_validation = True
    assert engine_sampling(engine) == (0.0, 1.0)
    assert engine_sampling(SimpleNamespace()) == (None, None)
