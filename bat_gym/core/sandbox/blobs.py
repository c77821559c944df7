"""The blob store: file contents stored once each under their sha256, plus snapshot manifests.

Writes go to a temporary file and are renamed into place, so a killed writer never
leaves a half-written blob under a valid name. :class:`ScratchStore` is a store one
sandbox writes to, over a shared read-only one.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from pathlib import Path

from bat_gym.core.errors import SnapshotNotFound, UnsafeSnapshot
from bat_gym.core.sandbox.snapshot_model import Snapshot
from bat_gym.core.sandbox.trees import remove_tree

__all__ = ["CHUNK", "DIR_FLAGS", "BlobStore", "ScratchStore", "hash_fd"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Flags of every directory a walk opens: never through a symlink."""
CHUNK = 1 << 20
"""Bytes per read when hashing or copying, 1 MiB."""


def hash_fd(fd: int) -> tuple[str, int]:
    """Return the sha256 and length of what is read.

    The size then matches the digest even if the file changed after it was stat-ed.
    """
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


class BlobStore:
    """A directory of immutable blobs named by sha256, plus snapshot manifests.

    Layout: ``blobs/ab/cdef...`` (read-only files) and ``snapshots/<digest>.json``.
    Writes go to a temporary file and are renamed into place, so a killed writer
    never leaves a half-written blob under a valid name.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "snapshots").mkdir(parents=True, exist_ok=True)
        self._known: set[str] = set()
        self._snapshots: dict[str, Snapshot] = {}
        # digest -> (inode, size, ctime) of the blob file when its content was last
        # hashed; ctime cannot be set from user space, so any later write shows.
        self._verified: dict[str, tuple[int, int, int]] = {}

    def blob_path(self, digest: str) -> Path:
        """Where the blob with this sha256 lives (it may not exist)."""
        return self.root / "blobs" / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        """True if the blob is stored."""
        if digest in self._known:
            return True
        if self.blob_path(digest).is_file():
            self._known.add(digest)
            return True
        return False

    def put_bytes(self, data: bytes) -> str:
        """Store ``data``; return its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        if not self.has(digest):
            self._commit(digest, io.BytesIO(data))
        return digest

    def put_fd(self, fd: int, expected: str | None = None) -> str:
        """Copy an open file into the store, hashing as it copies; return the digest."""
        h = hashlib.sha256()
        tmp = tempfile.NamedTemporaryFile(dir=self.root / "blobs", delete=False)  # noqa: SIM115
        try:
            with tmp:
                while chunk := os.read(fd, CHUNK):
                    h.update(chunk)
                    tmp.write(chunk)
            digest = h.hexdigest()
            if expected is not None and digest != expected:
                raise UnsafeSnapshot(
                    "<blob>", f"content changed while it was stored ({expected} -> {digest})"
                )
            if self.has(digest):
                os.unlink(tmp.name)
            else:
                self._place(tmp.name, digest)
            return digest
        except BaseException:
            if os.path.exists(tmp.name):
                os.unlink(tmp.name)
            raise

    def _commit(self, digest: str, src: io.BufferedIOBase | io.BytesIO) -> None:
        with tempfile.NamedTemporaryFile(dir=self.root / "blobs", delete=False) as tmp:
            shutil.copyfileobj(src, tmp)
        self._place(tmp.name, digest)

    def _place(self, tmp_name: str, digest: str) -> None:
        dest = self.blob_path(digest)
        dest.parent.mkdir(exist_ok=True)
        os.chmod(tmp_name, 0o444)
        os.replace(tmp_name, dest)
        self._known.add(digest)

    def open_blob(self, digest: str) -> int:
        """Open a blob for reading; return the fd. Raises SnapshotNotFound."""
        try:
            return os.open(self.blob_path(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SnapshotNotFound(f"blob {digest} is not in the store at {self.root}") from None

    def open_verified(self, digest: str) -> int:
        """Open a blob whose content is known to hash to ``digest``; return the fd.

        A blob is hashed the first time it is opened so, and again whenever its file
        changed since: restores stay O(changed bytes) and a corrupted store never
        reaches a workspace silently.

        Raises:
            SnapshotNotFound: the blob is missing.
            UnsafeSnapshot: its content does not hash to ``digest`` (the store is
                corrupted: ``bat-gym bank verify`` checks every blob).
        """
        fd = self.open_blob(digest)
        try:
            st = os.fstat(fd)
            key = (st.st_ino, st.st_size, st.st_ctime_ns)
            if self._verified.get(digest) != key:
                actual, _ = hash_fd(fd)
                if actual != digest:
                    raise UnsafeSnapshot(
                        digest,
                        f"stored blob at {self.blob_path(digest)} is corrupted (sha256 "
                        f"{actual}); run `bat-gym bank verify` and rebuild what it names",
                    )
                self._verified[digest] = key
                os.lseek(fd, 0, os.SEEK_SET)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def read_blob(self, digest: str) -> bytes:
        """Return a blob's bytes, checking them against the digest."""
        fd = self.open_blob(digest)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != digest:
            raise UnsafeSnapshot(digest, "stored blob is corrupted (sha256 mismatch)")
        return data

    def put_snapshot(self, snapshot: Snapshot) -> str:
        """Store a manifest whose blobs are all present; return its digest."""
        missing = [e.path for e in snapshot.entries if e.kind == "f" and not self.has(e.digest)]
        if missing:
            raise SnapshotNotFound(f"snapshot refers to blobs not in the store: {missing[:5]}")
        path = self.root / "snapshots" / f"{snapshot.digest}.json"
        if not path.exists():
            with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
                tmp.write(snapshot.model_dump_json())
            os.replace(tmp.name, path)
        self._snapshots[snapshot.digest] = snapshot
        return snapshot.digest

    def get_snapshot(self, digest: str) -> Snapshot:
        """Load a manifest by digest; its content is checked against the name."""
        if digest in self._snapshots:
            return self._snapshots[digest]
        path = self.root / "snapshots" / f"{digest}.json"
        try:
            snap = Snapshot.model_validate_json(path.read_text())
        except FileNotFoundError:
            raise SnapshotNotFound(
                f"snapshot {digest} is not in the store at {self.root}"
            ) from None
        if snap.digest != digest:
            raise UnsafeSnapshot(str(path), f"manifest hashes to {snap.digest}, not its name")
        self._snapshots[digest] = snap
        return snap


class ScratchStore(BlobStore):
    """A blob store that writes to a directory of its own and reads through to ``base``.

    What an episode leaves behind when it is frozen for scoring is needed only until
    it is scored: kept in the base store (a Stage Bank's, say) it would grow that store
    by up to a workspace quota per episode, forever. A scratch store holds it instead,
    shares every blob the base already has, and :meth:`clear` drops it all.

    Args:
        root: the scratch directory (emptied by :meth:`clear`).
        base: the store read through to; never written.
    """

    def __init__(self, root: str | Path, base: BlobStore) -> None:
        super().__init__(root)
        self.base = base

    def _has_own(self, digest: str) -> bool:
        if digest in self._known:
            return True
        if BlobStore.blob_path(self, digest).is_file():
            self._known.add(digest)
            return True
        return False

    def has(self, digest: str) -> bool:  # noqa: D102
        return self._has_own(digest) or self.base.has(digest)

    def blob_path(self, digest: str) -> Path:  # noqa: D102
        if not self._has_own(digest) and self.base.has(digest):
            return self.base.blob_path(digest)
        return BlobStore.blob_path(self, digest)

    def get_snapshot(self, digest: str) -> Snapshot:  # noqa: D102
        try:
            return super().get_snapshot(digest)
        except SnapshotNotFound:
            return self.base.get_snapshot(digest)

    def clear(self) -> None:
        """Drop every blob and manifest written here; the base is untouched."""
        for sub in ("blobs", "snapshots"):
            remove_tree_at = self.root / sub
            if remove_tree_at.exists():
                fd = os.open(self.root, DIR_FLAGS)
                try:
                    remove_tree(fd, sub)
                finally:
                    os.close(fd)
            remove_tree_at.mkdir()
        self._known.clear()
        self._snapshots.clear()
        self._verified.clear()
