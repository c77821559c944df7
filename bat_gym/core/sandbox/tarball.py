"""Tar archives in and out of a blob store, refusing anything a snapshot may not hold."""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
from pathlib import Path

from bat_gym.core.errors import (
    UnsafeSnapshot,
)
from bat_gym.core.sandbox.blobs import BlobStore
from bat_gym.core.sandbox.snapshot_model import (
    KIND_NAMES,
    Entry,
    Snapshot,
    SnapshotLimits,
    check_link,
    check_member_path,
)

__all__ = ["export_tar", "import_tar"]


def import_tar(
    path: str | Path, store: BlobStore, limits: SnapshotLimits | None = None
) -> Snapshot:
    """Read a tar archive into ``store`` as a snapshot, refusing anything unsafe.

    Refused: absolute names, ``..``, hard links, devices and FIFOs, symlinks that leave
    the archive, members under a symlink or file, duplicate names, and archives past
    ``limits``. Nothing is stored unless the whole archive passes.

    Raises:
        UnsafeSnapshot: naming the first offending member (or the archive, for the
            member count).
    """
    limits = limits or SnapshotLimits()
    entries: dict[str, Entry] = {}
    members: list[tuple[str, tarfile.TarInfo]] = []
    total = 0
    with tarfile.open(path) as tar:
        for m in tar:  # one header at a time: an archive past the count is never loaded whole
            if m.name in (".", "./"):
                continue
            if len(members) >= limits.max_files:
                raise UnsafeSnapshot(str(path), f"more than {limits.max_files} members")
            name = check_member_path(m.name.removeprefix("./"))
            if name in entries:
                raise UnsafeSnapshot(name, "appears twice in the archive")
            mode = m.mode & 0o7777 & ~0o7000  # never carry setuid/setgid/sticky
            if m.isdir():
                entries[name] = Entry(name, "d", mode, "", 0)
            elif m.issym():
                check_link(name, m.linkname)
                entries[name] = Entry(
                    name,
                    "l",
                    0o777,
                    hashlib.sha256(m.linkname.encode()).hexdigest(),
                    len(m.linkname),
                )
            elif m.isreg():
                if m.size > limits.max_file_bytes:
                    raise UnsafeSnapshot(
                        name, f"{m.size} bytes > per-file limit {limits.max_file_bytes}"
                    )
                total += m.size
                if total > limits.max_total_bytes:
                    raise UnsafeSnapshot(
                        name, f"archive exceeds total limit {limits.max_total_bytes} bytes"
                    )
                entries[name] = Entry(name, "f", mode, "", m.size)
            else:
                kind = "hard link" if m.islnk() else "device, FIFO or other special file"
                raise UnsafeSnapshot(name, f"{kind} members are not allowed")
            members.append((name, m))
        for name in list(entries):
            parent = posixpath.dirname(name)
            while parent:  # archives may omit directories; every ancestor is one
                e = entries.setdefault(parent, Entry(parent, "d", 0o755, "", 0))
                if e.kind != "d":
                    raise UnsafeSnapshot(name, f"parent {parent!r} is a {KIND_NAMES[e.kind]}")
                parent = posixpath.dirname(parent)
        if len(entries) > limits.max_files:
            raise UnsafeSnapshot(str(path), f"{len(entries)} entries > limit {limits.max_files}")
        for name, m in members:
            e = entries[name]
            if e.kind == "f":
                data = tar.extractfile(m).read()  # type: ignore[union-attr]
                entries[name] = e._replace(digest=store.put_bytes(data))
            elif e.kind == "l":
                store.put_bytes(m.linkname.encode())
    snap = Snapshot.of(list(entries.values()))
    store.put_snapshot(snap)
    return snap


def export_tar(snapshot: Snapshot, store: BlobStore, path: str | Path) -> None:
    """Write a snapshot as a deterministic tar archive (fixed mtimes and owners)."""
    with tarfile.open(path, "w") as tar:
        for e in snapshot.entries:
            info = tarfile.TarInfo(e.path)
            info.mode, info.mtime, info.uid, info.gid = e.mode, 0, 0, 0
            if e.kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, store.read_blob(e.digest).decode()
                tar.addfile(info)
            else:
                data = store.read_blob(e.digest)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
