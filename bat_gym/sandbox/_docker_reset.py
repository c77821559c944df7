"""Kills every process of the agent's uid and, with ``clear``, empties /tmp.

Runs inside a docker sandbox's container as that uid (``python3 -I -S
/run/bat/reset.py clear|keep``); the host copies this file into the container
read-only and never imports it. Standard library only.

``kill(-1)`` spares the caller and the namespace's init, but reports success whenever
any process exists, so whether agent processes remain is read from /proc (dead ones
are zombies until init reaps them). Nothing here forks, so it works even when a fork
bomb holds every pid the cgroup allows. Prints "done" only if it finished.
"""

import os
import signal
import sys
import time

me, uid = os.getpid(), os.getuid()


def alive():
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if fields[b"State"].split()[0] in (b"Z", b"X"):
                continue
            if int(fields[b"Uid"].split()[0]) == uid:
                return True
        except (OSError, KeyError, IndexError, ValueError):
            continue
    return False


def remove(path):
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    os.chmod(path, 0o700)  # the agent may have made its own directories unreadable
    for name in os.listdir(path):
        remove(os.path.join(path, name))
    os.rmdir(path)


deadline = time.monotonic() + 5
while True:
    try:  # noqa: SIM105 - contextlib would cost an import under a fork bomb
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:  # nothing of the uid is left
        pass
    if not alive():
        break
    if time.monotonic() > deadline:
        sys.exit(3)
if sys.argv[1:] == ["clear"]:
    for name in os.listdir("/tmp"):
        remove(os.path.join("/tmp", name))
sys.stdout.write("done\n")
