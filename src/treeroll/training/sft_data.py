"""Supervised fine-tuning data: token ids with a loss mask, built through the RL turn format.

Every example is a whole multi-turn context as a rollout would build it
(:class:`treeroll.formatting.TurnFormat`: the prompt, then each reply and the environment's
answer appended as ids), so SFT and RL contexts are token-identical. The loss mask is 1 on
the model's tokens (each reply and its end-of-turn id) and 0 on everything the environment
wrote. Three sources:

* an environment's expert (:class:`treeroll.base.ExpertEnv`), episodes generated on the fly
  from training task seeds (:func:`expert_episode`);
* a JSONL file of conversations in TRL's SFT format, ``{"messages": [{"role": "system" |
  "user" | "assistant" | "tool", "content": "..."}, ...]}`` (:func:`read_jsonl`);
* a JSONL file of token ids, ``{"input_ids": [...], "loss_mask": [...]}`` (``labels`` with
  -100 for masked positions is accepted instead of ``loss_mask``).

A malformed line is reported with its file and line number, and either stops the run before
any training (``on_bad_line="error"``) or is skipped with a warning (``"skip"``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treeroll.base import Env, ExpertEnv
from treeroll.formatting import TurnFormat

__all__ = ["BadDataLine", "SFTExample", "batches_by_tokens", "expert_episode", "parse_line",
           "read_jsonl"]


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: ``ids`` and a same-length ``loss_mask`` (1 = model token)."""

    ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.loss_mask):
            raise ValueError(f"ids ({len(self.ids)}) and loss_mask ({len(self.loss_mask)}) "
                             "must have the same length")

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss covers (the first token is never predicted)."""
        return sum(self.loss_mask[1:])


class BadDataLine(ValueError):
    """A JSONL line that is not a valid SFT example; the message names file and line."""


def expert_episode(env: Env, seed: int, turn_format: TurnFormat, rng: np.random.Generator,
                   *, skill: float = 1.0, mask_noise: bool = True, explain: bool | str = False,
                   safe_moves: bool = False, max_turns: int = 10_000) -> SFTExample:
    """One whole episode of ``env``'s expert on task ``seed``, as the policy would see it.

    With ``mask_noise`` the replies the expert's noise chose (``is_expert=False``) stay in the
    context but out of the loss, so a noisy expert shows the policy off-path states and
    teaches only the expert's own moves there. ``explain`` asks the expert to state what
    it reads before each action (:meth:`treeroll.base.ExpertEnv.expert_reply`);
    ``safe_moves`` asks FrozenLake's expert to list the moves that avoid a hole in it."""
    if not isinstance(env, ExpertEnv):
        raise ValueError(f"{type(env).__name__} has no expert (it does not implement "
                         "treeroll.base.ExpertEnv.expert_reply); use a JSONL data file")
    ids, _ = turn_format.prompt(env.system_prompt, env.reset(seed))
    mask = [0] * len(ids)
    for _ in range(max_turns):
        reply = (env.expert_reply(rng, skill, explain=explain, safe_moves=True)
                 if safe_moves else env.expert_reply(rng, skill, explain=explain))
        reply_ids = turn_format.reply(reply.text)
        ids += reply_ids
        mask += [int(reply.is_expert or not mask_noise)] * len(reply_ids)
        # the environment reads what a rollout would hand it: the decoded ids
        observation, _, terminated, truncated, _ = env.step(turn_format.decode_action(reply_ids))
        if terminated or truncated:
            break
        observation_ids, _ = turn_format.observation(observation, action_ended_turn=True)
        ids += observation_ids
        mask += [0] * len(observation_ids)
    return SFTExample(tuple(ids), tuple(mask))


