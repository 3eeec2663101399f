"""A forkable coding-agent environment over SWE tasks, in mini-swe-agent's or SWE-agent's
action convention.

``convention="mini"`` (mini-swe-agent): every reply holds exactly one fenced ```bash block
with one command; edits happen through shell commands; a command whose output's first line is
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` submits. A JSON tool call
``{"name": "bash", "arguments"|"parameters": {"command": ...}}`` is accepted too.

``convention="swe_agent"`` (SWE-agent): one fenced block (or one ``<tool_call>`` JSON) holding
``str_replace_editor view|create|str_replace|insert|undo_edit PATH [--old_str S] [--new_str S]
[--file_text S] [--insert_line N] [--view_range A B]`` (shell quoting), ``submit``, or any
other bash command.

Reward: 1.0 on the submitting step if every FAIL_TO_PASS and PASS_TO_PASS test passes in a
fresh copy of the submitted tree with the task's tests restored, else 0.0 (also when the
tree's code stopped the tests before they finished: ``info["scoring_incomplete"]`` says
how). Only a failure of treeroll's own (``ScoringError``: no pytest, the sandbox failing)
raises out of ``step``, and the engine marks that node failed. The step limit truncates
(reward 0, not evaluated), so does the consecutive format-error limit.
"""

from __future__ import annotations

import functools
import json
import random
import shlex
import subprocess
import sys
import warnings
import weakref
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from treeroll.base import ExpertReply, StepResult
from treeroll.envs.swe.actions import ParsedAction, parse_action
from treeroll.envs.swe.editor import EDITOR_SCRIPT
from treeroll.envs.swe.sandbox import (
    CommandResult,
    Sandbox,
    SandboxLimits,
    Workspace,
    sandbox_python,
)
from treeroll.envs.swe.tasks import SUBMIT_SENTINEL, SWETask, TaskSet, builtin_tasks, evaluate

__all__ = ["SUBMIT_SENTINEL", "SWEEnv", "SWEEnvConfig", "check_can_score", "make_swe_env"]


_CONVENTIONS = ("mini", "swe_agent")


@dataclass(frozen=True)
class SWEEnvConfig:
    """Settings of :class:`SWEEnv` (limits of the sandbox are in ``limits``)."""

    convention: str = "mini"
    """``"mini"`` (one bash block per reply) or ``"swe_agent"`` (str_replace_editor + submit)."""
    step_limit: int = 30
    """Replies per episode; the episode is truncated (reward 0) when it is reached."""
    command_timeout_s: float = 30.0
    """Wall-clock limit of one command."""
    max_format_errors: int = 3
    """Consecutive unparsable replies that truncate the episode."""
    output_limit_chars: int = 10_000
    """Longer outputs are shown as head and tail with the number of elided characters."""
    eval_timeout_s: float = 120.0
    """Wall-clock limit of the final test run."""
    temp_root: str | None = None
    """Where working trees live (default: the system temporary directory)."""
    isolation: str = "auto"
    """Sandbox mode: ``"auto"``, ``"overlay"`` or ``"copy"`` (see ``sandbox.py``)."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    """Per-command resource limits (the wall timeout is ``command_timeout_s``)."""
    tools: tuple[str, ...] = ()
    """Host paths commands may also read and run in overlay mode (a repository's own
    interpreter or toolchain); the system directories and treeroll's Python are always
    there, nothing else of the host is."""
    allow_host_access: bool = False
    """Run even where only copy mode works (not root, no namespaces or overlayfs), whose
    commands read and write the host's files as this user: a policy being trained can find
    the gold fix or write outside its task there. Refused unless set."""

    def __post_init__(self) -> None:
        if self.convention not in _CONVENTIONS:
            raise ValueError(f"convention must be one of {_CONVENTIONS}, got {self.convention!r}")
        if self.step_limit < 1 or self.max_format_errors < 1:
            raise ValueError("step_limit and max_format_errors must be >= 1")
        if self.command_timeout_s <= 0 or self.eval_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if self.output_limit_chars < 100:
            raise ValueError("output_limit_chars must be >= 100 so that an observation says "
                             "something")


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------

_MINI_SYSTEM = f"""You are a helpful assistant that can interact with a computer shell to solve \
programming tasks.
Your response must contain exactly ONE bash code block with ONE command (or commands connected \
with && or ||). Include a THOUGHT section before your command explaining your reasoning.
Format your response as shown:

