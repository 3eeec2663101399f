"""Watching one sandboxed command once it has started: feed its stdin, keep the head and tail
of its output, poll its working tree's disk quota, kill its process group at the wall
timeout or when the quota is exceeded, and report a :class:`CommandResult`.

:meth:`treeroll.envs.swe.sandbox.Sandbox.run` starts the command (its argv, environment and
child setup depend on the sandbox's mode) and hands it to :func:`watch`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Protocol

from treeroll.envs.swe.sandbox_limits import SandboxLimits

__all__ = ["CommandResult", "WatchedTree", "watch"]


@dataclass
class CommandResult:
    """What one sandboxed command did."""

    output: str
    """stdout and stderr interleaved (head and tail kept when longer than ``capture_bytes``)."""
    returncode: int
    timed_out: bool = False
    quota_exceeded: bool = False
    quota: str = ""
    """Which limit of the tree's quota the command broke, in words ("" when none)."""
    elided_bytes: int = 0
    """Output bytes dropped from the middle of ``output``."""
    seconds: float = 0.0
    error: str = ""
    """Why the sandbox itself could not run the command (empty when it ran)."""


class WatchedTree(Protocol):
    """What :func:`watch` uses of the working tree a command runs in (a
    :class:`~treeroll.envs.swe.sandbox.Workspace`)."""

    def over_quota(self) -> str:
        """Which limit of its quota the tree passes, in words ("" when none)."""
        ...

    def undo(self, before: set[str], since_ns: int) -> None:
        """Take back what a command did to the tree since ``since_ns`` (``before``: a listing
        of the tree's own files taken before it)."""
        ...


def watch(proc: subprocess.Popen[bytes], workspace: WatchedTree, limits: SandboxLimits, *,
          stdin: str | None, before: set[str], start: float, timeout: float,
          since_ns: int = 0) -> CommandResult:
    """Feed ``stdin`` to the started ``proc`` and read its output until it ends, the wall
    ``timeout`` (seconds after ``start``, a ``time.perf_counter()`` reading) passes, or
    ``workspace`` breaks its quota (``disk_quota_mb`` of apparent size, ``max_tree_entries``,
    ``max_tree_depth``; polled every 0.2 s, and once more at the end). At the timeout or
    the quota its process group is killed; it is then waited for (and killed after 10 s
    more), and when the quota was broken what it did to the tree is taken back
    (``workspace.undo(before, since_ns)``: ``before`` a listing of the tree, ``since_ns``
    a ``time.time_ns()`` reading taken before it started). Never raises for the command's
    own failures."""
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.write(stdin.encode())
        with contextlib.suppress(OSError):
            proc.stdin.close()
    assert proc.stdout is not None
    fd, output = proc.stdout.fileno(), _Output(limits.capture_bytes // 2)
    timed_out, quota = False, ""
    deadline, next_quota = start + timeout, start + 0.2
    while True:
        now = time.perf_counter()
        if now >= deadline:
            timed_out = True
            break
        if now >= next_quota:
            next_quota = now + 0.2
            quota = workspace.over_quota()
            if quota:
                break
        ready, _, _ = select.select([fd], [], [], min(0.05, deadline - now))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        output.add(chunk)
    returncode = _ended(proc, kill=timed_out or bool(quota))
    proc.stdout.close()
    quota = quota or workspace.over_quota()
    if quota:
        workspace.undo(before, since_ns)
    return CommandResult(output=output.text(), returncode=returncode, timed_out=timed_out,
                         quota_exceeded=bool(quota), quota=quota, elided_bytes=output.elided,
                         seconds=time.perf_counter() - start)


class _Output:
    """A command's output as its first and last ``keep`` bytes, with how many were elided."""

    def __init__(self, keep: int) -> None:
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(self.head) < self.keep:
            take = self.keep - len(self.head)
            self.head += chunk[:take]
            chunk = chunk[take:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    @property
    def elided(self) -> int:
        return max(0, self.total - len(self.head) - len(self.tail))

    def text(self) -> str:
        text = self.head.decode("utf-8", errors="replace")
        if self.tail:
            if self.elided:
                text += f"\n[... {self.elided} bytes of output elided ...]\n"
            text += self.tail.decode("utf-8", errors="replace")
        return text


def _ended(proc: subprocess.Popen[bytes], *, kill: bool) -> int:
    """``proc``'s exit code, its process group killed first when ``kill`` (and killed after
    10 s more of waiting in any case)."""
    if kill:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
