"""A scripted stochastic coding agent: a :class:`treeroll.base.GenerationBackend` over
:class:`treeroll.formatting.ByteTokenizer` for tests and benchmarks without a language model.

It reads the task id from the context (``Task <id>`` in the first observation), looks the
task's reference fix up in its task set (it is a test fixture, not a solver), and acts by
phase: explore; localise the buggy file (probability ``localize``); fix it (``fix``), make a
wrong edit (``wrong_fix``, half of them syntax errors) or keep exploring; then run the tests and
submit (``submit``). With probability ``flail`` any turn repeats the previous action or
replies without a code block (a format error). Every choice is drawn from the request's
``seed``; the completion's logprobs spread the log-probability of the chosen branch evenly
over its tokens. Commands can be several hundred bytes: sample with ``max_new_tokens`` of
about 2000.
"""

from __future__ import annotations

import math
import random
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from treeroll.base import Completion, GenerationRequest, SamplingParams
from treeroll.envs.swe.tasks import SUBMIT_SENTINEL, SWETask, TaskSet
from treeroll.formatting import ByteTokenizer

__all__ = ["AgentSkill", "ScriptedSWEAgent"]

_FIX_MARK = "# treeroll-agent: fix"
_WRONG_MARK = "# treeroll-agent: attempt"
_TASK_ID = re.compile(r"Task (\S+?)[.\s]")


@dataclass(frozen=True)
class AgentSkill:
    """Probabilities that drive :class:`ScriptedSWEAgent`."""

    localize: float = 0.6
    """Per exploring turn: open the buggy file."""
    fix: float = 0.6
    """Per turn once localised: apply the reference fix."""
    wrong_fix: float = 0.25
    """Per turn once localised: make a wrong edit instead (else keep exploring)."""
    submit: float = 0.7
    """Per turn after an edit: submit (else run the tests first)."""
    flail: float = 0.1
    """Per turn: repeat the previous action or reply without an action."""

    def __post_init__(self) -> None:
        for name in ("localize", "fix", "wrong_fix", "submit", "flail"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability, got {getattr(self, name)}")
        if self.fix + self.wrong_fix > 1.0:
            raise ValueError("fix + wrong_fix must be <= 1")

    @classmethod
    def at(cls, skill: float) -> AgentSkill:
        """The agent at one overall ``skill`` in [0, 1] (the SWE expert of ``treeroll sft``):
        1 always localises, fixes, and submits after an edit, never flails; 0 explores at
        random, edits wrongly half the time once it has localised, and flails one turn in
        five."""
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill}")
        return cls(localize=0.3 + 0.7 * skill, fix=skill, wrong_fix=0.5 * (1 - skill),
                   submit=0.5 + 0.5 * skill, flail=0.2 * (1 - skill))


