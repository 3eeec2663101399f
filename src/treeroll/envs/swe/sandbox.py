"""Run model-written shell commands confined to one task's working tree, and fork that tree.

Two isolation modes, chosen once per :class:`Sandbox` (``Sandbox.mode``):

``"overlay"`` (running as root on Linux with ``unshare`` and overlayfs; what treeroll's CI uses)
    Each command runs in fresh mount, network, IPC and PID namespaces inside a **closed
    root**: a fresh tmpfs made ``/`` with ``pivot_root`` that holds, read-only (submounts
    included) and nosuid, the system directories (``/usr``, ``/bin``, ``/lib*``), a few
    ``/etc`` entries and treeroll's Python installation (plus ``tools``), each at its host
    path; the branch's tree at ``/testbed``; a private size-limited tmpfs at ``/tmp``
    (``TMPDIR`` and ``HOME``); a minimal ``/dev``; and a fresh ``/proc`` that shows only the
    command's own processes. Nothing else of the host exists inside: homes, other checkouts,
    treeroll's own sources, other tasks' trees, ``/sys``; treeroll's own package (the pristine
    projects the tasks are made from live in its data) is covered by an empty read-only tmpfs
    wherever it lies inside the bound Python installation (a non-editable install), and a
    scoring run's own folder is shown read-only at ``/.scoring`` to that run only (nothing
    else of the sandbox's root). The task's pristine tree is the read-only *lower* layer shared
    by every branch; a branch's edits live in its own small *upper* directory (copy-on-write
    of edited files, by overlayfs). The command runs as the unprivileged user ``nobody`` with
    ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC`` and ``RLIMIT_FSIZE``, no network
    interfaces but a down loopback, a scrubbed environment, ``no_new_privs`` and a system-call
    filter (:mod:`~treeroll.envs.swe.seccomp`: no kernel keyrings, where libseccomp is
    installed). When the command ends or its wall timeout fires, its PID namespace is torn
    down, which kills every process it started, daemonised ones included, and its IPC
    namespace with it (System V shared memory, semaphores and queues: nothing a command
    leaves there reaches a later command, episode or task). :meth:`Workspace.fork` copies
    only the upper directory (the files the branch edited), so forking costs O(edited files),
    not O(tree). If the closed root cannot be built (no ``pivot_root``), the probe fails and
    copy mode is used.

``"copy"`` (fallback: not root, or no namespaces/overlayfs)
    The working tree is a plain directory (forked by a full copy); commands run in their own
    session with the same rlimits, a scrubbed environment and a wall timeout, and in a user,
    network and IPC namespace (``unshare -rni``) if the kernel allows one. Files outside the
    tree that the current user may read or write are *not* protected in this mode, and
    processes that leave the session (``setsid``) survive the timeout.
    ``Sandbox.containment`` says what was achieved.

``RLIMIT_NPROC`` counts every process of ``nobody`` on the host, so sandboxes running
commands at the same moment share it. Commands are set up in a ``preexec_fn``: step
environments from one thread per process. The disk quota of a working tree is enforced by
polling the tree while a command runs (``RLIMIT_FSIZE`` bounds each file): apparent size (a
sparse file counts its size), entries and depth, and again before every fork; a command that
breaks it is killed, the entries it created are deleted and the files it changed put back as
in the pristine tree (:meth:`Workspace.undo`). Every walk over a tree on the host is
iterative, through descriptors (:mod:`~treeroll.envs.swe.filetree`): no folder chain makes
the host raise.

The parts live beside this module: :mod:`~treeroll.envs.swe.sandbox_limits` (the limits and
the rlimits they set), :mod:`~treeroll.envs.swe.jail` (the closed root and the namespaces of
overlay mode), :mod:`~treeroll.envs.swe.command` (watching a started command: output,
timeout, quota, its :class:`CommandResult`), :mod:`~treeroll.envs.swe.filetree` (copies,
sizes and listings of the trees) and :mod:`~treeroll.envs.swe.cgroups` (limits of a command's
whole process tree).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

from treeroll.envs.swe.cgroups import CommandGroup, cgroup_support
from treeroll.envs.swe.command import CommandResult, watch
from treeroll.envs.swe.filetree import remove_tree
from treeroll.envs.swe.jail import (
    JAIL_REPO,
    JAIL_SCORING,
    JAIL_TMP,
    isolate,
    jail_plan,
    load_libc,
    mount_points,
)
from treeroll.envs.swe.sandbox_limits import SandboxLimits, apply_rlimits
from treeroll.envs.swe.seccomp import no_new_privs, syscall_filter
from treeroll.envs.swe.workspace import Workspace

__all__ = ["CommandResult", "Sandbox", "SandboxLimits", "Workspace", "default_root",
           "sandbox_python"]

_NOBODY = 65534


def sandbox_python() -> str:
    """The Python interpreter commands see as ``python``: treeroll's own (it has pytest)."""
    return sys.executable or "python3"


