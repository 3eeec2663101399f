"""The LLM judge scorer (``judge``).

:class:`JudgeScorer` -- a language model on any generation backend rates progress 0-10;
:func:`parse_rating` reads its reply. The judge counts the tokens it made its backend compute.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from treeroll.base import GenerationBackend, GenerationRequest, SamplingParams, Score
from treeroll.formatting import TurnFormat
from treeroll.scorers.common import clamp
from treeroll.tree import Node, RolloutTree, path_to

__all__ = ["JUDGE_PROMPT", "JudgeScorer", "parse_rating"]

JUDGE_PROMPT = (
    "You are judging an agent that is part-way through a task.\n"
    "Task:\n{task}\n\n"
    "Most recent turns:\n{history}\n\n"
    "How likely is the agent to succeed from here? Rate its progress from 0 (hopeless) to "
    "10 (certain success). Answer with one line: Rating: N/10"
)
"""The judge's default prompt; ``{task}`` is the root observation, ``{history}`` recent turns."""

_NUMBER = r"(-?\d+(?:\.\d+)?)"
_FRACTION = re.compile(_NUMBER + r"\s*(?:/|out of)\s*" + _NUMBER, re.IGNORECASE)
_PERCENT = re.compile(_NUMBER + r"\s*%")
_KEYWORD = re.compile(r"(?:rating|score|grade)\s*(?:is|of|=|:)?\s*" + _NUMBER, re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
          "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_WORD = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)


def parse_rating(reply: str, scale: float = 10.0) -> float | None:
    """A judge's reply as a score in ``[0, 1]``, or ``None`` if no rating can be read.

    Tried in order: a fraction ``a/b`` or ``a out of b`` with ``0 <= a <= b`` ("7/10",
    "3 out of 5"); a percentage ("70%"); a number after ``rating`` / ``score`` / ``grade``
    ("Rating: 8"); the first number in ``[0, scale]``; the first number word zero..ten.
    Numbers inside an out-of-range fraction or percentage ("12/10") are not read again.
    """
    for match in _FRACTION.finditer(reply):
        value, whole = float(match.group(1)), float(match.group(2))
        if whole > 0 and 0 <= value <= whole:
            return value / whole
    for match in _PERCENT.finditer(reply):
        if 0 <= float(match.group(1)) <= 100:
            return float(match.group(1)) / 100
    rest = _PERCENT.sub(" ", _FRACTION.sub(" ", reply))  # numbers of out-of-range fractions
    for pattern in (_KEYWORD, _ANY_NUMBER):
        for match in pattern.finditer(rest):
            if 0 <= float(match.group(1)) <= scale:
                return float(match.group(1)) / scale
    word = _WORD.search(reply)
    if word is not None:
        return _WORDS[word.group(1).lower()] / scale
    return None


@dataclass
class JudgeScorer:
    """A language model asked to rate each partial trajectory's progress 0-10.

    One request per node, all sent to ``backend`` in one batch; the prompt is
    ``prompt_template`` filled with the task (root observation) and the last ``last_turns``
    turns (PATR's PRM looks at the last 10 steps), wrapped by ``turn_format`` as a first turn.
    A reply :func:`parse_rating` cannot read scores 0.5 ("unparsable judge reply").
    The tokens the judge made its backend generate and prefill are counted in ``cost``.
    """

    backend: GenerationBackend
    turn_format: TurnFormat
    prompt_template: str = JUDGE_PROMPT
    system_prompt: str = ""
    last_turns: int = 10
    """Turns of history shown (the most recent)."""
    max_new_tokens: int = 16
    """Tokens the judge may write per rating."""
    temperature: float = 0.0
    """0 = greedy (the judge's rating is then deterministic)."""
    max_chars: int = 4000
    """Task and history texts are cut (keeping their ends) to this many characters each."""
    seed: int = 0
    cost: dict[str, int] = field(default_factory=lambda: {
        "requests": 0, "generated": 0, "prefill": 0, "cached": 0, "unparsable": 0})
    """Running totals: requests, generated / prefilled / cached tokens, unparsable replies."""

    def __post_init__(self) -> None:
        if "{history}" not in self.prompt_template:
            raise ValueError("judge prompt_template must contain {history} (and may use {task})")
        if self.last_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("judge needs last_turns >= 1 and max_new_tokens >= 1")

    def prompt_text(self, node: Node) -> str:
        """The judge's prompt for one node."""
        path = path_to(node)
        turns = []
        for i, step in enumerate(path[1:][-self.last_turns:]):
            number = len(path) - 1 - min(self.last_turns, len(path) - 1) + i + 1
            turns.append(f"Turn {number} action:\n{step.action_text.strip()}\n"
                         f"Turn {number} result:\n{step.observation_text.strip()}")
        history = "\n".join(turns) if turns else "(no action yet)"
        return self.prompt_template.format(task=path[0].observation_text.strip()[-self.max_chars:],
                                           history=history[-self.max_chars:])

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """Ask the judge once per node (one batched backend call) and parse the replies."""
        if not nodes:
            return []
        requests = [GenerationRequest(prompt_ids=tuple(self.turn_format.prompt(
            self.system_prompt, self.prompt_text(node))[0]), seed=self.seed + node.id)
            for node in nodes]
        params = SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                                stop_token_ids=self.turn_format.stop_token_ids)
        completions = self.backend.generate(requests, params)
        scores = []
        for completion in completions:
            self.cost["requests"] += 1
            self.cost["generated"] += len(completion.token_ids)
            self.cost["prefill"] += completion.prefill_tokens
            self.cost["cached"] += completion.cached_tokens
            reply = self.turn_format.decode_action(completion.token_ids).strip()
            value = parse_rating(reply)
            if value is None:
                self.cost["unparsable"] += 1
                scores.append(Score(0.5, "unparsable judge reply"))
            else:
                scores.append(Score(clamp(value), f"judge: {reply[:40]}"))
        return scores
