"""What the fuzz tests throw at treeroll, and what each target must do with it.

Shared by ``tests/test_fuzz.py`` (hypothesis property tests, run in CI) and ``bench/fuzz.py``
(the same generators for a fixed budget, counting inputs and exceptions). Every target takes
one generated input and either returns normally or raises the one error type its contract
allows (a clear ``ValueError`` naming what is wrong); anything else is a bug.

Inputs: random text, random bytes decoded (UTF-8 with replacement, Latin-1), huge replies,
control characters, nested backticks and tags, and near misses of the valid forms (action
words, fenced blocks, ``<tool_call>`` JSON, ``str_replace_editor`` lines, chat messages).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

FRAGMENTS = ["```", "```bash\n", "```json\n", "\n```", "<tool_call>", "</tool_call>",
             "<answer>", "</answer>", "Action:", "Left", "Right", "Up", "Down", "left || up",
             "||", "submit", "str_replace_editor", " --old_str ", " --view_range ", "'", '"',
             "\\", "{", "}", '{"name": "bash", "arguments": {"command": "ls"}}',
             '{"name": "str_replace_editor", "arguments": {"command": "view"}}', "\x00",
             "\x1b[31m", "\r\n", "\t", "\u202e", "\ufeff", "9" * 30, "-1", "0", "3",
             "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "```bash\n```bash\n```"]

texts = st.one_of(
    st.text(max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", "replace")),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=12), max_size=30).map("".join),
    st.integers(min_value=10_000, max_value=200_000).map(lambda n: "Left " * (n // 5)),
    st.characters(max_codepoint=31).map(lambda c: c * 1000),
)
"""A model reply: random, decoded bytes, fragments of valid actions, huge, control chars."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)

message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant",
                                                          "tool", "x"]) | json_values,
                                 "content": st.text(max_size=60) | json_values})
conversation = st.lists(
    st.tuples(st.sampled_from(["user", "assistant"]), st.text(min_size=1, max_size=40)),
    min_size=1, max_size=6).map(lambda turns: json.dumps({"messages": [
        {"role": role, "content": content} for role, content in turns]}))
"""A conversation of well-typed messages (roles in any order, any text): some are valid."""

jsonl_lines = st.one_of(
    texts,
    conversation,
    json_values.map(json.dumps),
    st.lists(message, max_size=5).map(lambda m: json.dumps({"messages": m})),
    st.fixed_dictionaries({"input_ids": json_values, "loss_mask": json_values}).map(json.dumps),
)
"""A line of an SFT JSONL file: text, any JSON, near-miss conversations and id records."""


@dataclass(frozen=True)
class Target:
    """One thing to fuzz: ``call(input)`` must return or raise one of ``allowed``."""

    name: str
    inputs: Any
    call: Callable[[Any], Any]
    allowed: tuple[type[BaseException], ...] = ()


def _frozenlake_step(convention: str) -> Callable[[str], Any]:
    from treeroll.envs import make_frozenlake

    def step(reply: str) -> Any:
        env = make_frozenlake(convention)
        env.reset(7)
        start = env.position
        observation, reward, _, _, info = env.step(reply)
        assert isinstance(observation, str) and isinstance(info, dict)
        if not info["action_names"]:  # nothing valid in the reply: an invalid action
            assert info["format_error"] and env.position == start
            assert reward == -env.config.format_penalty, reward
        return observation
    return step


def _gym_step(reply: str) -> Any:
    from treeroll.envs.gym_text import GymTextEnv

    env = GymTextEnv("FrozenLake-v1", max_turns=5, action_names=["Left", "Down", "Right", "Up"],
                     make_kwargs={"is_slippery": False}, invalid_penalty=0.1)
    env.reset(3)
    observation, reward, _, _, info = env.step(reply)
    assert isinstance(observation, str) and isinstance(info, dict)
    if info["action_index"] is None:  # not an action: the wrapped env is not stepped
        assert info["format_error"] and reward == -env.invalid_penalty, reward
    return observation


def _swe_parse(convention: str) -> Callable[[str], Any]:
    from treeroll.envs.swe.actions import parse_action

    def parse(reply: str) -> Any:
        parsed = parse_action(reply, convention)
        assert parsed.kind in ("bash", "editor", "submit", "error"), parsed.kind
        assert parsed.kind != "error" or parsed.error
        return parsed
    return parse


def _pytest_report(text: str) -> Any:
    from treeroll.envs.swe.tasks import parse_pytest_report

    report = parse_pytest_report(text)
    assert isinstance(report, dict)
    return report


_TURN_FORMAT: list[Any] = []


def _sft_line(line: str) -> Any:
    from treeroll.policies import load_policy
    from treeroll.training.sft_data import parse_line

    if not _TURN_FORMAT:
        policy = load_policy("frozenlake-tiny")
        _TURN_FORMAT.append((policy.turn_format(), len(policy.tokenizer)))
    turn_format, vocab = _TURN_FORMAT[0]
    return parse_line(line, turn_format, vocab)


def targets() -> list[Target]:
    """Every fuzz target."""
    return [
        Target("frozenlake_rllm.step", texts, _frozenlake_step("rllm")),
        Target("frozenlake_ragen.step", texts, _frozenlake_step("ragen")),
        Target("gym_text.step", texts, _gym_step),
        Target("swe.parse_action[mini]", texts, _swe_parse("mini")),
        Target("swe.parse_action[swe_agent]", texts, _swe_parse("swe_agent")),
        Target("swe.parse_pytest_report", texts, _pytest_report),
        Target("sft.parse_line", jsonl_lines, _sft_line, allowed=(ValueError,)),
    ]
