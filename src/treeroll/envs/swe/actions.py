"""Reading an agent's reply as one action, in mini-swe-agent's or SWE-agent's convention
(:func:`parse_action`): a fenced ``bash`` block, a ``<tool_call>`` JSON, a
``str_replace_editor`` line, or ``submit``. The environment that runs it is
:mod:`treeroll.envs.swe.env`."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from treeroll.envs.swe.editor import EDITOR_COMMANDS
from treeroll.envs.swe.tasks import SUBMIT_SENTINEL

__all__ = ["ParsedAction", "parse_action"]


@dataclass(frozen=True)
class ParsedAction:
    """What a reply asks for: ``kind`` is ``bash``, ``editor``, ``submit`` or ``error``."""

    kind: str
    command: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""


_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
_ANY_BLOCK = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n(.*?)\n?```", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _tool_call(text: str) -> dict[str, Any] | None:
    try:
        call = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return {"name": call["name"], "arguments": args if isinstance(args, dict) else {}}


def _from_tool_call(call: dict[str, Any], convention: str) -> ParsedAction:
    name, args = call["name"], call["arguments"]
    if name == "bash" and isinstance(args.get("command"), str):
        return ParsedAction("bash", command=args["command"])
    if convention == "swe_agent" and name == "submit":
        return ParsedAction("submit")
    if convention == "swe_agent" and name == "str_replace_editor":
        return _editor_arguments(args)
    allowed = "bash" if convention == "mini" else "bash, str_replace_editor, submit"
    return ParsedAction("error", error=f"Unknown tool {name!r} or bad arguments; tools: {allowed}.")


def _editor_arguments(args: dict[str, Any]) -> ParsedAction:
    command = args.get("command")
    if command not in EDITOR_COMMANDS or not isinstance(args.get("path"), str):
        return ParsedAction("error", error="str_replace_editor needs a command (one of "
                            f"{', '.join(EDITOR_COMMANDS)}) and a path.")
    return ParsedAction("editor", command=str(command), arguments=dict(args))


def _parse_editor_line(text: str) -> ParsedAction:
    try:
        tokens = shlex.split(text, posix=True)
    except ValueError as err:
        return ParsedAction("error", error=f"Could not parse the str_replace_editor call ({err}); "
                            "quote multi-line arguments with single quotes.")
    if len(tokens) < 3:
        return ParsedAction("error", error="Usage: str_replace_editor <command> <path> "
                            "[--old_str S] [--new_str S] [--file_text S] [--insert_line N] "
                            "[--view_range A B]")
    args: dict[str, Any] = {"command": tokens[1], "path": tokens[2]}
    rest = tokens[3:]
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag == "--view_range":
            try:
                args["view_range"] = [int(rest[i + 1]), int(rest[i + 2])]
            except (ValueError, IndexError):
                return ParsedAction("error", error="--view_range takes two integers")
            i += 3
            continue
        if flag in ("--old_str", "--new_str", "--file_text", "--insert_line") and i + 1 < len(rest):
            args[flag[2:]] = rest[i + 1]
            i += 2
            continue
        return ParsedAction("error", error=f"Unknown or incomplete argument {flag!r}.")
    if "insert_line" in args:
        try:
            args["insert_line"] = int(args["insert_line"])
        except ValueError:
            return ParsedAction("error", error="--insert_line takes an integer")
    return _editor_arguments(args)


def parse_action(text: str, convention: str) -> ParsedAction:
    """Parse one model reply; never raises (an unparsable reply is ``kind="error"``)."""
    calls = [c for c in (_tool_call(m) for m in _TOOL_CALL.findall(text)) if c is not None]
    if convention == "mini":
        blocks = _BASH_BLOCK.findall(text)
        if len(blocks) == 1 and not calls:
            return ParsedAction("bash", command=blocks[0].strip())
        if not blocks and len(calls) == 1:
            return _from_tool_call(calls[0], convention)
        return ParsedAction("error", error=(
            f"Please always provide EXACTLY ONE action in triple backticks, found "
            f"{len(blocks) + len(calls)} actions.\nIf you want to end the task, please issue "
            f"the following command: `echo {SUBMIT_SENTINEL}`\nwithout any other command."))
    blocks = _ANY_BLOCK.findall(text)
    if len(calls) == 1 and not blocks:
        return _from_tool_call(calls[0], convention)
    if len(blocks) == 1 and not calls:
        language, body = blocks[0]
        body = body.strip()
        if language == "json" and (call := _tool_call(body)) is not None:
            return _from_tool_call(call, convention)
        if body == "submit":
            return ParsedAction("submit")
        if body.startswith("str_replace_editor"):
            return _parse_editor_line(body)
        if body:
            return ParsedAction("bash", command=body)
    return ParsedAction("error", error=(
        f"Your reply must contain exactly one action (found {len(blocks) + len(calls)}): one "
        "fenced code block holding a bash command, a `str_replace_editor ...` call, or "
        "`submit`."))
