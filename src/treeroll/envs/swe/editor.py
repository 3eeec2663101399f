"""The ``str_replace_editor`` tool of SWE-agent's convention, as a script that runs inside
the sandbox (standard library only, started with ``python -I -S``; its arguments arrive as
JSON on stdin, its reply is one JSON line): ``view``, ``create``, ``str_replace``, ``insert``,
and ``write`` (the environment's undo). :class:`~treeroll.envs.swe.env.SWEEnv` runs it.
"""

from __future__ import annotations

__all__ = ["EDITOR_COMMANDS", "EDITOR_SCRIPT"]

EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
"""The editor's commands an agent may call (``undo_edit`` is the environment's own)."""

EDITOR_SCRIPT = r'''
import json, os, sys
a = json.loads(sys.stdin.read())
cmd, path = a["command"], a["path"]
out = {"ok": False, "previous": None, "output": ""}
def numbered(text, start=1):
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start))
def snippet(text, line, extra=4):
    lines = text.split("\n")
    lo = max(0, line - extra - 1)
    return numbered("\n".join(lines[lo:line + extra]), lo + 1)
def done(msg, ok=True, previous=None):
    out.update(output=msg, ok=ok, previous=previous)
    print(json.dumps(out)); sys.exit(0)
try:
    if cmd == "write":  # undo support
        if a["content"] is None:
            os.remove(path)
        else:
            open(path, "w").write(a["content"])
        done("ok")
    if cmd == "create":
        if os.path.exists(path):
            done(f"File already exists at: {path}. Cannot overwrite files using command "
                 "`create`.", False)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        open(path, "w").write(a.get("file_text", ""))
        done(f"File created successfully at: {path}", True, None)
    if not os.path.exists(path):
        done(f"The path {path} does not exist. Please provide a valid path.", False)
    if os.path.isdir(path):
        if cmd != "view":
            done(f"The path {path} is a directory and only the `view` command can be used on "
                 "directories.", False)
        items = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            depth = os.path.relpath(root, path).count(os.sep)
            if depth >= 1:
                dirs[:] = []
            for name in sorted(dirs + [f for f in files if not f.startswith(".")]):
                items.append(os.path.join(root, name))
        done(f"Here's the files and directories up to 2 levels deep in {path}, excluding "
             "hidden items:\n" + "\n".join([path] + items))
    text = open(path).read()
    if cmd == "view":
        lines = text.split("\n")
        lo, hi = 1, len(lines)
        if a.get("view_range"):
            lo, hi = a["view_range"]
            hi = len(lines) if hi == -1 else hi
            if not 1 <= lo <= len(lines) or hi < lo:
                done(f"Invalid view_range {a['view_range']}: the file has {len(lines)} lines.",
                     False)
        done(f"Here's the result of running `cat -n` on {path}:\n"
             + numbered("\n".join(lines[lo - 1:hi]), lo))
    if cmd == "str_replace":
        old, new = a.get("old_str"), a.get("new_str", "")
        if not old:
            done("Parameter `old_str` is required for command: str_replace", False)
        count = text.count(old)
        if count == 0:
            done(f"No replacement was performed, old_str `{old}` did not appear verbatim in "
                 f"{path}.", False)
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text.split("\n")) if old.split("\n")[0] in line]
            done(f"No replacement was performed. Multiple occurrences of old_str `{old}` in "
                 f"lines {lines}. Please ensure it is unique", False)
        line = text.split(old)[0].count("\n") + 1
        updated = text.replace(old, new)
        open(path, "w").write(updated)
        done(f"The file {path} has been edited. Here's the result of running `cat -n` on a "
             f"snippet of {path}:\n" + snippet(updated, line + new.count("\n"))
             + "\nReview the changes and make sure they are as expected. Edit the file again "
             "if necessary.", True, text)
    if cmd == "insert":
        at, new = a.get("insert_line"), a.get("new_str")
        lines = text.split("\n")
        if new is None or not isinstance(at, int) or not 0 <= at <= len(lines):
            done(f"Invalid `insert_line` parameter: {at}. It should be within the range of "
                 f"lines of the file: [0, {len(lines)}]", False)
        updated = "\n".join(lines[:at] + new.split("\n") + lines[at:])
        open(path, "w").write(updated)
        done(f"The file {path} has been edited. Here's the result of running `cat -n` on a "
             f"snippet of the edited file:\n" + snippet(updated, at + 1)
             + "\nReview the changes and make sure they are as expected (correct indentation, "
             "no duplicate lines, etc). Edit the file again if necessary.", True, text)
    done(f"Unknown command {cmd}", False)
except (OSError, UnicodeDecodeError) as err:
    done(f"Error: {err}", False)
'''
