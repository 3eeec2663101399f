"""The system-call filter of sandboxed commands (seccomp), with ``no_new_privs``.

Kernel keyrings are not namespaced by the mount, network, IPC or PID namespaces a command
gets: the keyring of the user ``nobody`` is one for the whole host, so a value one command
adds there (a hidden test read during scoring) could be read by a command of a later episode
or of another task. The filter refuses the keyring calls (``add_key``, ``request_key``,
``keyctl``) with ``ENOSYS``, and a few calls no test needs that widen the kernel's attack
surface (``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module loading,
``kexec``). Calls of another architecture's ABI (32-bit calls on x86-64) kill the process.

The filter is compiled once, in the parent, by libseccomp (``seccomp_export_bpf``, through
:mod:`ctypes` as the rest of the sandbox calls the C library), and loaded in each command's
child between fork and exec with two ``prctl`` calls: nothing is allocated there. Where
libseccomp is missing or the kernel refuses the filter, :func:`syscall_filter` returns
``None`` and ``Sandbox.containment["syscall_filter"]`` says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import subprocess
import tempfile
from dataclasses import dataclass, field

__all__ = ["DENIED", "SyscallFilter", "no_new_privs", "syscall_filter"]

DENIED = ("add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load",
          "kexec_file_load", "init_module", "finit_module", "delete_module")
"""System calls a sandboxed command gets ``ENOSYS`` for."""

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_ERRNO = 0x00050000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@dataclass(frozen=True)
class SyscallFilter:
    """A compiled filter (classic BPF instructions, 8 bytes each)."""

    program: bytes
    _buffer: ctypes.Array[ctypes.c_char] = field(init=False, repr=False, compare=False)
    _fprog: _SockFprog = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        buffer = ctypes.create_string_buffer(self.program, len(self.program))
        object.__setattr__(self, "_buffer", buffer)
        object.__setattr__(self, "_fprog", _SockFprog(len(self.program) // 8,
                                                      ctypes.addressof(buffer)))

    def load(self, libc: ctypes.CDLL) -> None:
        """Set ``no_new_privs`` and load the filter into this process (and everything it
        starts). Runs in the command's child between fork and exec; raises ``OSError``
        when the kernel refuses."""
        no_new_privs(libc)
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(self._fprog),
                      0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def no_new_privs(libc: ctypes.CDLL) -> None:
    """Set ``no_new_privs`` in this process: nothing it executes gains privileges (set-user-ID
    programs, file capabilities). Set with the filter, and alone where there is no filter;
    raises ``OSError`` when the kernel refuses."""
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _compile() -> bytes | None:
    name = ctypes.util.find_library("seccomp")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_uint]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    context = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not context:
        return None
    try:
        for call in DENIED:
            number = lib.seccomp_syscall_resolve_name(call.encode())
            if number >= 0 and lib.seccomp_rule_add(
                    context, _SCMP_ACT_ERRNO | errno.ENOSYS, number, 0) != 0:
                return None
        with tempfile.TemporaryFile() as out:
            status = lib.seccomp_export_bpf(context, out.fileno())
            out.seek(0)
            program = out.read()
        return program if status == 0 and program and len(program) % 8 == 0 else None
    finally:
        lib.seccomp_release(context)


@functools.cache
def syscall_filter() -> SyscallFilter | None:
    """The filter, compiled and tried once per process (``None`` where it cannot be)."""
    program = _compile()
    libc_name = ctypes.util.find_library("c")
    if program is None or libc_name is None:
        return None
    compiled = SyscallFilter(program)
    libc = ctypes.CDLL(libc_name, use_errno=True)
    try:
        done = subprocess.run(["true"], preexec_fn=lambda: compiled.load(libc), timeout=30,
                              capture_output=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return compiled if done.returncode == 0 else None