def default_root() -> Path:
    """Where sandboxes put their trees by default: ``$TREEROLL_SWE_ROOT`` if set, else
    ``/dev/shm`` when it is a writable tmpfs (forks and edits then never touch a disk journal;
    small generated tasks take well under a megabyte each), else the temporary directory.
    Point ``root`` at a disk for large repositories (SWE-bench checkouts)."""
    configured = os.environ.get("TREEROLL_SWE_ROOT")
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    if any(p == "/dev/shm" and fs == "tmpfs" for p, fs, ro in mount_points() if not ro) \
            and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


class Sandbox:
    """Owns a temporary root holding task trees and working trees, and runs commands there.

    ``isolation``: ``"auto"`` (overlay mode when it works, else copy mode; the environment
    variable ``TREEROLL_SWE_ISOLATION`` may force either), ``"overlay"`` (raise if
    unavailable) or ``"copy"``. ``tools``: host paths commands may read and run in overlay
    mode besides the system directories and treeroll's Python (a repository's own
    interpreter or toolchain, say); each must exist. Call :meth:`close` (or let it be
    garbage collected) to delete the root.
    """

    def __init__(self, root: str | Path | None = None, limits: SandboxLimits | None = None,
                 *, isolation: str = "auto", tools: Sequence[str] = ()) -> None:
        if isolation == "auto":
            isolation = os.environ.get("TREEROLL_SWE_ISOLATION", "auto")
        if isolation not in ("auto", "overlay", "copy"):
            raise ValueError(f"isolation must be 'auto', 'overlay' or 'copy', got {isolation!r}")
        self.limits = limits or SandboxLimits()
        parent = Path(root) if root is not None else default_root()
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="treeroll-swe-", dir=parent)).resolve()
        os.chmod(self.root, 0o755)
        self._finalizer = weakref.finalize(self, remove_tree, str(self.root))
        (self.root / "bases").mkdir()
        (self.root / "ws").mkdir()
        self.repo_path = Path(JAIL_REPO)
        """Where the working tree appears to commands in overlay mode (the same for every
        branch and every sandbox: each command mounts its own branch's tree there, inside its
        closed root)."""
        self.scratch_path = Path(JAIL_TMP)
        """Where each command's private tmpfs (``TMPDIR``, ``HOME``) appears in overlay mode."""
        self._counter = itertools.count()
        self._salt = secrets.token_hex(8)
        self._libc = load_libc()
        self._unshare = shutil.which("unshare")
        self._bash = shutil.which("bash") or "/bin/sh"
        self._python_dir = str(Path(sandbox_python()).parent)
        (self.root / "results").mkdir(mode=0o700)
        self._jail = jail_plan([sys.prefix, sys.base_prefix, self._python_dir,
                                os.path.dirname(os.path.realpath(sandbox_python())),
                                *tools], self.root,
                               hidden=[str(Path(__file__).resolve().parents[2])])
        self.jail_path = self.root / "jail"
        """The mount point of each command's closed root in overlay mode (empty on the host)."""
        self.jail_path.mkdir()
        self._syscalls = syscall_filter()
        """The system-call filter each command loads (``None`` where there is none)."""
        if self._syscalls is None:
            warnings.warn("the SWE sandbox has no system-call filter here (libseccomp missing, "
                          "or the kernel refused it): kernel keyrings are not isolated between "
                          "tasks (containment['syscall_filter'] is False); install libseccomp2",
                          stacklevel=2)
        self._cgroups = cgroup_support()
        """Whether commands get a control group of their own (``cgroups.cgroup_support``)."""
        self._user_netns = False
        self.mode = "copy"
        if isolation in ("auto", "overlay") and self._overlay_possible():
            self.mode = "overlay"
            if not self._probe():
                self.mode = "copy"
        if isolation == "overlay" and self.mode != "overlay":
            raise RuntimeError("overlay isolation needs root, unshare(1), mount namespaces and "
                               "overlayfs; use isolation='copy' or 'auto'")
        if self.mode == "copy" and self._unshare is not None:
            self._user_netns = self._probe_user_netns()
        self.containment = self._containment()
        """What this sandbox confines, as ``{property: achieved}`` (see the module docstring)."""

    # -- setup -------------------------------------------------------------------------------

    def _overlay_possible(self) -> bool:
        if os.geteuid() != 0 or self._libc is None or self._unshare is None:
            return False
        try:
            return "overlay" in Path("/proc/filesystems").read_text()
        except OSError:
            return False

    def _probe(self) -> bool:
        base = self.root / "bases" / "_probe"
        base.mkdir()
        (base / "probe.txt").write_text("ok\n")
        self._own(base)
        ws = self.workspace(base)
        try:
            result = self.run(ws, "cat probe.txt && echo x > new.txt && id -u")
        except Exception:  # any failure of the namespace setup means: no overlay mode
            return False
        finally:
            ws.remove()
            shutil.rmtree(base, ignore_errors=True)
        return result.returncode == 0 and result.output.split() == ["ok", str(_NOBODY)]

    def _probe_user_netns(self) -> bool:
        try:
            done = subprocess.run([str(self._unshare), "-rni", "true"], capture_output=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0

    def _containment(self) -> dict[str, bool]:
        overlay = self.mode == "overlay"
        return {
            "rlimits": True,
            "wall_timeout": True,
            "scrubbed_environment": True,
            "no_network": overlay or self._user_netns,
            "host_filesystem_read_only": overlay,
            "host_filesystem_hidden": overlay,
            "unprivileged_user": overlay or os.geteuid() != 0,
            "private_pid_namespace": overlay,
            "copy_on_write_fork": overlay,
            "reads_outside_task_blocked": overlay,
            "package_data_hidden": overlay,
            "command_tree_limits": bool(self._cgroups.version),
            "ipc_namespace": overlay or self._user_netns,
            "syscall_filter": self._syscalls is not None,
            "scoring_channel_outside": True,
        }

    def _own(self, path: Path) -> None:
        """Give a tree to the sandbox user (overlay mode runs commands as ``nobody``)."""
        if os.geteuid() != 0:
            return
        for dirpath, dirnames, filenames in os.walk(path):
            os.chown(dirpath, _NOBODY, _NOBODY)
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), _NOBODY, _NOBODY, follow_symlinks=False)

    # -- trees -------------------------------------------------------------------------------

    def base(self, key: str, build: Callable[[Path], None], *, git: bool = True) -> Path:
        """The pristine tree named ``key``, built once by ``build(directory)`` and cached.

        The tree becomes a git repository with one commit (so agents can ``git diff``) and
        belongs to the sandbox user. It is never modified afterwards.
        """
        # salted: the folder's name shows in the overlay's options (/proc/self/mountinfo),
        # and the key names the task (a generated task's id names its mutation)
        safe = hashlib.sha1(f"{self._salt}:{key}".encode()).hexdigest()[:16]
        path = self.root / "bases" / safe
        if path.exists():
            return path
        tmp = self.root / "bases" / f".{safe}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        build(tmp)
        if git and shutil.which("git") and not (tmp / ".git").exists():
            git_cmd = ["git", "-c", "user.name=treeroll", "-c", "user.email=treeroll@localhost",
                   "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"]
            for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
                subprocess.run(git_cmd + args, cwd=tmp, capture_output=True, check=False,
                               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                    "HOME": str(tmp), "GIT_CONFIG_NOSYSTEM": "1"})
        self._own(tmp)
        os.replace(tmp, path)
        return path

    def workspace(self, base: Path) -> Workspace:
        """A new working tree over ``base`` (empty upper in overlay mode, a copy otherwise)."""
        n = next(self._counter)
        directory = self.root / "ws" / f"{os.getpid()}-{n}"
        upper = directory
        if self.mode == "overlay":
            upper.mkdir()
            directory.with_name(directory.name + ".work").mkdir()
            base_st = os.stat(base)
            os.chmod(upper, stat.S_IMODE(base_st.st_mode))
            os.chown(upper, base_st.st_uid, base_st.st_gid)
        else:
            shutil.copytree(base, upper, symlinks=True)
        return Workspace(sandbox=self, base=base, directory=directory)

    # -- running -----------------------------------------------------------------------------

    def _environment(self, workspace: Workspace) -> dict[str, str]:
        tmp = str(self.scratch_path) if self.mode == "overlay" else str(workspace.scratch)
        if self.mode != "overlay":
            Path(tmp).mkdir(exist_ok=True)
        return {
            "PATH": f"{self._python_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": tmp,
            "TMPDIR": tmp,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
            "GIT_OPTIONAL_LOCKS": "0",
            "TERM": "dumb",
        }

    def _preexec(self, workspace: Workspace, group: CommandGroup | None = None,
                 scoring: Path | None = None) -> Callable[[], None]:
        limits = self.limits
        overlay = self.mode == "overlay"
        libc = self._libc
        jail = str(self.jail_path)
        options = (f"lowerdir={workspace.base},upperdir={workspace.upper},"
                   f"workdir={workspace.work}").encode()
        shm_options = f"size={limits.tmpfs_mb}m,mode=1777".encode()
        repo = str(self.repo_path)
        scratch = str(self.scratch_path)
        plan = self._jail if scoring is None else \
            dataclasses.replace(self._jail, mapped=((str(scoring), JAIL_SCORING),))

        syscalls = self._syscalls

        def setup() -> None:  # runs in the child between fork and exec
            if group is not None:  # before the closed root hides /sys
                group.join()
            if overlay:
                assert libc is not None
                isolate(libc, plan, jail, repo, scratch, options, shm_options)
            apply_rlimits(limits)
            if syscalls is not None and libc is not None:
                syscalls.load(libc)
            elif libc is not None:  # no filter here: still nothing gains privileges
                no_new_privs(libc)

        return setup

    def _argv(self, command: str) -> list[str]:
        shell = [self._bash, "-c", command]
        if self.mode == "overlay":
            assert self._unshare is not None
            return [self._unshare, "--pid", "--fork", "--kill-child", "--mount-proc",
                    "--setuid", str(_NOBODY), "--setgid", str(_NOBODY), "--", *shell]
        if self._user_netns:
            assert self._unshare is not None
            return [self._unshare, "-rni", "--", *shell]
        return shell

    def run(self, workspace: Workspace, command: str, *, stdin: str | None = None,
            timeout_s: float | None = None, pass_fds: Sequence[int] = (),
            extra_env: dict[str, str] | None = None,
            scoring: Path | None = None) -> CommandResult:
        """Run ``command`` with ``bash -c`` in ``workspace``; never raises for the command's
        own failures (timeouts, kills and quota breaches are reported in the result).
        ``pass_fds`` and ``extra_env``: descriptors and variables the command inherits (the
        scorer's result channel); ``scoring``: a scoring run's folder, shown read-only at
        ``/.scoring`` to this command only (overlay mode). With cgroups, the command and
        everything it starts share
        one memory and one process limit (``command_memory_mb``, ``command_processes``) and
        every process left in the group is killed when the command ends."""
        group = self._cgroups.group(self.limits.command_memory_mb * 2**20,
                                    self.limits.command_processes)
        try:
            return self._run(workspace, command, stdin, timeout_s, pass_fds, extra_env, group,
                             scoring)
        finally:
            if group is not None:
                group.kill()
                group.close()

    def _run(self, workspace: Workspace, command: str, stdin: str | None,
             timeout_s: float | None, pass_fds: Sequence[int],
             extra_env: dict[str, str] | None, group: CommandGroup | None,
             scoring: Path | None) -> CommandResult:
        timeout = self.limits.wall_timeout_s if timeout_s is None else timeout_s
        before = workspace.listing()
        since_ns = time.time_ns() - 20_000_000  # the kernel's file times run up to a tick late
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                self._argv(command), stdin=subprocess.PIPE if stdin is not None
                else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env={**self._environment(workspace), **(extra_env or {})},
                start_new_session=True, cwd=None if self.mode == "overlay" else workspace.upper,
                preexec_fn=self._preexec(workspace, group, scoring), close_fds=True,
                pass_fds=tuple(pass_fds))
        except (OSError, subprocess.SubprocessError) as err:
            return CommandResult(output="", returncode=-1, error=f"sandbox failed: {err}")
        return watch(proc, workspace, self.limits, stdin=stdin, before=before, start=start,
                     timeout=timeout, since_ns=since_ns)

    def close(self) -> None:
        """Delete every tree this sandbox made."""
        self._finalizer()
