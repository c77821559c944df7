"""A classic-BPF seccomp filter that denies the syscalls a sandbox never needs.

The filter answers ``EPERM`` to process inspection (``ptrace``, ``process_vm_*``,
``kcmp``), namespace and mount changes, kernel module and keyring calls, ``bpf``,
``perf_event_open``, ``userfaultfd`` and ``io_uring``, and ``ENOSYS`` to every call
made through a foreign ABI (x32, i386). Denying ``ptrace`` is what keeps agent code
from rewriting the sandbox's own supervisor, whose answers the execution record trusts.

The program is built here, in Python, as ``struct sock_filter`` records and handed to
bubblewrap through ``--seccomp FD``.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

__all__ = ["DENIED_SYSCALLS", "build_filter", "filter_fd"]

# Syscall numbers per architecture: (audit arch, {name: number}).
_X86_64 = (
    0xC000003E,
    {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "unshare": 272,
        "setns": 308,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "acct": 163,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "open_by_handle_at": 304,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
    },
)
_AARCH64 = (
    0xC00000B7,
    {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "unshare": 97,
        "setns": 268,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "acct": 89,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "kexec_load": 104,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "open_by_handle_at": 265,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
    },
)
_ARCHES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}
DENIED_SYSCALLS: tuple[str, ...] = tuple(_X86_64[1])

_LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000
# Offsets into struct seccomp_data.
_NR, _ARCH = 0, 4


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """Return the filter program for ``machine`` (default: this one) as raw bytes.

    Raises:
        ValueError: for an architecture with no syscall table here.
    """
    machine = (machine or platform.machine()).lower()
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp syscall table for {machine!r}; known: {sorted(_ARCHES)}")
    arch, table = _ARCHES[machine]
    numbers = sorted(set(table.values()))
    # Layout: [ld arch, jeq arch, ld nr, (jge x32), jeq n_i..., ret allow, ret eperm, ret enosys]
    prog: list[tuple[int, int, int, int]] = [(_LD_ABS_W, 0, 0, _ARCH)]
    has_x32 = arch == _X86_64[0]
    body = 1 + (1 if has_x32 else 0) + len(numbers)  # after the arch check
    # jeq arch: fall through on match, else jump to the final ENOSYS.
    prog.append((_JEQ_K, 0, body + 2, arch))
    prog.append((_LD_ABS_W, 0, 0, _NR))
    if has_x32:
        prog.append((_JGE_K, len(numbers) + 2, 0, _X32_BIT))
    for i, nr in enumerate(numbers):
        prog.append((_JEQ_K, len(numbers) - i, 0, nr))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    prog.append((_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    prog.append((_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))
    return b"".join(_insn(*i) for i in prog)


def filter_fd(machine: str | None = None) -> int:
    """Return a readable fd positioned at the start of the filter program."""
    fd = os.memfd_create("bat-gym-seccomp", 0)
    os.write(fd, build_filter(machine))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
