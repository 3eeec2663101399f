"""One branch's working tree in a :class:`~treeroll.envs.swe.sandbox.Sandbox`: the shared
pristine tree plus the branch's own files (overlay mode) or a full copy (copy mode), and what
the environment and the scorer do to it on the host: fork it, measure it, reset paths to the
pristine tree, read files as commands see them, list what changed.
"""

from __future__ import annotations

import contextlib
import filecmp
import functools
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from treeroll.envs.swe.filetree import (
    TreeUsage,
    copy_tree,
    list_files,
    remove_tree,
    scan_tree,
    tree_bytes,
    tree_usage,
)
from treeroll.envs.swe.sandbox_limits import SandboxLimits


class SandboxView(Protocol):
    """What a workspace reads of its :class:`~treeroll.envs.swe.sandbox.Sandbox` (declared
    here rather than imported: the sandbox module imports this one)."""

    @property
    def mode(self) -> str: ...
    @property
    def limits(self) -> SandboxLimits: ...
    @property
    def repo_path(self) -> Path: ...
    @property
    def root(self) -> Path: ...
    @property
    def _counter(self) -> Iterator[int]: ...

__all__ = ["Workspace"]


@functools.lru_cache(maxsize=64)
def _pristine_usage(base: Path) -> TreeUsage:
    """What a pristine tree takes (it never changes)."""
    return tree_usage(base)