class ScriptedSWEAgent:
    """Plays SWE tasks without a model; drives :class:`SWEEnv` like any generation backend."""

    def __init__(self, tasks: TaskSet, *, convention: str = "mini",
                 skill: AgentSkill | None = None) -> None:
        if convention not in ("mini", "swe_agent"):
            raise ValueError(f"convention must be 'mini' or 'swe_agent', got {convention!r}")
        self.tasks = tasks
        self.convention = convention
        self.skill = skill or AgentSkill()
        self.tokenizer = ByteTokenizer()

    def reset_cache(self) -> None:
        """Nothing is cached (every prompt token is counted as prefilled)."""

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams,
                 ) -> list[Completion]:
        """One scripted reply per request, drawn with the request's seed."""
        out = []
        for request in requests:
            rng = random.Random(request.seed)
            text, probability = self.act(self.tokenizer.decode(list(request.prompt_ids)), rng)
            ids = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]
            limit = request.max_new_tokens or params.max_new_tokens
            finish = "stop"
            if len(ids) > limit:
                ids, finish = ids[:limit], "length"
            per_token = math.log(max(probability, 1e-12)) / len(ids)
            out.append(Completion(token_ids=ids, logprobs=[per_token] * len(ids),
                                  finish_reason=finish, prefill_tokens=len(request.prompt_ids),
                                  cached_tokens=0))
        return out

    # -- policy ------------------------------------------------------------------------------

    def act(self, context: str, rng: random.Random) -> tuple[str, float]:
        """Choose the next reply for ``context``; return it and its probability."""
        match = _TASK_ID.search(context)
        task = None
        if match:
            try:
                task = self.tasks.by_id(match.group(1))
            except KeyError:
                task = None
        if task is None:
            return self._wrap("ls"), 1.0
        skill = self.skill
        previous = self._actions(context)
        if previous and rng.random() < skill.flail:
            if rng.random() < 0.5:
                return previous[-1], skill.flail * 0.5
            return "I am not sure what to do next.", skill.flail * 0.5
        p = 1.0 - (skill.flail if previous else 0.0)
        buggy = task.buggy_files[0] if task.buggy_files else ""
        fixed = any(_FIX_MARK in a or "git apply" in a or "str_replace_editor str_replace" in a
                    for a in previous)
        edited = fixed or any(_WRONG_MARK in a for a in previous)
        localized = any(buggy and buggy in a for a in previous)
        if edited:
            if rng.random() < skill.submit:
                return self._submit(), p * skill.submit
            return self._wrap(self._test_command(task)), p * (1 - skill.submit)
        if localized:
            u = rng.random()
            if u < skill.fix:
                return self._fix(task), p * skill.fix
            if u < skill.fix + skill.wrong_fix:
                return self._wrong_fix(task, rng), p * skill.wrong_fix * 0.5
            p *= 1 - skill.fix - skill.wrong_fix
        elif rng.random() < skill.localize:
            if self.convention == "swe_agent":
                return self._wrap(f"str_replace_editor view {buggy}"), p * skill.localize
            return self._wrap(f"cat -n {buggy}"), p * skill.localize
        else:
            p *= 1 - skill.localize
        options = self._explore(task)
        return self._wrap(options[rng.randrange(len(options))]), p / len(options)

    def is_sound(self, reply: str, previous_replies: Sequence[str]) -> bool:
        """False for a reply this agent makes only out of noise: a wrong edit, a reply with
        no action, or a repeat of the previous reply."""
        return not (_WRONG_MARK in reply or "```" not in reply
                    or (bool(previous_replies) and reply == previous_replies[-1]))

    def _actions(self, context: str) -> list[str]:
        if self.convention == "mini":
            return [f"THOUGHT: next step.\n\n```bash\n{c}\n```"
                    for c in re.findall(r"```bash\s*\n(.*?)\n```", context, re.DOTALL)]
        return [f"THOUGHT: next step.\n\n```\n{c}\n```"
                for c in re.findall(r"```[ \t]*\n(.*?)\n```", context, re.DOTALL)]

    def _wrap(self, command: str) -> str:
        fence = "```bash" if self.convention == "mini" else "```"
        return f"THOUGHT: next step.\n\n{fence}\n{command}\n```"

    def _submit(self) -> str:
        if self.convention == "mini":
            return self._wrap(f"echo {SUBMIT_SENTINEL}")
        return self._wrap("submit")

    @staticmethod
    def _test_command(task: SWETask) -> str:
        files = sorted({t.split("::")[0] for t in task.fail_to_pass})
        return ("python -m pytest -q -x -p no:cacheprovider " + " ".join(files)
                + " 2>&1 | tail -15")

    def _explore(self, task: SWETask) -> list[str]:
        files = sorted({t.split("::")[0] for t in task.fail_to_pass})
        return ["ls -R | head -40", "grep -rn 'def ' --include=*.py . | head -40",
                self._test_command(task), f"cat {files[0]}" if files else "git status",
                "git status && git diff"]

    def _fix(self, task: SWETask) -> str:
        if task.reference_patch:
            return self._wrap(f"git apply <<'TREEROLL_EOF'\n{task.reference_patch.rstrip()}\n"
                              "TREEROLL_EOF")
        edits = task.fix_edits
        if self.convention == "swe_agent" and len(edits) == 1:
            edit = edits[0]
            return self._wrap(f"str_replace_editor str_replace {edit.file} --old_str "
                              f"{shlex.quote(edit.old)} --new_str {shlex.quote(edit.new)}")
        lines = [_FIX_MARK, "import pathlib"]
        for edit in edits:
            lines += [f"p = pathlib.Path({edit.file!r})",
                      f"p.write_text(p.read_text().replace({edit.old!r}, {edit.new!r}, 1))"]
        body = "\n".join(lines)
        return self._wrap(f"python - <<'TREEROLL_EOF'\n{body}\nTREEROLL_EOF")

    def _wrong_fix(self, task: SWETask, rng: random.Random) -> str:
        buggy = task.buggy_files[0]
        insert = "if True\n" if rng.random() < 0.5 else "# TODO: revisit this\n"
        if self.convention == "swe_agent":
            return self._wrap(f"str_replace_editor insert {buggy} --insert_line 0 --new_str "
                              f"{shlex.quote(insert.rstrip() + '  ' + _WRONG_MARK)}")
        script = (f"{_WRONG_MARK}\nimport pathlib\np = pathlib.Path({buggy!r})\n"
                  f"p.write_text({insert!r} + p.read_text())")
        return self._wrap(f"python - <<'TREEROLL_EOF'\n{script}\nTREEROLL_EOF")