def _messages_example(messages: Any, turn_format: TurnFormat) -> SFTExample:
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str) \
                or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"messages[{i}] must be an object with a 'role' (system, user, "
                             f"assistant or tool) and a string 'content', got {message!r:.80}")
        if message.get("tool_calls"):
            raise ValueError(f"messages[{i}] has 'tool_calls': treeroll trains on text replies "
                             "(write the call into the content, as the environment parses it)")
    system = ""
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"], messages[1:]
    if not messages or messages[0]["role"] != "user":
        raise ValueError("the first message after an optional system message must be 'user' "
                         "(the first observation)")
    ids, _ = turn_format.prompt(system, messages[0]["content"])
    mask = [0] * len(ids)
    previous = "user"
    for i, message in enumerate(messages[1:], start=1):
        role = message["role"]
        if role == "system":
            raise ValueError(f"messages[{i}]: a system message may only come first")
        if (role == "assistant") == (previous == "assistant"):
            raise ValueError(f"messages[{i}]: roles must alternate between assistant and "
                             f"user/tool, got {previous} then {role}")
        if role == "assistant":
            piece = turn_format.reply(message["content"])
            mask += [1] * len(piece)
        else:
            piece, _ = turn_format.observation(message["content"], action_ended_turn=True,
                                               role=role)
            mask += [0] * len(piece)
        ids += piece
        previous = "assistant" if role == "assistant" else "user"
    if not any(mask):
        raise ValueError("no assistant message: nothing to train on")
    return SFTExample(tuple(ids), tuple(mask))


def _ids_example(record: dict[str, Any], vocab_size: int) -> SFTExample:
    ids = record["input_ids"]
    if "loss_mask" in record:
        mask = record["loss_mask"]
    elif "labels" in record:
        labels = record["labels"]
        if not isinstance(labels, list):
            raise ValueError("'labels' must be a list of ints")
        mask = [int(label != -100) for label in labels]
    else:
        raise ValueError("an 'input_ids' record needs 'loss_mask' (or 'labels' with -100)")
    if not isinstance(ids, list) or not ids or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError("'input_ids' must be a non-empty list of ints")
    if not isinstance(mask, list) or any(m not in (0, 1) for m in mask):
        raise ValueError("'loss_mask' must be a list of 0s and 1s")
    if len(mask) != len(ids):
        raise ValueError(f"'input_ids' has {len(ids)} ids but the mask has {len(mask)}")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if not any(mask[1:]):
        raise ValueError("the loss mask has no 1 after the first token: nothing to train on")
    return SFTExample(tuple(ids), tuple(mask))


def parse_line(line: str, turn_format: TurnFormat, vocab_size: int) -> SFTExample:
    """One JSONL line (messages or token ids) as an example; ``ValueError`` says what is
    wrong with it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        return _messages_example(record["messages"], turn_format)
    if "input_ids" in record:
        return _ids_example(record, vocab_size)
    raise ValueError("expected a 'messages' list (TRL's conversational format) or "
                     f"'input_ids' with 'loss_mask'; got keys {sorted(record)}")


def read_jsonl(path: str | Path, turn_format: TurnFormat, vocab_size: int, *,
               on_bad_line: str = "error",
               warn: Callable[[str], None] | None = None) -> list[SFTExample]:
    """Every example of a JSONL file, all read and checked before training starts.

    ``on_bad_line``: ``"error"`` raises :class:`BadDataLine` naming the first bad line;
    ``"skip"`` leaves bad lines out (each reported through ``warn``, by default a Python
    warning). Blank lines are ignored. An empty result is an error."""
    if on_bad_line not in ("error", "skip"):
        raise ValueError(f"on_bad_line must be 'error' or 'skip', got {on_bad_line!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data file {path} does not exist")
    report = warn or (lambda text: warnings.warn(text, stacklevel=3))
    examples: list[SFTExample] = []
    skipped: list[int] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(f"not valid UTF-8 (byte {err.start})") from None
                examples.append(parse_line(line, turn_format, vocab_size))
            except ValueError as err:
                message = f"{path}:{number}: {err}"
                if on_bad_line == "error":
                    raise BadDataLine(message + " (set data.on_bad_line: skip to leave bad "
                                      "lines out)") from None
                skipped.append(number)
                report(f"skipping {message}")
    if not examples:
        raise BadDataLine(f"{path}: no usable example"
                          + (f" ({len(skipped)} bad lines skipped)" if skipped else ""))
    return examples


def batches_by_tokens(examples: Sequence[SFTExample], max_tokens: int
                      ) -> list[list[SFTExample]]:
    """Split one step's examples into micro-batches of at most ``max_tokens`` padded tokens
    (examples sorted by length, so each micro-batch pads little); an example longer than
    ``max_tokens`` gets a micro-batch of its own."""
    ordered = sorted(examples, key=lambda e: len(e.ids))
    out: list[list[SFTExample]] = []
    current: list[SFTExample] = []
    for example in ordered:
        if current and len(example.ids) * (len(current) + 1) > max_tokens:
            out.append(current)
            current = []
        current.append(example)
    if current:
        out.append(current)
    return out
