"""A frozen workspace: the files of one snapshot, read from the blob store by digest.

The verifier never looks at a live sandbox directory. When an episode ends the
workspace is captured (:meth:`bat_gym.core.sandbox.Sandbox.freeze`), and every check reads
that snapshot's blobs, each checked against its sha256 on the way in. Whatever the
agent's processes do afterwards cannot change what is scored, and two verifications of
the same snapshot read the same bytes.

Symlinks are never followed: a path that is a link is not a file here, so an agent
cannot point an artifact at a file it was not meant to produce.
"""

from __future__ import annotations

import contextlib
import posixpath
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from bat_gym.core.sandbox.snapshot import BlobStore, Entry, Snapshot, WorkspaceIndex

__all__ = ["FrozenWorkspace", "MAX_READ_BYTES", "path_matches"]

MAX_READ_BYTES = 16 << 20
"""Largest file a check reads, bytes. Artifacts of the reference stages are small; a
bigger one is refused rather than loaded, so a policy cannot stall the verifier."""


def path_matches(path: str, pattern: str) -> bool:
    """True if ``path`` is ``pattern`` or lies under it.

    Args:
        path: a workspace-relative file path, e.g. ``"plan/plan.md"``.
        pattern: a file path (``"task.json"``) or a directory (``"plan"`` or ``"plan/"``).

    >>> path_matches("plan/plan.md", "plan/"), path_matches("plans.md", "plan")
    (True, False)
    """
    directory = pattern.rstrip("/")
    return path == directory or path.startswith(directory + "/")


class FrozenWorkspace:
    """The regular files of a stored snapshot, read-only.

    Args:
        snapshot: the manifest; every file blob must be in ``store``.
        store: the blob store holding the contents.
    """

    def __init__(self, snapshot: Snapshot, store: BlobStore) -> None:
        self.snapshot = snapshot
        self.store = store
        self._files: dict[str, Entry] = {e.path: e for e in snapshot.entries if e.kind == "f"}
        self._links = frozenset(e.path for e in snapshot.entries if e.kind == "l")
        self._blobs: dict[str, bytes] = {}

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[Path]:
        """The snapshot written out to a private temporary directory, for path-based metrics.

        Metrics that need real files (NIfTI, DICOM readers) use this; the directory is
        a fresh copy outside every sandbox and is deleted on exit.
        """
        with tempfile.TemporaryDirectory(prefix="bat-gym-frozen-") as tmp:
            WorkspaceIndex(tmp).restore(self.snapshot, self.store)
            yield Path(tmp)

    @classmethod
    def load(cls, store: BlobStore, digest: str) -> FrozenWorkspace:
        """The workspace of the stored snapshot ``digest``.

        Raises:
            SnapshotNotFound: no such snapshot in ``store``.
        """
        return cls(store.get_snapshot(digest), store)

    @classmethod
    def from_files(cls, store: BlobStore, files: Mapping[str, bytes | str]) -> FrozenWorkspace:
        """Store ``files`` (path to content; text is UTF-8 encoded) as a snapshot.

        Parent directories are added, so the snapshot restores like a captured one.
        Used by tests, benchmarks and tools that score workspaces built by hand.
        """
        entries: dict[str, Entry] = {}
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            entries[path] = Entry(path, "f", 0o644, store.put_bytes(data), len(data))
            parent = posixpath.dirname(path)
            while parent and parent not in entries:
                entries[parent] = Entry(parent, "d", 0o755, "", 0)
                parent = posixpath.dirname(parent)
        snapshot = Snapshot.of(list(entries.values()))
        store.put_snapshot(snapshot)
        return cls(snapshot, store)

    @property
    def digest(self) -> str:
        """The snapshot's digest."""
        return self.snapshot.digest

    def paths(self, under: str | None = None) -> list[str]:
        """Regular-file paths, sorted; only those at or under ``under`` when given."""
        if under is None:
            return sorted(self._files)
        return sorted(p for p in self._files if path_matches(p, under))

    def exists(self, path: str) -> bool:
        """True if ``path`` is a regular file (a symlink is not)."""
        return path in self._files

    def is_link(self, path: str) -> bool:
        """True if ``path`` is a symlink in the snapshot."""
        return path in self._links

    def sha256(self, path: str) -> str | None:
        """The file's sha256 (hex), or None if it is not a regular file."""
        entry = self._files.get(path)
        return entry.digest if entry is not None else None

    def size(self, path: str) -> int | None:
        """The file's size in bytes, or None if it is not a regular file."""
        entry = self._files.get(path)
        return entry.size if entry is not None else None

    def read_bytes(self, path: str) -> bytes:
        """The file's content, checked against its sha256.

        Raises:
            FileNotFoundError: ``path`` is not a regular file of the snapshot.
            ValueError: the file is larger than :data:`MAX_READ_BYTES`.
            SnapshotNotFound: the blob is missing from the store (an infrastructure fault).
        """
        entry = self._files.get(path)
        if entry is None:
            what = "a symlink, not a file" if path in self._links else "not in the workspace"
            raise FileNotFoundError(f"{path} is {what}")
        if entry.size > MAX_READ_BYTES:
            raise ValueError(f"{path} is {entry.size} bytes, over the {MAX_READ_BYTES}-byte limit")
        data = self._blobs.get(entry.digest)
        if data is None:
            data = self._blobs[entry.digest] = self.store.read_blob(entry.digest)
        return data

    def read_text(self, path: str) -> str:
        """The file decoded as UTF-8 (a leading byte-order mark is dropped).

        Raises:
            FileNotFoundError, ValueError: as :meth:`read_bytes`; ``UnicodeDecodeError``
                (a ``ValueError``) when the bytes are not UTF-8.
        """
        return self.read_bytes(path).decode("utf-8-sig")
