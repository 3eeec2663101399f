"""The closed root a command runs in, in overlay mode (see :mod:`treeroll.envs.swe.sandbox`).

Planned once on the host (:func:`jail_plan`: what the root holds), built in each command's
child between fork and exec (:func:`isolate`): new mount, network and IPC namespaces, mounts kept
from propagating to the host, a fresh tmpfs holding the system directories and the tools
read-only, the branch's overlay at :data:`JAIL_REPO`, a private scratch tmpfs at
:data:`JAIL_TMP`, a minimal ``/dev``; then ``pivot_root`` (or ``chroot``) into it and the
root remounted read-only. glibc's ``mount(2)``, ``unshare(2)`` and ``pivot_root(2)`` are
called through :mod:`ctypes` (:func:`load_libc`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JAIL_REPO", "JAIL_SCORING", "JAIL_TMP", "JailPlan", "isolate", "jail_plan",
           "load_libc", "mount_points"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWIPC = 0x08000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def load_libc() -> ctypes.CDLL | None:
    """The C library, to call ``mount``, ``unshare`` and ``pivot_root`` with (``None`` where it
    cannot be found or loaded)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def mount_points() -> list[tuple[str, str, bool]]:
    """``(mount point, fs type, read_only)`` of every mount, from ``/proc/self/mountinfo``."""
    out: list[tuple[str, str, bool]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        parts = left.split()
        if len(parts) < 6 or not right:
            continue
        point = parts[4].encode().decode("unicode_escape")
        out.append((point, right.split()[0], "ro" in parts[5].split(",")))
    return out


_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level system directories a closed root shows (read-only; symlinks kept as links)."""
_ETC_ENTRIES = ("passwd", "group", "nsswitch.conf", "hosts", "ld.so.cache", "ld.so.conf",
                "ld.so.conf.d", "localtime", "alternatives", "ssl", "mime.types", "gitconfig",
                "inputrc", "bash.bashrc", "profile")
"""What of ``/etc`` a closed root shows: name lookup, the dynamic loader, Debian's
``alternatives`` links (``/usr/bin/awk`` points there), TLS roots and shell defaults; nothing
else of the host's configuration."""
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
JAIL_REPO = "/testbed"
"""The working tree's path inside the closed root (SWE-bench's images use the same)."""
JAIL_TMP = "/tmp"
"""The private scratch tmpfs inside the closed root (``TMPDIR`` and ``HOME``)."""
JAIL_SCORING = "/.scoring"
"""Where commands find the scoring plugin in overlay mode (read-only)."""
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203,
               "s390x": 217}
"""``pivot_root(2)`` syscall numbers (glibc has no wrapper); elsewhere ``chroot(2)`` is used
(the command runs as ``nobody``, who cannot leave a chroot)."""
_MNT_DETACH = 2


@dataclass(frozen=True)
class JailPlan:
    """What a closed root holds, planned once on the host: ``links`` are ``(path, target)``
    symlinks, ``binds`` are ``(host path, is_dir)`` shown read-only at the same path."""

    links: tuple[tuple[str, str], ...]
    binds: tuple[tuple[str, bool], ...]
    submounts: tuple[str, ...] = ()
    """Host mount points, so that mounts below a bound path are made read-only too."""
    hidden: tuple[str, ...] = ()
    """Folders inside a bound path covered by an empty read-only tmpfs (treeroll's own
    package, which holds the SWE tasks' pristine projects, when it is installed inside the
    Python installation the commands run)."""
    mapped: tuple[tuple[str, str], ...] = ()
    """``(host folder, path inside)`` pairs bound read-only at another path (the scoring
    plugin's folder, at :data:`JAIL_SCORING`)."""


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without those inside another one of them (``/usr/local`` under ``/usr``)."""
    unique = sorted(set(paths), key=len)
    kept: list[str] = []
    for path in unique:
        if not any(path == k or path.startswith(k.rstrip(os.sep) + os.sep) for k in kept):
            kept.append(path)
    return sorted(kept)


def jail_plan(tools: list[str], root: Path, hidden: Sequence[str] = (),
              mapped: Sequence[tuple[str, str]] = ()) -> JailPlan:
    """The closed root: the system directories, a few ``/etc`` entries, and ``tools`` (the
    Python installation commands run, plus any path a caller adds), each read-only at its
    host path. Everything else of the host (homes, other checkouts, treeroll's own sources,
    other tasks' trees) does not exist inside."""
    links: list[tuple[str, str]] = []
    binds: list[str] = []
    for name in _SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append(path)
    resolved = []
    for raw in tools:
        path = os.path.realpath(raw)
        if not os.path.exists(path):
            raise ValueError(f"sandbox tool path {raw!r} does not exist")
        if path == "/" or str(root).startswith(path.rstrip(os.sep) + os.sep):
            raise ValueError(f"sandbox tool path {raw!r} holds the sandbox's own trees "
                             f"({root}); name the tool's own folder")
        resolved.append(path)
    dirs = _outermost(binds + resolved)
    files = [(f"/etc/{name}", os.path.isdir(f"/etc/{name}")) for name in _ETC_ENTRIES
             if os.path.exists(f"/etc/{name}")]
    files = [(path, is_dir) for path, is_dir in files
             if not any(path.startswith(d + os.sep) for d in dirs)]
    covered = tuple(sorted({os.path.realpath(h) for h in hidden
                            if any(os.path.realpath(h).startswith(d.rstrip(os.sep) + os.sep)
                                   for d in dirs)}))
    return JailPlan(links=tuple(links), binds=tuple((d, True) for d in dirs) + tuple(files),
                    submounts=tuple(point for point, _, _ in mount_points()), hidden=covered,
                    mapped=tuple(mapped))


def _mount(libc: ctypes.CDLL, source: str, target: str, fstype: str | None, flags: int,
           data: bytes | None, what: str) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                  flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"{what} ({target})")


