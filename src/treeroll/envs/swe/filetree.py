"""Directory trees on the host, as the sandbox's working trees need them: an exact copy
(overlayfs whiteouts and opaque directories included), the disk space a tree takes, and a
listing of its entries.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

__all__ = ["copy_tree", "list_files", "tree_bytes"]


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a directory exactly: modes, owners, symlinks, overlay whiteouts and opaque xattrs."""
    st = os.lstat(src)
    os.mkdir(dst, stat.S_IMODE(st.st_mode))
    _copy_meta(src, dst, st)
    with os.scandir(src) as entries:
        for entry in entries:
            s, d = Path(entry.path), dst / entry.name
            est = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(est.st_mode):
                copy_tree(s, d)
                continue
            if stat.S_ISLNK(est.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISREG(est.st_mode):
                shutil.copyfile(s, d, follow_symlinks=False)
                os.chmod(d, stat.S_IMODE(est.st_mode))
            elif stat.S_ISCHR(est.st_mode):  # an overlayfs whiteout (a deleted file)
                os.mknod(d, est.st_mode, est.st_rdev)
            else:
                continue
            _copy_meta(s, d, est)


def _copy_meta(src: Path, dst: Path, st: os.stat_result) -> None:
    if os.geteuid() == 0:
        os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):
                for name in os.listxattr(src, follow_symlinks=False):
                    if name.startswith("trusted.overlay."):
                        os.setxattr(dst, name, os.getxattr(src, name))


def tree_bytes(root: Path) -> int:
    """Disk space (allocated blocks) of every entry under ``root`` but its folders; what
    cannot be read is skipped."""
    total = 0
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(Path(entry.path))
                    else:
                        total += st.st_blocks * 512
        except OSError:
            continue
    return total


def list_files(root: Path) -> set[str]:
    """Every entry under ``root`` (files, links and folders), as paths relative to it."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in filenames + dirnames:
            out.add(os.path.normpath(os.path.join(rel, name)))
    return out
