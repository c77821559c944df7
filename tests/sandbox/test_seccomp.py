"""The seccomp filter: a well-formed program that denies what it says, also in a sandbox."""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Iterator

import pytest

from bat_gym.core.sandbox import SandboxLimits, make_sandbox
from bat_gym.core.sandbox.base import Isolation, Sandbox
from bat_gym.core.sandbox.local import detect_isolation
from bat_gym.core.sandbox.seccomp import _AARCH64, _X86_64, DENIED_SYSCALLS, build_filter

ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
ARCHES = {"x86_64": _X86_64, "aarch64": _AARCH64}


def decode(prog: bytes) -> list[tuple[int, int, int, int]]:
    assert len(prog) % 8 == 0, "not a whole number of sock_filter records"
    return [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]


def run_filter(prog: list[tuple[int, int, int, int]], arch: int, nr: int) -> int:
    """Evaluate the classic-BPF program the way the kernel does for one syscall."""
    data = struct.pack("=iI", nr, arch)  # struct seccomp_data: nr, arch, ...
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x15:  # jeq #k
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:  # jge #k
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")


@pytest.mark.parametrize("machine", list(ARCHES))
def test_filter_is_well_formed(machine: str) -> None:
    prog = decode(build_filter(machine))
    assert len(prog) <= 4096  # BPF_MAXINSNS
    assert prog[0] == (0x20, 0, 0, 4), "the first instruction must load the arch"
    assert prog[-1][0] == 0x06, "the program must end in a return"
    for pc, (code, jt, jf, _) in enumerate(prog):
        assert code in (0x20, 0x15, 0x35, 0x06), f"unexpected opcode at {pc}"
        if code in (0x15, 0x35):  # jumps go forward and land inside the program
            assert pc + 1 + max(jt, jf) < len(prog), f"jump out of range at {pc}"


@pytest.mark.parametrize("machine", list(ARCHES))
def test_filter_denies_exactly_the_listed_syscalls(machine: str) -> None:
    arch, table = ARCHES[machine]
    prog = decode(build_filter(machine))
    assert set(table) == set(DENIED_SYSCALLS)
    for name, nr in table.items():
        assert run_filter(prog, arch, nr) == EPERM, name
    denied = set(table.values())
    for nr in range(0, 460):
        if nr not in denied:
            assert run_filter(prog, arch, nr) == ALLOW, nr
    assert run_filter(prog, 0x40000003, 0) == ENOSYS  # a foreign ABI (i386)
    if machine == "x86_64":
        assert run_filter(prog, arch, 0x40000000 | 39) == ENOSYS  # x32 getpid


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="no seccomp syscall table"):
        build_filter("sparc64")


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    best, why = detect_isolation()
    if best is not Isolation.BWRAP:
        pytest.skip(f"no bubblewrap isolation here: {why}")
    box = make_sandbox("local", limits=SandboxLimits(timeout_s=20))
    yield box
    box.close()


PTRACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, args in [("ptrace", (0, 0, 0, 0)), ("ptrace", (16, 1, 0, 0))]:  # TRACEME, ATTACH 1
    rc = getattr(libc, name)(*args)
    print(name, args[0], rc, os.strerror(ctypes.get_errno()))
"""


def test_ptrace_is_denied_inside(sb: Sandbox) -> None:
    r = sb.execute_code("python", PTRACE)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "ptrace 0 -1 Operation not permitted",
        "ptrace 16 -1 Operation not permitted",
    ]


def test_namespace_and_mount_changes_are_denied_inside(sb: Sandbox) -> None:
    for cmd in ("unshare -U true", "unshare -r true", "unshare -n true", "mount -t tmpfs x /tmp"):
        r = sb.execute_code("bash", cmd)
        assert r.exit_code not in (0, None), f"{cmd!r} succeeded: {r.output}"
    r = sb.execute_code("bash", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status")
    assert r.output.split() == ["NoNewPrivs:", "1", "Seccomp:", "2"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x32 ABI exists on x86_64 only")
def test_foreign_abi_is_refused_inside(sb: Sandbox) -> None:
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.syscall(0x40000000 | 39), os.strerror(ctypes.get_errno()))\n"
    )
    r = sb.execute_code("python", code)
    assert r.output == "-1 Function not implemented\n", r.output
