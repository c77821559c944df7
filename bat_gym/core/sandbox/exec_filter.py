"""The seccomp filter that reports every program a sandbox executes to the host.

The filter answers ``SECCOMP_RET_USER_NOTIF`` to ``execve`` and ``execveat``, ``EPERM``
to a ``seccomp`` call that asks for a listener of its own, and allows everything else (the deny filter of :mod:`bat_gym.core.sandbox.seccomp` still
applies: the kernel runs every installed filter and the strictest answer wins). An
``exec`` then waits until whoever holds the filter's listener descriptor answers;
the host's :class:`~bat_gym.core.sandbox.exec_trace.ExecTracer` reads the program's path
and argv from the caller's memory and lets the call continue. Nothing else is refused:
the filter records, it does not decide.

Why no process under it may make a listener: where two filters both answer
``USER_NOTIF``, the kernel notifies the most recently installed one, so agent code
with a listener of its own would receive its children's execs in place of the host.

The process that installs the filter (the sandbox's supervisor, in either backend)
hands its listener to the host and never executes
anything itself after that; its children inherit the filter and cannot remove it.

This module must import nothing outside the standard library: it is loaded by path
inside sandboxes, where bat_gym itself is hidden.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

__all__ = ["EXEC_SYSCALLS", "build_notify_filter", "install_listener"]

# (audit arch, seccomp syscall number, {name: number}) per architecture.
_TABLES = {
    "x86_64": (0xC000003E, 317, {"execve": 59, "execveat": 322, "seccomp": 317}),
    "aarch64": (0xC00000B7, 277, {"execve": 221, "execveat": 281, "seccomp": 277}),
}
_TABLES["amd64"] = _TABLES["x86_64"]
_TABLES["arm64"] = _TABLES["aarch64"]
EXEC_SYSCALLS: tuple[str, ...] = ("execve", "execveat")

_LD_ABS_W, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_ARG1_LOW = 24  # seccomp_data.args[1], low 32 bits (little-endian)
_RET_ALLOW = 0x7FFF0000
_RET_USER_NOTIF = 0x7FC00000
_SET_MODE_FILTER = 1
_FLAG_NEW_LISTENER = 1 << 3
_PR_SET_NO_NEW_PRIVS = 38


def _table(machine: str | None) -> tuple[int, int, dict[str, int]]:
    machine = (machine or os.uname().machine).lower()
    if machine not in _TABLES:
        raise ValueError(f"no exec syscall table for {machine!r}; known: {sorted(_TABLES)}")
    return _TABLES[machine]


def build_notify_filter(machine: str | None = None) -> bytes:
    """The filter program as raw ``struct sock_filter`` records.

    A call through a foreign ABI is allowed here because the deny filter already
    answers it ``ENOSYS``. Jump offsets count from the next instruction.
    """
    arch, _, calls = _table(machine)
    if not sys.byteorder == "little":
        raise ValueError("the listener check reads args[1] as a little-endian word")
    prog = [
        (_LD_ABS_W, 0, 0, 4),  # 0: seccomp_data.arch
        (_JEQ_K, 0, 6, arch),  # 1: another ABI -> 8 allow
        (_LD_ABS_W, 0, 0, 0),  # 2: seccomp_data.nr
        (_JEQ_K, 5, 0, calls["execve"]),  # 3: -> 9 notify
        (_JEQ_K, 4, 0, calls["execveat"]),  # 4: -> 9 notify
        (_JEQ_K, 0, 2, calls["seccomp"]),  # 5: else -> 8 allow
        (_LD_ABS_W, 0, 0, _ARG1_LOW),  # 6: the seccomp call's flags
        (_JSET_K, 2, 0, _FLAG_NEW_LISTENER),  # 7: asks for a listener -> 10 EPERM
        (_RET_K, 0, 0, _RET_ALLOW),  # 8
        (_RET_K, 0, 0, _RET_USER_NOTIF),  # 9
        (_RET_K, 0, 0, _RET_EPERM),  # 10
    ]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_listener(machine: str | None = None) -> int:
    """Install the filter on the calling thread and return the listener descriptor.

    Sets ``no_new_privs`` first (the kernel requires it without ``CAP_SYS_ADMIN``).
    Install it before the process starts any thread: the filter applies to the
    calling thread and to what it creates afterwards.

    Raises:
        OSError: the kernel refused (no user notification support, or seccomp off).
    """
    _, nr, _ = _table(machine)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    code = build_notify_filter(machine)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(
        ctypes.c_long(nr),
        ctypes.c_long(_SET_MODE_FILTER),
        ctypes.c_long(_FLAG_NEW_LISTENER),
        ctypes.byref(prog),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER): {os.strerror(err)}")
    os.set_inheritable(fd, False)
    return int(fd)
