"""Atomic file writes: a reader sees the old file or the whole new one, never part of it.

Resumable work (bank builds, evaluations, the BiCuRL loop) decides what is finished by
what is on disk, so every such file is written through :func:`write_atomic`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` by temporary file, fsync and rename.

    The temporary file sits beside ``path`` (a rename is atomic only within one
    filesystem), hidden and named per process and thread, so concurrent writers of one
    directory never share it, and it never matches a glob for ``*.json``.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(raw)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
