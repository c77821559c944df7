"""Where bat_gym keeps files, and how it writes them.

Atomic file writes: a reader sees the old file or the whole new one, never part of it.
Resumable work (bank builds, evaluations, the BiCuRL loop) decides what is finished by
what is on disk, so every such file is written through :func:`write_atomic`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["cache_dir", "write_atomic"]


def cache_dir() -> Path:
    """bat_gym's cache (``BAT_GYM_CACHE``, else ``$XDG_CACHE_HOME/bat_gym``)."""
    base = os.environ.get("BAT_GYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "bat_gym"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


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
