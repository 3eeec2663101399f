"""The scripted stochastic agent as a generation backend that drives the SWE environment."""

from __future__ import annotations

import math

import pytest

from treeroll.base import GenerationBackend, GenerationRequest, SamplingParams
from treeroll.envs.swe import AgentSkill, ScriptedSWEAgent, builtin_tasks, make_swe_env
from treeroll.formatting import ByteTokenizer, TurnFormat

PARAMS = SamplingParams(max_new_tokens=4000)


@pytest.fixture(scope="module")
def tasks():
    return builtin_tasks()


def play(env, agent, seed: int, max_turns: int = 12, agent_seed: int | None = None,
         actions: list[str] | None = None):
    """Play task ``seed`` (the agent samples with ``agent_seed``, default ``seed``); the
    replies are appended to ``actions`` when given."""
    fmt = TurnFormat(ByteTokenizer())
    ids, _ = fmt.prompt(env.system_prompt, env.reset(seed))
    sampling = seed if agent_seed is None else agent_seed
    for turn in range(max_turns):
        completion = agent.generate([GenerationRequest(tuple(ids), seed=sampling * 100 + turn)],
                                    PARAMS)[0]
        assert completion.prefill_tokens == len(ids) and completion.cached_tokens == 0
        assert len(completion.logprobs) == len(completion.token_ids)
        ids += completion.token_ids
        action = fmt.decode_action(completion.token_ids)
        if actions is not None:
            actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return reward, info
        obs_ids, _ = fmt.observation(obs, completion.token_ids[-1] == fmt.eos_token_id)
        ids += obs_ids
    return 0.0, {"success": False}


def test_backend_contract(tasks):
    agent = ScriptedSWEAgent(tasks)
    assert isinstance(agent, GenerationBackend)
    prompt = tuple(ByteTokenizer().encode(f"Task {tasks[0].task_id}. fix it\n"))
    first = agent.generate([GenerationRequest(prompt, seed=5)], PARAMS)[0]
    again = agent.generate([GenerationRequest(prompt, seed=5)], PARAMS)[0]
    assert first.token_ids == again.token_ids and first.token_ids[-1] == 256
    assert first.finish_reason == "stop" and math.isclose(
        sum(first.logprobs), first.logprobs[0] * len(first.logprobs))
    assert sum(first.logprobs) <= 0.0
    short = agent.generate([GenerationRequest(prompt, max_new_tokens=5, seed=5)], PARAMS)[0]
    assert len(short.token_ids) == 5 and short.finish_reason == "length"
    seeds = {tuple(agent.generate([GenerationRequest(prompt, seed=s)], PARAMS)[0].token_ids)
             for s in range(20)}
    assert len(seeds) > 1


@pytest.mark.parametrize("convention", ["mini", "swe_agent"])
def test_skilled_agent_solves_and_clumsy_agent_fails(tasks, convention):
    env = make_swe_env(convention, tasks, step_limit=10)
    try:
        skilled = ScriptedSWEAgent(tasks, convention=convention, skill=AgentSkill(
            localize=1.0, fix=1.0, wrong_fix=0.0, submit=1.0, flail=0.0))
        for seed in (0, 7):
            reward, info = play(env, skilled, seed)
            assert reward == 1.0 and info["success"]
        clumsy = ScriptedSWEAgent(tasks, convention=convention, skill=AgentSkill(
            localize=1.0, fix=0.0, wrong_fix=1.0, submit=1.0, flail=0.0))
        reward, info = play(env, clumsy, 3)
        assert reward == 0.0 and not info["success"]
    finally:
        env.close()
        env.sandbox.close()


def test_default_agent_is_stochastic_across_seeds(tasks):
    """On one task, different sampling seeds make the default agent act differently; the same
    seed replays the same episode."""
    env = make_swe_env("mini", tasks, step_limit=6)
    agent = ScriptedSWEAgent(tasks)
    episodes: dict[int, list[str]] = {}
    try:
        outcomes = {play(env, agent, 0, agent_seed=s, actions=episodes.setdefault(s, []))[0]
                    for s in range(6)}
        again: list[str] = []
        play(env, agent, 0, agent_seed=3, actions=again)
    finally:
        env.close()
        env.sandbox.close()
    assert outcomes <= {0.0, 1.0}
    assert again == episodes[3]
    assert len({tuple(actions) for actions in episodes.values()}) > 1
    # and not only in the first turn: episodes that start alike still part later
    first = {}
    for actions in episodes.values():
        first.setdefault(actions[0], set()).add(tuple(actions))
    assert any(len(variants) > 1 for variants in first.values())
