"""Directory trees on the host, as the sandbox's working trees need them: a scan, the space
and entries a tree takes, an exact copy (overlayfs whiteouts and opaque directories
included), and a removal.

An agent shapes these trees (a folder chain thousands deep, paths longer than ``PATH_MAX``,
sparse files, folders it made unreadable), so nothing here recurses or builds long paths:
folders are opened relative to their parent's descriptor, walks keep a stack of their own
(at most one open descriptor a level, and only down to ``max_depth``), and removal moves
nested folders up instead of descending into them. Written here because the standard
library's ``os.walk``, ``shutil.rmtree`` and ``shutil.copytree`` recurse (Python 3.11) and
raise ``RecursionError`` on a deep chain.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TreeUsage", "copy_tree", "list_files", "remove_tree", "scan_tree", "tree_bytes",
           "tree_usage"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
DEFAULT_DEPTH = 256
"""How deep a walk goes unless told (trees the agent shapes are held to a smaller limit)."""


def _open_dir(name: str | Path, parent: int | None = None) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None


def _listing(fd: int) -> list[tuple[str, os.stat_result]]:
    out = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
    except OSError:
        pass
    return out


def scan_tree(root: str | Path, *, skip: Sequence[str] = (),
              max_depth: int = DEFAULT_DEPTH) -> Iterator[tuple[str, os.stat_result]]:
    """``(relative path, lstat)`` of every entry under ``root``, a folder's entries before
    what lies inside them; links are never followed. Folders named in ``skip`` are left
    out with what they hold; entries deeper than ``max_depth`` levels are not listed (a
    folder at that depth is listed, not entered). What cannot be read is skipped."""
    top = _open_dir(root)
    if top is None:
        return
    stack: list[tuple[int, str, list[str]]] = []  # (folder's fd, its path, folders to enter)

    def enter(fd: int, rel: str, depth: int) -> Iterator[tuple[str, os.stat_result]]:
        listing = [(name, st) for name, st in _listing(fd)
                   if not (stat.S_ISDIR(st.st_mode) and name in skip)]
        stack.append((fd, rel, [name for name, st in listing
                                if stat.S_ISDIR(st.st_mode) and depth < max_depth]))
        for name, st in listing:
            yield (f"{rel}/{name}" if rel else name), st

    try:
        yield from enter(top, "", 1)
        while stack:
            fd, rel, folders = stack[-1]
            if not folders:
                os.close(fd)
                stack.pop()
                continue
            name = folders.pop()
            child = _open_dir(name, fd)
            if child is not None:
                yield from enter(child, f"{rel}/{name}" if rel else name, len(stack) + 1)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def list_files(root: str | Path, *, max_depth: int = DEFAULT_DEPTH) -> set[str]:
    """Every entry under ``root`` (files, links and folders), as paths relative to it."""
    return {rel for rel, _ in scan_tree(root, max_depth=max_depth)}


def _apparent(st: os.stat_result) -> int:
    """What a file holds or may come to hold: its apparent size or its blocks, the larger (a
    sparse file counts its size: a copy writes it all)."""
    return max(st.st_size, st.st_blocks * 512)


@dataclass(frozen=True)
class TreeUsage:
    """What a tree takes: ``bytes`` (apparent sizes of everything but folders), ``entries``
    (files, links, folders, whiteouts) and ``depth`` (levels below the root). A count made
    with limits stops once one is passed, so it is then only a lower bound."""

    bytes: int
    entries: int
    depth: int

    def over(self, max_bytes: int, max_entries: int, max_depth: int) -> str:
        """Which limit this passes, in words ("" when none)."""
        if self.bytes > max_bytes:
            return f"more than {max_bytes // 2**20} MB"
        if self.entries > max_entries:
            return f"more than {max_entries} files and folders"
        if self.depth > max_depth:
            return f"folders more than {max_depth} levels deep"
        return ""


def tree_usage(root: str | Path, *, max_bytes: int | None = None,
               max_entries: int | None = None, max_depth: int = DEFAULT_DEPTH) -> TreeUsage:
    """The space, entries and depth of ``root``'s tree, counted until a limit is passed (the
    work is bounded by the limits, however large the tree)."""
    total = entries = depth = 0
    for rel, st in scan_tree(root, max_depth=max_depth + 1):
        entries += 1
        depth = max(depth, rel.count("/") + 1)
        if not stat.S_ISDIR(st.st_mode):
            total += _apparent(st)
        if (max_bytes is not None and total > max_bytes) or depth > max_depth or \
                (max_entries is not None and entries > max_entries):
            break
    return TreeUsage(total, entries, depth)


def tree_bytes(root: str | Path) -> int:
    """Apparent size of every entry under ``root`` but its folders."""
    return tree_usage(root).bytes


def _copy_meta(src_fd: int, dst: int, st: os.stat_result, *, is_dir: bool) -> None:
    """Owner, mode and (folders) overlayfs's xattrs of ``dst`` (an open descriptor)."""
    if os.geteuid() == 0:
        os.fchown(dst, st.st_uid, st.st_gid)
        if is_dir:
            with contextlib.suppress(OSError):
                for name in os.listxattr(src_fd):
                    if name.startswith("trusted.overlay."):
                        os.setxattr(dst, name, os.getxattr(src_fd, name))
    os.fchmod(dst, stat.S_IMODE(st.st_mode))


