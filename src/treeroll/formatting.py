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

__all__ = ["ByteTokenizer", "TemplateProblem", "TextTokenizer", "TurnFormat"]


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


_ACTION = "\x00treeroll-action\x00"
"""A stand-in for the assistant's reply when a template is rendered to find what follows it."""
_SYSTEM = "\x00treeroll-system\x00"
_PROBE_REASONING = "<think>\nweighing the moves\n</think>\n\n"
"""A reasoning block in the probe conversation: templates that drop earlier turns' reasoning
(Qwen3's) are found by it."""


class TemplateProblem(ValueError):
    """A chat template that cannot render what treeroll must append (a role it rejects or
    drops), with the fix."""


@dataclass
class TurnFormat:
    """Turns environment text into the token ids appended to a context.

    ``use_chat_template`` defaults to whether the tokenizer has one. Without one, the prompt is
    ``system + "\\n\\n" + observation + "\\n"`` and each later observation is appended as
    ``"\\n" + observation + "\\n"``, after the end-of-turn token.

    With a chat template, what is appended after a reply is the template's own text for it:
    the template is rendered with the reply replaced by a marker and the real observation in
    its role (``user``, or ``tool`` where the template has that role), and what follows the
    marker is appended (the assistant turn's closing, unless the model sampled it, the
    observation's turn and the next assistant header). A template that rewrites earlier turns
    (Qwen3 drops earlier reasoning blocks) cannot be followed append-only; treeroll stays
    append-only, keeping what the model saw, and :meth:`template_report` says so.

    A turn ends on :attr:`stop_token_ids`: the template's assistant end-of-turn token, the
    tokenizer's eos and ``extra_stop_ids`` (a model's ``generation_config.eos_token_id``).
    :meth:`reply` ends a reply with the end-of-turn token the template writes.

    ``view`` names an observation view (:mod:`treeroll.views`) applied to every observation
    before it is encoded (``plain``: unchanged); a policy trained with a view must be run with
    it, which loading a policy folder arranges.

    ``system_in_user`` folds the system prompt into the first user turn (``system + "\\n\\n"
    + observation``), for templates that reject or drop a system message; such a template
    without it is refused at construction with that fix.
    """

    tokenizer: Any
    use_chat_template: bool | None = None
    view: str = "plain"
    extra_stop_ids: tuple[int, ...] = ()
    """Further ids that end a turn (a model's ``generation_config.eos_token_id``)."""
    system_in_user: bool = False

    def __post_init__(self) -> None:
        if self.use_chat_template is None:
            self.use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id; set one so that a turn can end")
        self.eos_token_id: int = int(eos)
        self.end_of_turn_id: int = self.eos_token_id
        """The id that ends an assistant turn: the template's, else eos."""
        self._view = VIEWS.get(self.view)
        self._roles: set[str] = {"user"}
        self._header = ""
        if self.use_chat_template:
            self._check_template()

    # ------------------------------------------------------------------ the template's rules

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return str(self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False))

    def _check_template(self) -> None:
        """Find the template's end-of-turn token and which roles it renders; refuse a
        template that rejects or drops the system message (unless ``system_in_user``)."""
        closing = self._after_action([{"role": "user", "content": "u"},
                                      {"role": "assistant", "content": _ACTION}], False)
        first = self._encode(closing)[:1]
        special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        added = set(getattr(self.tokenizer, "added_tokens_decoder", {}) or {})
        if first and (first[0] in special or first[0] in added):
            self.end_of_turn_id = first[0]
        with_reply = self._render([{"role": "user", "content": "u"},
                                   {"role": "assistant", "content": _ACTION}], False)
        self._header = with_reply[:with_reply.index(_ACTION)]
        """A context a reply follows, ending in the assistant header: a reply is encoded as
        it is in context, after it."""
        if not self.system_in_user:
            try:
                text = self._render([{"role": "system", "content": _SYSTEM},
                                     {"role": "user", "content": "u"}], True)
            except Exception as error:  # jinja's TemplateError, or what the template raises
                raise TemplateProblem(
                    f"the chat template rejects a system message ({error}); pass "
                    "--policy.system-in-user true to fold the system prompt into the first "
                    "user turn") from None
            if _SYSTEM not in text:
                raise TemplateProblem(
                    "the chat template drops the system message (it does not appear in the "
                    "rendered prompt); pass --policy.system-in-user true to fold the system "
                    "prompt into the first user turn")
        for role in ("tool",):
            try:
                text = self._render([{"role": "user", "content": "u"},
                                     {"role": "assistant", "content": _ACTION},
                                     {"role": role, "content": _SYSTEM}], True)
            except Exception:  # the template rejects the role: observations stay user turns
                continue
            if _SYSTEM in text:
                self._roles.add(role)

    def _after_action(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        text = self._render(messages, generation_prompt)
        return text[text.index(_ACTION) + len(_ACTION):]

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a model turn: the template's end-of-turn token, eos, and
        ``extra_stop_ids``, each once."""
        return tuple(dict.fromkeys((self.end_of_turn_id, self.eos_token_id,
                                    *self.extra_stop_ids)))

    @property
    def roles(self) -> frozenset[str]:
        """Roles an observation may take: ``user``, and ``tool`` where the template has it."""
        return frozenset(self._roles)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_after(self, anchor: str, text: str) -> list[int]:
        """Ids of ``text`` as they are inside a context right after ``anchor``: a
        SentencePiece tokenizer encoding ``text`` alone adds a word-start marker the context
        does not have (Phi-3's replies would differ from the template's rendering)."""
        before = self._encode(anchor)
        ids = self._encode(anchor + text)
        return ids[len(before):] if ids[:len(before)] == before else self._encode(text)

    def prompt(self, system_prompt: str, observation: str) -> tuple[list[int], str]:
        """Ids and text of the first context: system prompt and first observation."""
        observation = self._view(observation, True)
        if self.use_chat_template:
            if system_prompt and self.system_in_user:
                observation, system_prompt = system_prompt + "\n\n" + observation, ""
            messages = [{"role": "user", "content": observation}]
            if system_prompt:
                messages.insert(0, {"role": "system", "content": system_prompt})
            text = self._render(messages, True)
        else:
            text = (system_prompt + "\n\n" if system_prompt else "") + observation + "\n"
        return self._encode(text), text

    def observation(self, observation: str, action_ended_turn: bool, *,
                    ended_with: int | None = None, role: str = "user"
                    ) -> tuple[list[int], str]:
        """Ids and text appended after an action: close the turn if the model did not, then the
        observation (in ``role``: ``user`` or ``tool``), then whatever opens the next model
        turn. ``ended_with``: the stop id the reply ended on (None with
        ``action_ended_turn``: the template's own, as :meth:`reply` writes)."""
        if role not in ("user", "tool"):
            raise TemplateProblem(f"an observation's role must be 'user' or 'tool', got {role!r}")
        observation = self._view(observation, False)
        if self.use_chat_template:
            text = self._chat_delta(observation, action_ended_turn, ended_with,
                                    role if role in self._roles else "user")
            return self._encode_after(self.tokenizer.decode([self.end_of_turn_id]), text), text
        ids = [] if action_ended_turn else [self.eos_token_id]
        text = "\n" + observation + "\n"
        return ids + self._encode(text), text

    def _chat_delta(self, observation: str, action_ended_turn: bool, ended_with: int | None,
                    role: str) -> str:
        text = self._after_action([{"role": "user", "content": "u"},
                                   {"role": "assistant", "content": _ACTION},
                                   {"role": role, "content": observation}], True)
        sampled_closing = action_ended_turn and (ended_with is None
                                                 or ended_with == self.end_of_turn_id)
        closing = self.tokenizer.decode([self.end_of_turn_id])
        if sampled_closing and text.startswith(closing):
            text = text[len(closing):]
        return text

    def reply(self, text: str) -> list[int]:
        """Ids of a model reply as a policy samples it: the text's ids, then the end-of-turn
        id the template writes (eos without a template); supervised fine-tuning builds its
        contexts with this."""
        if self.use_chat_template:
            return self._encode_after(self._header, text) + [self.end_of_turn_id]
        return self._encode(text) + [self.end_of_turn_id]

    def decode_action(self, ids: list[int]) -> str:
        """The text an environment sees for a sampled action (special tokens dropped)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def template_report(self) -> dict[str, Any]:
        """Whether contexts built append-only equal the template's rendering of the whole
        conversation (``prefix_preserving``), found on a probe conversation (a system prompt,
        three observations, two replies with a reasoning block); with the first differing
        text when they do not. Without a template: ``{"template": False}``."""
        if not self.use_chat_template:
            return {"template": False}
        replies = [_PROBE_REASONING + "```Left```", _PROBE_REASONING + "```Up```"]
        observations = ["first observation", "second observation", "third observation"]
        ids, _ = self.prompt("the system prompt", observations[0])
        messages = [{"role": "system", "content": "the system prompt"},
                    {"role": "user", "content": observations[0]}]
        if self.system_in_user:
            messages = [{"role": "user", "content": "the system prompt\n\n" + observations[0]}]
        for reply, observation in zip(replies, observations[1:], strict=True):
            ids += self.reply(reply)
            ids += self.observation(observation, True)[0]
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": observation}]
        rendered = self._encode(self._render(messages, True))
        same = ids == rendered
        report: dict[str, Any] = {"template": True, "prefix_preserving": same,
                                  "end_of_turn": self.tokenizer.decode([self.end_of_turn_id]),
                                  "stop_token_ids": list(self.stop_token_ids),
                                  "roles": sorted(self._roles)}
        if not same:
            at = next((i for i, (a, b) in enumerate(zip(ids, rendered, strict=False))
                       if a != b), min(len(ids), len(rendered)))
            report["differs_at"] = at
            report["appended"] = self.tokenizer.decode(ids[at:at + 12])
            report["template_renders"] = self.tokenizer.decode(rendered[at:at + 12])
        return report
