"""From environment text to model tokens, append-only (token-in/token-out).

A multi-turn context is built by *appending* token ids: the prompt once, then after each
sampled action the ids of the environment's reply. Nothing is ever decoded and re-encoded, so
the ids the trainer sees are exactly the ids the backend sampled (the most reported bug family
in agent-RL frameworks is re-tokenising a history that does not round-trip).

With a chat template, the ids appended after an action are the template's *delta*: the text
that closes the assistant turn (unless the model already sampled the end-of-turn token), the
user turn holding the observation, and the opening of the next assistant turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from treeroll.views import VIEWS

__all__ = ["ByteTokenizer", "TextTokenizer", "TurnFormat"]


class TextTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that treeroll uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Text to ids."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str:
        """Ids to text."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus an end-of-turn id 256. For scripted agents and tests.

    Decoding is lossless for any id sequence that came from :meth:`encode` (invalid UTF-8
    from sampled ids is replaced, never raised).
    """

    eos_token_id = 256
    vocab_size = 257

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """UTF-8 bytes of ``text``."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Bytes back to text; the end-of-turn id is dropped."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass
class TurnFormat:
    """Turns environment text into the token ids appended to a context.

    ``use_chat_template`` defaults to whether the tokenizer has one. Without one, the prompt is
    ``system + "\\n\\n" + observation + "\\n"`` and each later observation is appended as
    ``"\\n" + observation + "\\n"``, after the end-of-turn token.

    ``view`` names an observation view (:mod:`treeroll.views`) applied to every observation
    before it is encoded (``plain``: unchanged); a policy trained with a view must be run with
    it, which loading a policy folder arranges.
    """

    tokenizer: Any
    use_chat_template: bool | None = None
    view: str = "plain"

    def __post_init__(self) -> None:
        if self.use_chat_template is None:
            self.use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; set one so that a turn can end")
        self.eos_token_id: int = int(eos)
        self._view = VIEWS.get(self.view)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a model turn."""
        return (self.eos_token_id,)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, system_prompt: str, observation: str) -> tuple[list[int], str]:
        """Ids and text of the first context: system prompt and first observation."""
        observation = self._view(observation, True)
        if self.use_chat_template:
            messages = [{"role": "user", "content": observation}]
            if system_prompt:
                messages.insert(0, {"role": "system", "content": system_prompt})
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                      tokenize=False)
        else:
            text = (system_prompt + "\n\n" if system_prompt else "") + observation + "\n"
        return self._encode(text), text

    def observation(self, observation: str, action_ended_turn: bool) -> tuple[list[int], str]:
        """Ids and text appended after an action: close the turn if the model did not, then the
        observation, then whatever opens the next model turn."""
        observation = self._view(observation, False)
        if self.use_chat_template:
            text = self._chat_delta(observation, action_ended_turn)
            return self._encode(text), text
        ids = [] if action_ended_turn else [self.eos_token_id]
        text = "\n" + observation + "\n"
        return ids + self._encode(text), text

    def _chat_delta(self, observation: str, action_ended_turn: bool) -> str:
        marker = "\x00ACTION\x00"
        before = [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}]
        after = before + [{"role": "user", "content": observation}]
        first = self.tokenizer.apply_chat_template(before, tokenize=False)
        second = self.tokenizer.apply_chat_template(after, add_generation_prompt=True,
                                                    tokenize=False)
        closing = first[first.index(marker) + len(marker):]
        eos_text = self.tokenizer.decode([self.eos_token_id])
        if action_ended_turn and closing.startswith(eos_text):
            closing = closing[len(eos_text):]
        return closing + second[len(first):]

    def reply(self, text: str) -> list[int]:
        """Ids of a model reply as a policy samples it: the text's ids, then the end-of-turn
        id (supervised fine-tuning builds its contexts with this)."""
        return self._encode(text) + [self.eos_token_id]

    def decode_action(self, ids: list[int]) -> str:
        """The text an environment sees for a sampled action (special tokens dropped)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
