"""Limits that hold for a sandboxed command and everything it starts, through cgroups.

An rlimit bounds one process: three processes of 1.5 GiB each fit under a 4 GiB
``RLIMIT_AS``, and ``RLIMIT_NPROC`` counts every process of the sandbox user on the host.
A command's own control group bounds the whole tree it starts: its memory (``memory.max`` in
cgroup v2, ``memory.limit_in_bytes`` in v1; the kernel kills inside the group when it is
exceeded) and its number of processes (``pids.max``). treeroll uses cgroup v2 where the
unified hierarchy has the memory and pids controllers enabled for its children, else the v1
``memory`` and ``pids`` hierarchies, else nothing (``CgroupSupport.reason`` says why, and
``Sandbox.containment`` reports it).

Written here because no library creates, joins and removes a cgroup from a ``preexec_fn``
(the join must happen in the child before it execs, and before it enters the sandbox's
closed root, where ``/sys`` does not exist: the child writes its pid through descriptors the
parent opened).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CgroupSupport", "CommandGroup", "cgroup_support"]

_ROOT = Path("/sys/fs/cgroup")
_COUNTER = itertools.count()


@dataclass(frozen=True)
class CgroupSupport:
    """Where command groups are made: ``version`` 2 or 1 with their parent folders, or 0
    with the ``reason`` there are none."""

    version: int
    parents: tuple[Path, ...] = ()
    reason: str = ""

    def group(self, memory_bytes: int, processes: int) -> CommandGroup | None:
        """A fresh group for one command (None without support or when it cannot be made)."""
        if not self.version:
            return None
        name = f"treeroll-{os.getpid()}-{next(_COUNTER)}"
        made: list[Path] = []
        try:
            if self.version == 2:
                folder = self.parents[0] / name
                folder.mkdir()
                made.append(folder)
                (folder / "memory.max").write_text(str(memory_bytes))
                if (folder / "memory.swap.max").exists():
                    (folder / "memory.swap.max").write_text("0")
                (folder / "pids.max").write_text(str(processes))
            else:
                memory, pids = (parent / name for parent in self.parents)
                for folder in (memory, pids):
                    folder.mkdir()
                    made.append(folder)
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                (pids / "pids.max").write_text(str(processes))
            fds = [os.open(folder / "cgroup.procs", os.O_WRONLY) for folder in made]
        except OSError:
            for folder in reversed(made):
                _remove(folder)
            return None
        return CommandGroup(made, fds)


@dataclass
class CommandGroup:
    """One command's control group(s): joined by the child, removed after the command."""

    folders: list[Path]
    procs: list[int] = field(default_factory=list)
    """Open ``cgroup.procs`` descriptors (the child writes its pid through them)."""

    def join(self) -> None:
        """Move the calling process into the group (in the child, before it execs)."""
        pid = str(os.getpid()).encode()
        for fd in self.procs:
            os.write(fd, pid)

    def kill(self) -> None:
        """SIGKILL every process still in the group (one that left the command's session,
        say), until none is left."""
        procs = self.folders[0] / "cgroup.procs"
        for _ in range(50):
            try:
                pids = [int(line) for line in procs.read_text().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def close(self) -> None:
        """Close the descriptors and remove the group (once its processes are gone)."""
        for fd in self.procs:
            os.close(fd)
        self.procs = []
        for folder in reversed(self.folders):
            _remove(folder)


def _remove(folder: Path) -> None:
    for _ in range(100):  # the killed tree's processes leave the group within moments
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


@functools.cache
def cgroup_support(root: Path = _ROOT) -> CgroupSupport:
    """What this machine offers (probed once, by making and removing a group in each
    place)."""
    if os.geteuid() != 0:
        return CgroupSupport(0, reason="not root: cgroups are not delegated to this user")
    unified = root / "cgroup.controllers"
    if unified.is_file():
        enabled = (root / "cgroup.subtree_control").read_text().split() if (
            root / "cgroup.subtree_control").is_file() else []
        if {"memory", "pids"} <= set(enabled) and _writable(root):
            return CgroupSupport(2, (root,))
    v1 = (root / "memory", root / "pids")
    if all((p / "cgroup.procs").is_file() for p in v1) and all(_writable(p) for p in v1):
        return CgroupSupport(1, v1)
    return CgroupSupport(0, reason=f"no writable cgroup v2 root with the memory and pids "
                                   f"controllers, nor v1 memory and pids hierarchies, under "
                                   f"{root}")


def _writable(parent: Path) -> bool:
    probe = parent / f"treeroll-probe-{os.getpid()}-{next(_COUNTER)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    _remove(probe)
    return True