def _bind_read_only(libc: ctypes.CDLL, source: str, target: str, *, is_dir: bool,
                    devices: bool = False, submounts: Sequence[str] = ()) -> None:
    """Bind ``source`` at ``target`` read-only, nosuid (and nodev unless ``devices``),
    with every host mount below ``source`` (``submounts``) made read-only too."""
    os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
    if not is_dir and not os.path.exists(target):
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(libc, source, target, None, _MS_BIND | _MS_REC, None, "bind")
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | (0 if devices else _MS_NODEV)
    _mount(libc, "none", target, None, flags, None, "remount read-only")
    prefix = source.rstrip("/") + "/"
    for point in submounts:
        if point.startswith(prefix):
            inner = target + "/" + point[len(prefix):]
            if os.path.isdir(inner) or os.path.isfile(inner):
                _mount(libc, "none", inner, None, flags, None, "remount a submount read-only")


def _enter_jail(libc: ctypes.CDLL, plan: JailPlan, jail: str, repo: str, scratch: str,
                overlay_options: bytes, tmp_options: bytes) -> None:
    """Build the closed root on ``jail`` (a fresh tmpfs in this mount namespace) and make it
    ``/``: the plan's read-only binds and links, the branch's overlay at ``repo``, a private
    tmpfs at ``scratch`` (also ``/tmp``), a minimal ``/dev``, an empty ``/proc`` for the PID
    namespace's own. Runs in the command's child between fork and exec."""
    _mount(libc, "tmpfs", jail, "tmpfs", _MS_NOSUID | _MS_NODEV, b"size=4m,mode=755",
           "mount root tmpfs")
    for path, target in plan.links:
        os.symlink(target, jail + path)
    # The scratch tmpfs first: a bound path under /tmp (a virtual environment made there,
    # say) then gets its mount point inside it instead of being hidden by it.
    os.makedirs(jail + scratch, exist_ok=True)
    _mount(libc, "tmpfs", jail + scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, tmp_options,
           "mount scratch tmpfs")
    if scratch != "/tmp":
        os.makedirs(jail + "/tmp", exist_ok=True)
        _mount(libc, jail + scratch, jail + "/tmp", None, _MS_BIND, None, "bind /tmp")
    for path, is_dir in plan.binds:
        _bind_read_only(libc, path, jail + path, is_dir=is_dir, submounts=plan.submounts)
    for path in plan.hidden:
        if os.path.isdir(jail + path):
            _mount(libc, "tmpfs", jail + path, "tmpfs",
                   _MS_RDONLY | _MS_NOSUID | _MS_NODEV, b"size=4k,mode=555", "hide a folder")
    for source, inside in plan.mapped:
        _bind_read_only(libc, source, jail + inside, is_dir=True)
    os.makedirs(jail + repo, exist_ok=True)
    _mount(libc, "overlay", jail + repo, "overlay", _MS_NOSUID | _MS_NODEV, overlay_options,
           "mount overlay")
    os.makedirs(jail + "/dev", exist_ok=True)
    for node in _DEV_NODES:
        if os.path.exists("/dev/" + node):
            _bind_read_only(libc, "/dev/" + node, f"{jail}/dev/{node}", is_dir=False,
                            devices=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("shm", "/tmp")):
        if not os.path.lexists(f"{jail}/dev/{name}"):  # the trees may live under /dev/shm
            os.symlink(target, f"{jail}/dev/{name}")
    os.makedirs(jail + "/proc", exist_ok=True)
    os.chdir(jail)
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is not None:  # a failure here fails the probe: copy mode, and it says so
        if libc.syscall(number, b".", b".") != 0:
            raise OSError(ctypes.get_errno(), "pivot_root")
        if libc.umount2(b".", _MNT_DETACH) != 0:  # the old root, stacked on the new one
            raise OSError(ctypes.get_errno(), "detach the host root")
    elif libc.chroot(b".") != 0:
        raise OSError(ctypes.get_errno(), "chroot")
    os.chdir("/")
    _mount(libc, "none", "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None,
           "remount the closed root read-only")
    os.chdir(repo)


def isolate(libc: ctypes.CDLL, plan: JailPlan, jail: str, repo: str, scratch: str,
            overlay_options: bytes, tmp_options: bytes) -> None:
    """Move this process into new mount, network and IPC namespaces, keep its mounts from
    propagating to the host, and make the closed root of ``plan`` (built on ``jail``) its
    ``/``. Runs in the command's child between fork and exec. The IPC namespace (System V
    shared memory, semaphores, message queues) dies with the command's last process, and
    what it held with it."""
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    _enter_jail(libc, plan, jail, repo, scratch, overlay_options, tmp_options)