def _copy_entry(name: str, st: os.stat_result, src: int, dst: int) -> None:
    """Copy one non-folder entry ``name`` from folder ``src`` into folder ``dst``."""
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
    elif stat.S_ISCHR(st.st_mode):  # an overlayfs whiteout (a deleted file)
        os.mknod(name, st.st_mode, st.st_rdev, dir_fd=dst)
    elif stat.S_ISREG(st.st_mode):
        source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
        try:
            target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                             dir_fd=dst)
            try:
                while os.sendfile(target, source, None, 1 << 20):  # the kernel copies
                    pass
                _copy_meta(source, target, st, is_dir=False)
            finally:
                os.close(target)
        finally:
            os.close(source)
        return
    else:
        return  # sockets, fifos: not copied
    if os.geteuid() == 0:
        os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)


def _copy_folder(source: int, target: int) -> list[tuple[str, os.stat_result]]:
    """Copy the entries of folder ``source`` into folder ``target``: what is not a folder
    whole, folders empty; returns the folders (to be entered or not)."""
    folders = []
    for name, st in _listing(source):
        if stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):
                os.mkdir(name, 0o700, dir_fd=target)
                folders.append((name, st))
        else:
            with contextlib.suppress(OSError):  # one this user cannot read
                _copy_entry(name, st, source, target)
    return folders


def copy_tree(src: str | Path, dst: str | Path, *, max_depth: int = DEFAULT_DEPTH) -> None:
    """Copy a folder exactly (modes, owners, symlinks, overlay whiteouts and opaque xattrs)
    to the new folder ``dst``, down to ``max_depth`` levels (folders at that level are copied
    empty), without recursion and with one pair of open descriptors a level."""
    top = _open_dir(src)
    if top is None:
        raise FileNotFoundError(f"cannot open the folder {src}")
    os.mkdir(dst, 0o700)
    out = _open_dir(dst)
    assert out is not None
    frames = [(top, out, 1, _copy_folder(top, out))]  # entries of a frame are at its depth
    try:
        while frames:
            source, target, depth, folders = frames[-1]
            if folders and depth < max_depth:
                name, _ = folders.pop()
                child, made = _open_dir(name, source), _open_dir(name, target)
                if child is not None and made is not None:
                    frames.append((child, made, depth + 1, _copy_folder(child, made)))
                    continue
                for fd in (child, made):
                    if fd is not None:
                        os.close(fd)
                continue
            for name, st in folders:  # the last level: the folders, not what they hold
                made = _open_dir(name, target)
                if made is not None:
                    with contextlib.suppress(OSError):
                        _copy_meta(-1, made, st, is_dir=False)
                    os.close(made)
            frames.pop()
            with contextlib.suppress(OSError):
                _copy_meta(source, target, os.fstat(source), is_dir=True)
            os.close(source)
            os.close(target)
    finally:
        for source, target, _, _ in frames:
            os.close(source)
            os.close(target)


_NAMES = itertools.count()


def _empty(fd: int) -> None:
    """Empty the folder ``fd``: unlink what is not a folder; folders two levels down are
    moved up into ``fd`` (so no descent goes deeper than one level), then each child
    folder, emptied of files, is removed; repeated until ``fd`` is empty."""
    while True:
        listing = _listing(fd)
        if not listing:
            return
        for name, st in listing:
            if not stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
                continue
            child = _open_dir(name, fd)
            if child is None:  # made unreadable: give it back to us and try again
                with contextlib.suppress(OSError):
                    os.chmod(name, 0o700, dir_fd=fd)  # a folder (lstat said so)
                child = _open_dir(name, fd)
                if child is None:
                    continue
            try:
                with contextlib.suppress(OSError):
                    os.fchmod(child, 0o700)
                for inner, inner_st in _listing(child):
                    with contextlib.suppress(OSError):
                        if stat.S_ISDIR(inner_st.st_mode):
                            os.rename(inner, f".rm-{os.getpid()}-{next(_NAMES)}",
                                      src_dir_fd=child, dst_dir_fd=fd)
                        else:
                            os.unlink(inner, dir_fd=child)
            finally:
                os.close(child)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
        if {name for name, _ in _listing(fd)} == {name for name, _ in listing}:
            return  # nothing could be removed: what is left stays


def _open_parent(path: str | Path) -> tuple[int | None, str]:
    """A descriptor of ``path``'s folder and its last name, reached one name at a time (so a
    path longer than ``PATH_MAX`` works), never through a link."""
    parts = [part for part in str(path).split("/") if part]
    fd = _open_dir("/")
    for part in parts[:-1]:
        if fd is None:
            break
        child = _open_dir(part, fd)
        os.close(fd)
        fd = child
    return fd, parts[-1] if parts else ""


def remove_tree(path: str | Path) -> None:
    """Delete ``path`` and everything below it, however deep and however long its path
    (never raises: what cannot be removed stays)."""
    parent, name = _open_parent(os.path.abspath(path))
    if parent is None or not name:
        return
    try:
        try:
            st = os.lstat(name, dir_fd=parent)
        except OSError:
            return
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=parent)
            return
        fd = _open_dir(name, parent)
        if fd is None:
            with contextlib.suppress(OSError):
                os.chmod(name, 0o700, dir_fd=parent)  # a folder (lstat said so)
            fd = _open_dir(name, parent)
        if fd is not None:
            try:
                _empty(fd)
            finally:
                os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)
