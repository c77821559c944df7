"""The C library, loaded once, for the few system calls Python does not wrap."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["libc"]


@functools.cache
def libc() -> ctypes.CDLL:
    """The process's libc, with ``errno`` kept for ``ctypes.get_errno``."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