@dataclass(eq=False)
class Workspace:
    """One branch's working tree: the shared pristine ``base`` plus this branch's changes.

    In overlay mode ``upper`` holds only what the branch created, edited (copied up) or
    deleted (whiteouts); in copy mode it is a full copy of the tree.
    """

    sandbox: SandboxView
    base: Path
    directory: Path
    _removed: bool = field(default=False, repr=False)

    @property
    def upper(self) -> Path:
        """The directory holding this branch's own files."""
        return self.directory

    @property
    def work(self) -> Path:
        """overlayfs's work directory for this branch (overlay mode)."""
        return self.directory.with_name(self.directory.name + ".work")

    @property
    def scratch(self) -> Path:
        """``TMPDIR`` of commands in copy mode (outside the tree)."""
        return self.directory.with_name(self.directory.name + ".tmp")

    @property
    def path(self) -> str:
        """The tree's path as commands see it."""
        if self.sandbox.mode == "overlay":
            return str(self.sandbox.repo_path)
        return str(self.upper)

    def fork(self) -> Workspace:
        """An independent copy: overlay mode copies only the branch's own (edited) files. A
        tree over its quota (a process that outlived its command, in copy mode) first loses
        its own files (:meth:`enforce_quota`): a fork never copies more than the quota."""
        self.enforce_quota()
        n = next(self.sandbox._counter)
        directory = self.sandbox.root / "ws" / f"{os.getpid()}-{n}"
        copy_tree(self.upper, directory, max_depth=self.quota()[2])
        if self.sandbox.mode == "overlay":
            directory.with_name(directory.name + ".work").mkdir()
        return Workspace(sandbox=self.sandbox, base=self.base, directory=directory)

    def quota(self) -> tuple[int, int, int]:
        """``(bytes, entries, depth)`` this branch's own files may take: the sandbox's limits,
        plus the pristine tree's own size and entries in copy mode (whose tree is a full
        copy), so that both modes leave a branch the same room."""
        limits = self.sandbox.limits
        pristine = _pristine_usage(self.base) if self.sandbox.mode != "overlay" else \
            TreeUsage(0, 0, 0)
        return (limits.disk_quota_mb * 2**20 + pristine.bytes,
                limits.max_tree_entries + pristine.entries,
                max(limits.max_tree_depth, pristine.depth))

    def usage(self) -> TreeUsage:
        """Space (apparent sizes: a sparse file counts its size), entries and depth of this
        branch's own files, counted until a limit of the quota is passed."""
        max_bytes, max_entries, max_depth = self.quota()
        return tree_usage(self.upper, max_bytes=max_bytes, max_entries=max_entries,
                          max_depth=max_depth)

    def own_bytes(self) -> int:
        """Space taken by this branch's own files (apparent sizes)."""
        return tree_bytes(self.upper)

    def over_quota(self) -> str:
        """Which limit of the quota this branch's own files pass, in words ("" when none)."""
        return self.usage().over(*self.quota())

    def listing(self) -> set[str]:
        """Every entry of this branch's own files (one level past the depth limit)."""
        return list_files(self.upper, max_depth=self.quota()[2] + 1)

    def undo(self, before: set[str], since_ns: int) -> None:
        """Take back what a command that broke the quota did: delete every entry not in
        ``before`` (a :meth:`listing` taken before it), put every file changed since
        ``since_ns`` (its ``ctime``, which no command can set) back as in the pristine tree,
        and, if the tree still breaks the quota, drop all of this branch's own files."""
        entries = list(scan_tree(self.upper, max_depth=self.quota()[2] + 1))
        for rel, _ in sorted((e for e in entries if e[0] not in before), key=lambda e: len(e[0])):
            remove_tree(self.upper / rel)
        for rel, st in entries:
            if rel in before and not stat.S_ISDIR(st.st_mode) and st.st_ctime_ns >= since_ns:
                with contextlib.suppress(OSError, ValueError):
                    self.restore(rel)
        self.enforce_quota()

    def enforce_quota(self) -> None:
        """Drop all of this branch's own files if they break the quota (back to the pristine
        tree)."""
        if not self.over_quota():
            return
        base_st = os.stat(self.base)
        remove_tree(self.upper)
        if self.sandbox.mode == "overlay":
            self.upper.mkdir()
            os.chmod(self.upper, stat.S_IMODE(base_st.st_mode))
            os.chown(self.upper, base_st.st_uid, base_st.st_gid)
        else:
            copy_tree(self.base, self.upper)

    def restore(self, rel: str) -> None:
        """Put ``rel`` (a file or directory) back as it is in the pristine tree."""
        parts = Path(os.path.normpath(rel)).parts
        if not parts or parts[0] == ".." or os.path.isabs(rel):
            raise ValueError(f"not a path inside the tree: {rel!r}")
        current = self.upper
        for part in parts[:-1]:  # a deleted or replaced parent hides the pristine one
            current = current / part
            if os.path.lexists(current) and not (current.is_dir() and not current.is_symlink()):
                current.unlink()
        target = self.upper.joinpath(*parts)
        remove_tree(target)
        source = self.base.joinpath(*parts)
        if self.sandbox.mode == "overlay" or not os.path.lexists(source):
            return  # overlay: removing our copy reveals the pristine one below
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)

    def read_bytes(self, rel: str) -> bytes | None:
        """Contents of the file at ``rel`` as commands see it; ``None`` if absent, not a
        regular file, or reached through a symlink (never follows links out of the tree)."""
        parts = Path(os.path.normpath(rel)).parts
        if not parts or parts[0] in ("..", "/") or os.path.isabs(rel):
            return None
        layers = [self.upper] if self.sandbox.mode != "overlay" else [self.upper, self.base]
        for layer in layers:
            current = layer
            hidden = False
            for i, part in enumerate(parts):
                current = current / part
                try:
                    st = os.lstat(current)
                except OSError:
                    current = None  # type: ignore[assignment]
                    break
                if stat.S_ISCHR(st.st_mode):  # whiteout: deleted in this branch
                    return None
                if stat.S_ISLNK(st.st_mode):
                    return None
                if i < len(parts) - 1 and stat.S_ISDIR(st.st_mode):
                    with contextlib.suppress(OSError):
                        if os.getxattr(current, "trusted.overlay.opaque") == b"y":
                            hidden = True
            if current is not None and current.is_file():
                return current.read_bytes()
            if hidden:
                return None
        return None

    def changed_files(self) -> list[str]:
        """Relative paths of regular files this branch created or edited (content differs from
        the pristine tree, or new), excluding ``.git``."""
        out = []
        for rel, st in scan_tree(self.upper, skip=(".git",),
                                 max_depth=self.quota()[2] + 1):
            if not stat.S_ISREG(st.st_mode):
                continue
            original = self.base / rel
            with contextlib.suppress(OSError):
                if original.is_file() and not original.is_symlink() and \
                        original.stat().st_size == st.st_size and \
                        filecmp.cmp(original, self.upper / rel, shallow=False):
                    continue
            out.append(rel)
        return sorted(out)

    def fingerprint(self) -> str:
        """A hash of this branch's own files (equal fingerprints = equal trees)."""
        digest = hashlib.sha256()
        entries = scan_tree(self.upper, max_depth=self.quota()[2] + 1)
        for rel, st in sorted(entries, key=lambda entry: entry[0].split("/")):
            if stat.S_ISDIR(st.st_mode):
                continue
            digest.update(os.fsencode(rel) + b"\0")
            if stat.S_ISREG(st.st_mode):
                with contextlib.suppress(OSError), open(self.upper / rel, "rb") as handle:
                    digest.update(hashlib.file_digest(handle, "sha256").digest())
            elif stat.S_ISLNK(st.st_mode):
                with contextlib.suppress(OSError):
                    digest.update(os.fsencode(os.readlink(self.upper / rel)))
            else:
                digest.update(b"special")
        return digest.hexdigest()

    def remove(self) -> None:
        """Delete this working tree."""
        if not self._removed:
            self._removed = True
            for path in (self.directory, self.work, self.scratch):
                remove_tree(path)
