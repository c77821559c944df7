"""Wait for descriptors to become readable, whatever their number.

``select.select`` refuses descriptors numbered 1024 or above (``FD_SETSIZE``), and a
process that runs hundreds of sandboxes holds thousands of descriptors. ``poll`` has
no such limit; this is the one place the host side waits on sandbox descriptors.
"""

from __future__ import annotations

import select
from collections.abc import Iterable

__all__ = ["readable"]

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


def readable(fds: Iterable[int], timeout_s: float | None) -> set[int]:
    """The descriptors of ``fds`` that are readable (or closed at the other end).

    Args:
        fds: descriptors to watch.
        timeout_s: seconds to wait at most; None waits without limit, 0 polls.

    Returns:
        The ready descriptors; empty when ``timeout_s`` passed first.
    """
    poller = select.poll()
    for fd in fds:
        poller.register(fd, _READABLE)
    timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000 + 0.999))
    return {fd for fd, _ in poller.poll(timeout_ms)}
