"""Runs every call of a docker sandbox, inside its container.

Started as ``python3 -I -S /run/bat/boot.py CPU_SECONDS MODE ARGV...`` (``MODE`` is
``trace`` when the host observes the call's execs); the host copies this file into the
container read-only and never imports it. Standard library only.

The program's stdout and stderr share one pipe, so they interleave as written, and
boot copies that pipe to the exec's stdout only until the program itself exits: a
background process the call left running keeps the pipe, not the exec, open (the
engine would otherwise hold the call until it ended). The exit status goes out on the
exec's stderr, which no process of the agent holds or can reach, so it cannot be
forged.
"""

import _signal as signal  # not `signal`: it imports enum, a few ms at every call
import ctypes
import os
import resource
import select
import sys

# Not dumpable: processes of the agent's uid can neither ptrace this one nor open its
# descriptors through /proc to write into the exec's streams. The program it execs is
# dumpable again, as usual.
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
cpu = int(sys.argv[1])
argv = sys.argv[3:]
# Every program this call executes reports to the host first (exec_filter.py): the
# host takes the listener from this process by its number and answers each exec.
if sys.argv[2] == "trace":
    sys.path.insert(0, "/run/bat")
    try:
        import exec_filter

        os.write(2, b"listener %d\n" % exec_filter.install_listener())
    except (ImportError, OSError) as exc:
        os.write(2, b"nolistener %s\n" % str(exc).encode(errors="replace")[:200])
r, w = os.pipe()
try:
    pid = os.fork()
except OSError as exc:  # the cgroup's process limit is reached
    os.write(1, f"[cannot start {argv[0]}: {exc.strerror}: too many processes]\n".encode())
    os.write(2, b"status 126\n")
    sys.exit(0)
if pid == 0:
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(w, 1)
        os.dup2(w, 2)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; exec keeps that
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except BaseException as exc:
        os.write(2, f"{argv[0]}: {exc}\n".encode())
    os._exit(127)
os.close(w)
pidfd = os.pidfd_open(pid)


def copy():
    try:
        chunk = os.read(r, 65536)
    except BlockingIOError:
        return False
    view = memoryview(chunk)
    while view:
        view = view[os.write(1, view):]
    return bool(chunk)


open_ = True
while True:
    ready, _, _ = select.select([r, pidfd] if open_ else [pidfd], [], [])
    if r in ready:
        open_ = copy()
    if pidfd in ready:
        break
_, status = os.waitpid(pid, 0)
os.set_blocking(r, False)
for _ in range(256):  # what the program wrote before it exited; later writers are cut off
    if not copy():
        break
os.write(2, b"status %d\n" % os.waitstatus_to_exitcode(status))
