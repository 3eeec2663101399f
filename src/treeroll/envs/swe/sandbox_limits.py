"""What a sandboxed command may use: :class:`SandboxLimits`, and the rlimits each of its
processes gets from them (:func:`apply_rlimits`).

The limits of a command's whole process tree (``command_memory_mb``, ``command_processes``)
are applied through its control group (:mod:`treeroll.envs.swe.cgroups`); the tree's quota
(bytes, entries, depth) by polling the tree while the command runs
(:mod:`treeroll.envs.swe.command`) and before each fork; the
scratch tmpfs size when the closed root is built (:mod:`treeroll.envs.swe.jail`).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ["SandboxLimits", "apply_rlimits"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one command (all configurable per environment)."""

    wall_timeout_s: float = 30.0
    """Wall-clock limit; the command and everything it started are killed after it."""
    cpu_seconds: int = 60
    """RLIMIT_CPU per process."""
    memory_mb: int = 4096
    """RLIMIT_AS (address space) per process."""
    max_processes: int = 256
    """RLIMIT_NPROC: processes of the sandbox user (a fork bomb stops here)."""
    command_memory_mb: int = 4096
    """Memory of a command and everything it starts, together (its cgroup; where cgroups
    are not available only ``memory_mb`` per process holds)."""
    command_processes: int = 128
    """Processes a command may have at once, all of them (its cgroup's ``pids.max``)."""
    file_size_mb: int = 32
    """RLIMIT_FSIZE: largest file a command may write."""
    disk_quota_mb: int = 128
    """Most bytes a working tree's own (edited or created) files may hold, apparent sizes (a
    sparse file counts its size: a fork copies it all)."""
    max_tree_entries: int = 20_000
    """Most files, links and folders a working tree's own files may count (a fork copies
    each one)."""
    max_tree_depth: int = 64
    """Deepest folder level a working tree may have."""
    tmpfs_mb: int = 64
    """Size of each command's private scratch tmpfs (``TMPDIR``, ``HOME``) in overlay mode."""
    capture_bytes: int = 200_000
    """Output kept from a command (head and tail halves); the rest is counted, not stored."""

    def __post_init__(self) -> None:
        if self.wall_timeout_s <= 0:
            raise ValueError(f"wall_timeout_s must be > 0, got {self.wall_timeout_s}")
        for name in ("cpu_seconds", "memory_mb", "max_processes", "file_size_mb",
                     "disk_quota_mb", "tmpfs_mb", "capture_bytes", "command_memory_mb",
                     "command_processes", "max_tree_entries", "max_tree_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def apply_rlimits(limits: SandboxLimits) -> None:
    """Set this process's ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC`` and
    ``RLIMIT_FSIZE`` from ``limits``, and no core files. Runs in the command's child between
    fork and exec (the limits hold for everything it starts)."""
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
    mem = limits.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)
    size = limits.file_size_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
