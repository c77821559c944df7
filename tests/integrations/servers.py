"""Servers the integration tests start as subprocesses on 127.0.0.1: a port, and the wait."""

from __future__ import annotations

import socket
import subprocess
import time

__all__ = ["free_port", "wait_for_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(proc: subprocess.Popen, port: int, what: str, timeout_s: float = 60) -> None:
    """Until ``proc`` listens on ``port``; AssertionError naming ``what`` if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{what} did not start") from None
            time.sleep(0.1)
