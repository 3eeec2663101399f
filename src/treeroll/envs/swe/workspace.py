"""One branch's working tree in a :class:`~treeroll.envs.swe.sandbox.Sandbox`: the shared
pristine tree plus the branch's own files (overlay mode) or a full copy (copy mode), and what
the environment and the scorer do to it on the host: fork it, measure it, reset paths to the
pristine tree, read files as commands see them, list what changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from treeroll.envs.swe.filetree import copy_tree, list_files, tree_bytes

if TYPE_CHECKING:
    from treeroll.envs.swe.sandbox import Sandbox

__all__ = ["Workspace"]


@dataclass(eq=False)
class Workspace:
    """One branch's working tree: the shared pristine ``base`` plus this branch's changes.

    In overlay mode ``upper`` holds only what the branch created, edited (copied up) or
    deleted (whiteouts); in copy mode it is a full copy of the tree.
    """

    sandbox: Sandbox
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
        """An independent copy: overlay mode copies only the branch's own (edited) files."""
        child = self.sandbox.workspace(self.base) if self.sandbox.mode != "overlay" else None
        if child is not None:  # copy mode: replace the fresh copy of base by a copy of ours
            shutil.rmtree(child.upper)
            shutil.copytree(self.upper, child.upper, symlinks=True)
            return child
        n = next(self.sandbox._counter)
        directory = self.sandbox.root / "ws" / f"{os.getpid()}-{n}"
        copy_tree(self.upper, directory)
        directory.with_name(directory.name + ".work").mkdir()
        return Workspace(sandbox=self.sandbox, base=self.base, directory=directory)

    def own_bytes(self) -> int:
        """Disk space taken by this branch's own files."""
        return tree_bytes(self.upper)

    def remove_new(self, before: set[str]) -> None:
        """Delete entries created since ``before`` (a listing of ``upper``)."""
        for rel in sorted(list_files(self.upper) - before, key=len):
            target = self.upper / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    target.unlink()

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
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
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
        for dirpath, dirnames, filenames in os.walk(self.upper):
            dirnames[:] = [d for d in dirnames if d != ".git"]
            rel_dir = os.path.relpath(dirpath, self.upper)
            for name in filenames:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                full = Path(dirpath) / name
                st = os.lstat(full)
                if not stat.S_ISREG(st.st_mode):
                    continue
                original = self.base / rel
                try:
                    if original.is_file() and not original.is_symlink() \
                            and original.read_bytes() == full.read_bytes():
                        continue
                except OSError:
                    pass
                out.append(rel)
        return sorted(out)

    def fingerprint(self) -> str:
        """A hash of this branch's own files (equal fingerprints = equal trees)."""
        digest = hashlib.sha256()
        for dirpath, dirnames, filenames in sorted(os.walk(self.upper)):
            dirnames.sort()
            for name in sorted(filenames):
                full = Path(dirpath) / name
                st = os.lstat(full)
                digest.update(os.path.relpath(full, self.upper).encode() + b"\0")
                if stat.S_ISREG(st.st_mode):
                    digest.update(hashlib.sha256(full.read_bytes()).digest())
                elif stat.S_ISLNK(st.st_mode):
                    digest.update(os.readlink(full).encode())
                else:
                    digest.update(b"special")
        return digest.hexdigest()

    def remove(self) -> None:
        """Delete this working tree."""
        if not self._removed:
            self._removed = True
            for path in (self.directory, self.work, self.scratch):
                shutil.rmtree(path, ignore_errors=True)
