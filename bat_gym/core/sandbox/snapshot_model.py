"""The snapshot model: a content-addressed manifest of a workspace, and its path rules.

A snapshot is a manifest of ``(path, kind, mode, digest, size)`` entries; its digest
is the sha256 of the canonical JSON of that manifest, so two workspaces with the same
files, modes and links have the same digest whatever their timestamps or owners. The
rules here (:func:`check_member_path`, :func:`check_link`, :class:`SnapshotLimits`) say
what a manifest may hold, wherever it comes from: a scan, a file, an archive.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bat_gym.core.errors import UnsafeSnapshot

__all__ = [
    "KIND_NAMES",
    "MAX_DEPTH",
    "MODE_BITS",
    "Entry",
    "Snapshot",
    "SnapshotLimits",
    "changed_paths",
    "check_link",
    "check_member_path",
    "is_utf8",
    "printable_path",
    "without_paths",
]

KIND_NAMES = {"f": "file", "d": "directory", "l": "symlink"}
"""Entry kinds, spelled out for messages."""
# Setuid, setgid and sticky bits are never recorded: a file restored or materialized
# by a root host must not become a setuid binary of the agent's choosing.
MODE_BITS = 0o777
"""The permission bits a snapshot records."""

MAX_DEPTH = 128
"""Deepest directory level a snapshot may hold (``a/b/c`` is level 3)."""


class Entry(NamedTuple):
    """One manifest line. ``digest`` is the sha256 of the content (file) or target (link)."""

    path: str
    kind: Literal["f", "d", "l"]
    mode: int
    digest: str
    size: int


def changed_paths(before: Snapshot, after: Snapshot) -> tuple[str, ...]:
    """Paths whose entry (kind, mode, content) differs between two snapshots, sorted.

    A path on one side only counts; so does every path under a directory that became
    a file. ``()`` when the digests agree.
    """
    if before.digest == after.digest:
        return ()
    a = {e.path: e for e in before.entries}
    b = {e.path: e for e in after.entries}
    return tuple(sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p)))


def without_paths(snapshot: Snapshot, paths: set[str] | frozenset[str]) -> Snapshot:
    """``snapshot`` less ``paths`` and everything under them."""
    if not paths:
        return snapshot

    def dropped(path: str) -> bool:
        while path:
            if path in paths:
                return True
            path = posixpath.dirname(path)
        return False

    return Snapshot.trusted([e for e in snapshot.entries if not dropped(e.path)])


class SnapshotLimits(BaseModel):
    """Bounds a snapshot or archive must respect before anything is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_files: int = Field(20_000, ge=1, description="Entries (files, dirs, links).")
    max_file_bytes: int = Field(512 << 20, ge=1, description="Largest single file, bytes.")
    max_total_bytes: int = Field(
        2 << 30,
        ge=1,
        description="All file bytes together (apparent size: sparse files count in full).",
    )