THOUGHT: Your reasoning and analysis here

```bash
your_command_here
```

Each command runs in a new subshell in the repository; directory or environment changes are \
not persistent. There is no network. Edit files with shell commands (sed, cat <<'EOF', python). \
When you are done, submit with exactly: echo {SUBMIT_SENTINEL}"""

_SWE_AGENT_SYSTEM = """You are a software engineering agent working in a repository through \
tools. Reply with a short thought followed by exactly ONE fenced code block holding ONE action:
- a bash command, e.g. ```\ngrep -rn "def parse" .\n```
- str_replace_editor <view|create|str_replace|insert|undo_edit> <path> [--old_str 'S'] \
[--new_str 'S'] [--file_text 'S'] [--insert_line N] [--view_range A B]  (shell quoting; \
multi-line strings in single quotes)
- submit  (when the fix is complete)
A JSON tool call <tool_call>{"name": ..., "arguments": {...}}</tool_call> is accepted instead \
of a code block. There is no network."""


class SWEEnv:
    """A coding task in a sandboxed working tree; implements :class:`treeroll.base.Env`.

    ``fork()`` shares the task set, configuration and sandbox and copies the working tree
    (only the branch's edited files in overlay mode), the counters and the undo history.
    Working trees are deleted by :meth:`close` or when the environment is garbage collected.
    """

    def __init__(self, tasks: TaskSet | None = None, config: SWEEnvConfig | None = None, *,
                 sandbox: Sandbox | None = None) -> None:
        self.tasks = tasks if tasks is not None else builtin_tasks()
        self.config = config or SWEEnvConfig()
        if sandbox is None:
            sandbox = Sandbox(self.config.temp_root, self.config.limits,
                              isolation=self.config.isolation, tools=self.config.tools)
        self.sandbox = sandbox
        check_can_score()
        _announce_mode(sandbox.mode)
        if sandbox.mode == "copy":
            if not self.config.allow_host_access:
                raise RuntimeError(
                    "the SWE sandbox can only run in copy mode here (it needs root, unshare "
                    "and overlayfs for its closed root): commands would read and write this "
                    "user's files outside the task, which a learning policy can find; run as "
                    "root, or accept it with allow_host_access=True (--env.options "
                    "allow_host_access true)")
            _warn_copy_mode()
        self.system_prompt = (_MINI_SYSTEM if self.config.convention == "mini"
                              else _SWE_AGENT_SYSTEM)
        self.task: SWETask | None = None
        self.workspace: Workspace | None = None
        self.steps = 0
        self.format_errors = 0
        """Format errors so far in the episode (all of them, not only consecutive ones)."""
        self.consecutive_format_errors = 0
        self.history: list[str] = []
        """Every parsed action of the episode as text (``bash: ...``, ``editor: ...``)."""
        self.transcript: list[str] = []
        """The first observation and every raw reply so far (what the expert reads)."""
        self.done = False
        self.success = False
        self.submitted = False
        """True once the agent submitted (the episode then ended)."""
        self._undo: dict[str, list[str | None]] = {}
        self._finalizer: weakref.finalize | None = None

    # -- Env protocol ------------------------------------------------------------------------

    def reset(self, seed: int) -> str:
        """Start the task ``tasks.for_seed(seed)`` in a fresh working tree."""
        self._drop_workspace()
        self.task = self.tasks.for_seed(seed)
        base = self.sandbox.base(f"task:{self.task.task_id}", self.task.build)
        self._set_workspace(self.sandbox.workspace(base))
        self.steps = self.format_errors = self.consecutive_format_errors = 0
        self.history = []
        self.done = self.success = self.submitted = False
        self._undo = {}
        assert self.workspace is not None
        self.transcript = [self._first_observation()]
        return self.transcript[0]

    def _first_observation(self) -> str:
        assert self.workspace is not None and self.task is not None
        # copy mode gives every branch its own directory: name none, so reset stays
        # deterministic in the seed (commands start in the tree either way)
        where = self.workspace.path if self.sandbox.mode == "overlay" else "."
        if self.config.convention == "mini":
            return (f"<pr_description>\nTask {self.task.public_id}. Consider the following PR "
                    f"description:\n{self.task.problem_statement}\n</pr_description>\n\n"
                    f"The repository is checked out at {where} (your working directory). Make "
                    "changes to non-test files so that the issue is resolved, then submit with "
                    f"`echo {SUBMIT_SENTINEL}`.")
        return (f"<uploaded_files>\n{where}\n</uploaded_files>\nTask {self.task.public_id}. "
                f"I've uploaded a python code repository in the directory {where}. Consider the "
                f"following issue:\n<issue>\n{self.task.problem_statement}\n</issue>\n\n"
                "Make the minimal changes to non-test files needed to resolve the issue, then "
                "call `submit`.")

    def step(self, action: str) -> StepResult:
        """Run one reply: a command, an editor call, a submission, or a format error."""
        if self.done or self.workspace is None or self.task is None:
            return ("The episode has ended; call reset().", 0.0, True, False,
                    {"success": self.success, "format_error": False})
        try:
            parsed = parse_action(action if isinstance(action, str) else str(action),
                                  self.config.convention)
        except Exception as err:  # never raise on model text
            parsed = ParsedAction("error", error=f"Could not parse the reply: {err}")
        self.transcript.append(action if isinstance(action, str) else str(action))
        self.steps += 1
        info: dict[str, Any] = {"success": False, "format_error": parsed.kind == "error",
                                "action_kind": parsed.kind, "steps": self.steps}
        if parsed.kind == "error":
            self.format_errors += 1
            self.consecutive_format_errors += 1
            info["format_errors"] = self.format_errors
            truncated = (self.consecutive_format_errors >= self.config.max_format_errors
                         or self.steps >= self.config.step_limit)
            if truncated:
                self.done = True
                info["stop_reason"] = "format_errors" if self.consecutive_format_errors \
                    >= self.config.max_format_errors else "step_limit"
            return parsed.error, 0.0, False, truncated, info
        self.consecutive_format_errors = 0
        if parsed.kind == "submit":
            self.history.append("submit")
            return self._submit(info, "Submitted.")
        if parsed.kind == "editor":
            self.history.append(f"editor: {json.dumps(parsed.arguments, sort_keys=True)}")
            observation = self._editor(parsed.arguments)
        else:
            self.history.append(f"bash: {parsed.command}")
            result = self.sandbox.run(self.workspace, parsed.command,
                                      timeout_s=self.config.command_timeout_s)
            info.update(returncode=result.returncode, timed_out=result.timed_out,
                        quota_exceeded=result.quota_exceeded, command_seconds=result.seconds)
            if self.config.convention == "mini" and \
                    result.output.lstrip().splitlines()[:1] == [SUBMIT_SENTINEL]:
                return self._submit(info, result.output.lstrip()[len(SUBMIT_SENTINEL):].strip())
            observation = self._format(parsed.command, result)
        truncated = self.steps >= self.config.step_limit
        if truncated:
            self.done = True
            info["stop_reason"] = "step_limit"
        return observation, 0.0, False, truncated, info

    def expert_reply(self, rng: np.random.Generator, skill: float = 1.0, *,
                     explain: bool | str = False, safe_moves: bool = False) -> ExpertReply:
        """The scripted agent's next reply (implements :class:`treeroll.base.ExpertEnv`).

        The agent (:class:`treeroll.envs.swe.ScriptedSWEAgent`) reads this episode's
        transcript and acts by phase; ``skill`` sets its probabilities (``AgentSkill.at``):
        at 1 it localises, applies the reference fix, runs the tests and submits. A wrong
        edit or a flailing reply (a repeat or no action) is marked ``is_expert=False``.
        The agent always opens with a ``THOUGHT:`` line, so ``explain`` changes nothing;
        it has no list of safe moves (``safe_moves`` is refused).
        """
        if safe_moves:
            raise ValueError("the SWE tasks' scripted agent cannot list safe moves "
                             "(safe_moves / data.explain_safe_moves is FrozenLake's)")
        from treeroll.envs.swe.agent import AgentSkill, ScriptedSWEAgent

        if self.task is None:
            raise RuntimeError("call reset(seed) before expert_reply()")
        agent = ScriptedSWEAgent(self.tasks, convention=self.config.convention,
                                 skill=AgentSkill.at(skill))
        text, _ = agent.act("\n".join(self.transcript),
                            random.Random(int(rng.integers(2**63))))
        return ExpertReply(text, is_expert=agent.is_sound(text, self.transcript[1:]))

    def fork(self) -> SWEEnv:
        """An independent copy that continues exactly as this environment would."""
        child = SWEEnv(self.tasks, self.config, sandbox=self.sandbox)
        child.task = self.task
        if self.workspace is not None:
            child._set_workspace(self.workspace.fork())
        child.steps, child.format_errors = self.steps, self.format_errors
        child.consecutive_format_errors = self.consecutive_format_errors
        child.history = list(self.history)
        child.transcript = list(self.transcript)
        child.done, child.success, child.submitted = self.done, self.success, self.submitted
        child._undo = {path: list(stack) for path, stack in self._undo.items()}
        return child

    def close(self) -> None:
        """Delete this environment's working tree (the shared sandbox stays for its forks)."""
        self._drop_workspace()

    # -- helpers -----------------------------------------------------------------------------

    def _set_workspace(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self._finalizer = weakref.finalize(self, workspace.remove)

    def _drop_workspace(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer = None
        self.workspace = None

    def _submit(self, info: dict[str, Any], message: str) -> StepResult:
        assert self.workspace is not None and self.task is not None
        details: dict[str, Any] = {}
        results = evaluate(self.sandbox, self.workspace, self.task,
                           timeout_s=self.config.eval_timeout_s, details=details)
        self.success = bool(results) and all(results.values())
        self.done = self.submitted = True
        info.update(success=self.success, submitted=True,
                    tests_passed=sum(results.values()), tests_total=len(results))
        if "incomplete" in details:  # the tree's code stopped the tests: a 0, not an error
            info["scoring_incomplete"] = details["incomplete"]
        verdict = "all target tests pass" if self.success else \
            f"{len(results) - sum(results.values())} of {len(results)} target tests fail"
        return (f"{message}\nSubmission evaluated: {verdict}.", float(self.success), True,
                False, info)

    def _editor(self, arguments: dict[str, Any]) -> str:
        assert self.workspace is not None
        args = dict(arguments)
        path = str(args["path"])
        if args["command"] == "undo_edit":
            stack = self._undo.get(path)
            if not stack:
                return f"No edit history found for {path}."
            previous = stack.pop()
            reply = self._run_editor({"command": "write", "path": path, "content": previous})
            return f"Last edit to {path} undone successfully." if reply.get("ok") else \
                str(reply.get("output", "undo failed"))
        reply = self._run_editor(args)
        if reply.get("ok") and args["command"] in ("create", "str_replace", "insert"):
            self._undo.setdefault(path, []).append(reply.get("previous"))
        return str(reply.get("output", ""))

    def _run_editor(self, args: dict[str, Any]) -> dict[str, Any]:
        assert self.workspace is not None
        result = self.sandbox.run(self.workspace, f"python -I -S -c {shlex.quote(EDITOR_SCRIPT)}",
                                  stdin=json.dumps(args), timeout_s=self.config.command_timeout_s)
        try:
            reply = json.loads(result.output.strip().splitlines()[-1])
            return reply if isinstance(reply, dict) else {"output": str(reply)}
        except (json.JSONDecodeError, IndexError, RecursionError):  # nested past the parser
            return {"ok": False, "output": f"str_replace_editor failed: {result.output[-500:]}"
                    + (" (timed out)" if result.timed_out else "")}

    def _format(self, command: str, result: CommandResult) -> str:
        limit = self.config.output_limit_chars
        output = result.output
        if result.error:
            return f"The sandbox could not run the command: {result.error}"
        notes = []
        if result.timed_out:
            notes.append(f"The command timed out after {self.config.command_timeout_s:g} s and "
                         "was killed with everything it started. Avoid commands that wait for "
                         "input or run forever.")
        if result.quota_exceeded:
            limits = self.sandbox.limits
            notes.append(f"The working tree exceeded its disk quota ({result.quota}; it may hold "
                         f"{limits.disk_quota_mb} MB, {limits.max_tree_entries} files and "
                         f"folders, {limits.max_tree_depth} levels): the command was killed, "
                         "what it created deleted and the files it changed put back.")
        if result.returncode < 0 and not result.timed_out and not result.quota_exceeded:
            notes.append(f"The command was killed by signal {-result.returncode} (resource "
                         "limits: CPU time, memory, processes, file size).")
        elided = result.elided_bytes
        if len(output) > limit or elided:
            half = limit // 2
            elided += max(0, len(output) - 2 * half)
            body = (f"<warning>\nThe output of your last command was too long.\nPlease try a "
                    f"different command that produces less output.\n</warning>\n"
                    f"<output_head>\n{output[:half]}\n</output_head>\n<elided_chars>\n"
                    f"{elided} characters elided\n</elided_chars>\n<output_tail>\n"
                    f"{output[-half:]}\n</output_tail>")
        else:
            body = f"<output>\n{output}</output>"
        head = "\n".join(f"<warning>{note}</warning>" for note in notes)
        return (head + "\n" if head else "") + \
            f"<returncode>{result.returncode}</returncode>\n{body}"


@functools.cache
def _announce_mode(mode: str) -> None:
    """Say once per process which sandbox mode runs (every command that builds the
    environment, ``train``, ``eval`` and ``rollout`` alike, prints it on stderr)."""
    what = ("a closed root: nothing of the host is readable or writable, limits per command"
            if mode == "overlay" else
            "uncontained: commands read and write this user's files outside the task")
    print(f"treeroll: the SWE sandbox runs in {mode} mode ({what})", file=sys.stderr)


@functools.cache
def _warn_copy_mode() -> None:
    """Say once per process that commands run uncontained (copy mode)."""
    warnings.warn("the SWE sandbox runs in copy mode (not root, or no namespaces or "
                  "overlayfs here): commands can read and write what this user can outside "
                  "the task's tree, and processes that leave their session survive (README, "
                  "*Environments*); train a policy only in overlay mode", stacklevel=3)


@functools.cache
def check_can_score(python: str | None = None) -> None:
    """Refuse, before any episode, a sandbox whose Python cannot import pytest: every
    submission would otherwise fail to be scored (the tests never run)."""
    python = python or sandbox_python()
    done = subprocess.run([python, "-c", "import pytest"], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"the SWE environment scores with pytest, which {python} (the "
                           "Python its sandbox runs) cannot import: install it there (pip "
                           "install pytest, or pip install 'treeroll[test]')")


def make_swe_env(convention: str = "mini", tasks: TaskSet | None = None, *,
                 sandbox: Sandbox | None = None, **settings: Any) -> SWEEnv:
    """Build an :class:`SWEEnv`; ``settings`` are :class:`SWEEnvConfig` fields or
    :class:`SandboxLimits` fields (e.g. ``step_limit=20, memory_mb=1024``)."""
    config_names = {f.name for f in fields(SWEEnvConfig)}
    limit_names = {f.name for f in fields(SandboxLimits)}
    unknown = set(settings) - config_names - limit_names
    if unknown:
        raise TypeError(f"unknown settings {sorted(unknown)}; valid: "
                        f"{sorted(config_names | limit_names)}")
    limits = SandboxLimits(**{k: v for k, v in settings.items() if k in limit_names})
    config = SWEEnvConfig(convention=convention, limits=limits,
                          **{k: v for k, v in settings.items() if k in config_names})
    return SWEEnv(tasks, config, sandbox=sandbox)