def check_member_path(path: str) -> str:
    """Return ``path`` if it is a safe relative workspace path, else raise UnsafeSnapshot.

    Safe means: relative, normalized, no ``..`` component, no NUL, valid UTF-8 (no
    surrogate escapes), at most :data:`MAX_DEPTH` levels. Any other character, a
    newline included, is a legal file name and round-trips through a manifest.
    """
    if not path or path in (".", "/"):
        raise UnsafeSnapshot(path, "empty path")
    if "\x00" in path:
        raise UnsafeSnapshot(path, "NUL in the name")
    if not is_utf8(path):
        raise UnsafeSnapshot(printable_path(path), "the name is not valid UTF-8")
    if path.count("/") >= MAX_DEPTH:
        raise UnsafeSnapshot(path[:200] + "...", f"more than {MAX_DEPTH} directory levels")
    if path.startswith("/"):
        raise UnsafeSnapshot(path, "absolute path")
    if posixpath.normpath(path) != path.rstrip("/") or ".." in path.split("/"):
        raise UnsafeSnapshot(path, "path is not normalized or climbs out with '..'")
    return path.rstrip("/")


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a name with surrogate escapes does not)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def printable_path(path: str) -> str:
    r"""``path`` with undecodable bytes shown as ``\xNN``, for messages."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


def check_link(path: str, target: str) -> None:
    """Refuse a symlink that could resolve outside the workspace.

    Leading ``..`` components climb real directories (the link's own), so checking
    them by text is exact. A ``..`` after a name is not: the name may itself be a
    symlink (``a/l -> ..`` then ``e -> a/l/..`` climbs above the root), so it is refused.
    """
    if target.startswith("/"):
        raise UnsafeSnapshot(path, f"symlink to absolute target {target!r}")
    parts = target.split("/")
    climb = 0
    while climb < len(parts) and parts[climb] == "..":
        climb += 1
    if ".." in parts[climb:]:
        raise UnsafeSnapshot(path, f"symlink target {target!r} has '..' after a name")
    if climb > path.count("/"):
        raise UnsafeSnapshot(path, f"symlink target {target!r} leaves the workspace")


def _manifest_digest(entries: tuple[Entry, ...]) -> str:
    canonical = json.dumps([list(e) for e in entries], separators=(",", ":"), ensure_ascii=False)
    # A name that is not UTF-8 (mid-episode scans see them) hashes as its raw bytes.
    return hashlib.sha256(canonical.encode("utf-8", errors="surrogateescape")).hexdigest()


class Snapshot(BaseModel):
    """An immutable, content-addressed description of a workspace."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entries: tuple[Entry, ...]
    digest: str = ""

    @model_validator(mode="after")
    def _canonical(self) -> Snapshot:
        paths = [e.path for e in self.entries]
        if paths != sorted(paths) or len(set(paths)) != len(paths):
            raise ValueError("snapshot entries must be sorted by path and unique")
        kinds = {e.path: e.kind for e in self.entries}
        for e in self.entries:
            check_member_path(e.path)
            parent = posixpath.dirname(e.path)
            if parent and kinds.get(parent) != "d":
                raise UnsafeSnapshot(e.path, f"parent {parent!r} is not a directory entry")
        computed = _manifest_digest(self.entries)
        if self.digest and self.digest != computed:
            raise ValueError(
                f"snapshot digest {self.digest} does not match its entries ({computed})"
            )
        object.__setattr__(self, "digest", computed)
        return self

    @classmethod
    def of(cls, entries: list[Entry] | tuple[Entry, ...]) -> Snapshot:
        """Build a snapshot from unsorted entries, validating every path and parent."""
        return cls(entries=tuple(sorted(entries, key=lambda e: e.path)))

    @classmethod
    def trusted(cls, entries: list[Entry]) -> Snapshot:
        """Build a snapshot from entries a directory walk read, without per-path checks.

        Names that come from the kernel need none of the checks of :meth:`of`, and
        this is the hot path of every scan; never use it for entries from a file.
        """
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        return cls.model_construct(entries=ordered, digest=_manifest_digest(ordered))

    @property
    def total_bytes(self) -> int:
        """Sum of file sizes, bytes."""
        return sum(e.size for e in self.entries if e.kind == "f")

    def check(self, limits: SnapshotLimits) -> None:
        """Raise UnsafeSnapshot if a link escapes or a size or count bound is exceeded."""
        if len(self.entries) > limits.max_files:
            raise UnsafeSnapshot(
                "<snapshot>", f"{len(self.entries)} entries > limit {limits.max_files}"
            )
        total = 0
        for e in self.entries:
            if e.kind == "f":
                if e.size > limits.max_file_bytes:
                    raise UnsafeSnapshot(
                        e.path, f"{e.size} bytes > per-file limit {limits.max_file_bytes}"
                    )
                total += e.size
        if total > limits.max_total_bytes:
            raise UnsafeSnapshot(
                "<snapshot>", f"{total} bytes > total limit {limits.max_total_bytes}"
            )
