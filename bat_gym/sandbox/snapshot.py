"""Content-addressed workspace snapshots, and exact, incremental restore.

A snapshot is a manifest of ``(path, kind, mode, digest, size)`` entries; its digest
is the sha256 of the canonical JSON of that manifest, so two workspaces with the same
files, modes and links have the same digest whatever their timestamps or owners.
File contents live once each in a :class:`BlobStore` under their own sha256.

:class:`WorkspaceIndex` keeps, per path, the ``lstat`` key it last saw and the digest
it computed then. Scanning a workspace rehashes only files whose key changed, and
restoring rewrites only entries that differ, so both cost O(files) ``lstat`` calls
plus O(changed bytes), never a re-run of history or a rehash of everything.

Every walk goes through directory file descriptors opened with ``O_NOFOLLOW``: code in
the sandbox may plant symlinks, FIFOs or swap directories, and the host side (often
root) must never follow one out of the workspace. Walks are iterative and bounded:
agent code decides how deep and how wide a tree is, so a scan stops with
:class:`~bat_gym.errors.WorkspaceQuotaExceeded` past :class:`SnapshotLimits`, and a tree
deeper than :data:`MAX_DEPTH` levels is refused as
:class:`~bat_gym.errors.UnsafeWorkspace`. What :meth:`WorkspaceIndex.capture` stores
can always be loaded again: it refuses what a manifest could not hold (names that are
not UTF-8, links that leave the workspace) with ``UnsafeWorkspace`` instead.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bat_gym.errors import (
    SnapshotNotFound,
    UnsafeSnapshot,
    UnsafeWorkspace,
    WorkspaceQuotaExceeded,
    WorkspaceRejected,
)
from bat_gym.sandbox.trees import open_dir, remove_tree
from bat_gym.sandbox.watch import ChangeWatch

__all__ = [
    "MAX_DEPTH",
    "Entry",
    "Snapshot",
    "SnapshotLimits",
    "BlobStore",
    "ScratchStore",
    "WorkspaceIndex",
    "changed_paths",
    "check_member_path",
    "import_tar",
    "export_tar",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
_MAX_OPEN_DIRS = 256  # directory descriptors a restore keeps open at once
_KIND_NAMES = {"f": "file", "d": "directory", "l": "symlink"}
# Setuid, setgid and sticky bits are never recorded: a file restored or materialized
# by a root host must not become a setuid binary of the agent's choosing.
_MODE_BITS = 0o777

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

    return Snapshot._trusted([e for e in snapshot.entries if not dropped(e.path)])


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
    if not _is_utf8(path):
        raise UnsafeSnapshot(_printable(path), "the name is not valid UTF-8")
    if path.count("/") >= MAX_DEPTH:
        raise UnsafeSnapshot(path[:200] + "...", f"more than {MAX_DEPTH} directory levels")
    if path.startswith("/"):
        raise UnsafeSnapshot(path, "absolute path")
    if posixpath.normpath(path) != path.rstrip("/") or ".." in path.split("/"):
        raise UnsafeSnapshot(path, "path is not normalized or climbs out with '..'")
    return path.rstrip("/")


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _printable(path: str) -> str:
    r"""``path`` with undecodable bytes shown as ``\xNN``, for messages."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


def _check_link(path: str, target: str) -> None:
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
    def _trusted(cls, entries: list[Entry]) -> Snapshot:
        # Entries read back from a directory walk: names come from the kernel, so the
        # per-path checks of ``of`` are skipped on this hot path.
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
                while chunk := os.read(fd, _CHUNK):
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
                actual, _ = _hash_fd(fd)
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
                fd = os.open(self.root, _DIR_FLAGS)
                try:
                    remove_tree(fd, sub)
                finally:
                    os.close(fd)
            remove_tree_at.mkdir()
        self._known.clear()
        self._snapshots.clear()
        self._verified.clear()


@dataclass
class _Seen:
    key: tuple[int, int, int, int, int]
    entry: Entry


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # ctime cannot be set from user space, so an edit followed by utime() still shows.
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _hash_fd(fd: int) -> tuple[str, int]:
    """Return the sha256 and length of what is read.

    The size then matches the digest even if the file changed after it was stat-ed.
    """
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, _CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def _sendfile(src: int, dst: int, count: int) -> int:
    return os.sendfile(dst, src, None, count)


class WorkspaceIndex:
    """Incremental digests and in-place restore for one workspace directory.

    Args:
        root: the workspace directory on the host.
        owner: ``(uid, gid)`` given to files the restore creates, so an unprivileged
            sandbox user can edit them; ``None`` keeps the caller's.
        watch: keep an inotify watch on the tree, so a scan with nothing changed since
            the last one costs one ``read`` instead of a walk.
        limits: what a scan may find before it stops with ``WorkspaceQuotaExceeded``.
        max_watches: directories watched at most; past it every scan walks the tree
            (inotify watches are a host-wide budget of the user, shared by every
            process).
    """

    def __init__(
        self,
        root: str | Path,
        owner: tuple[int, int] | None = None,
        *,
        watch: bool = False,
        limits: SnapshotLimits | None = None,
        max_watches: int = 2048,
    ) -> None:
        self.root = Path(root)
        self.owner = owner
        self.limits = limits or SnapshotLimits()
        self._seen: dict[str, _Seen] = {}
        self._last: Snapshot | None = None
        self._watch: ChangeWatch | None = None
        if watch:
            try:
                self._watch = ChangeWatch(max_watches)
            except OSError:
                self._watch = None  # no inotify: every scan walks the tree

    def close(self) -> None:
        """Release the change watch, if any."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    # -- scanning ---------------------------------------------------------------------

    def scan(self) -> Snapshot:
        """Describe the workspace as it is now, rehashing only changed files.

        With a change watch and no event since the last scan, this is one ``read``.
        FIFOs, sockets and devices are left out: they have no content to restore.

        Raises:
            WorkspaceQuotaExceeded: more entries or (apparent) file bytes than
                :attr:`limits` allow; the walk stops there, so its cost is bounded.
            UnsafeWorkspace: the tree is deeper than :data:`MAX_DEPTH` levels.
        """
        if self._last is not None and self._watch is not None and not self._watch.changed():
            return self._last
        if self._watch is not None:
            # Before the walk, not after: an event raised while walking, or a watch
            # that could not be added, must leave the next scan walking again.
            self._watch.clear()
        entries: list[Entry] = []
        seen: dict[str, _Seen] = {}
        try:
            self._walk(entries, seen)
        except BaseException:
            if self._watch is not None:
                self._watch.dirty = True  # the walk is unfinished: never trust _last
            raise
        if (
            self._last is not None
            and seen.keys() == self._seen.keys()
            and all(seen[p].key == self._seen[p].key for p in seen)
        ):
            return self._last
        self._seen = seen
        self._last = Snapshot._trusted(entries)
        return self._last

    def take_reads(self) -> frozenset[str] | None:
        """Workspace files closed without writing since the last take (see ``ChangeWatch``).

        ``None`` without a change watch, or when events were lost.
        """
        return None if self._watch is None else self._watch.take_reads()

    def _children(self, dir_fd: int, path: str = "") -> list[os.DirEntry[str]]:
        if self._watch is not None:
            self._watch.add(dir_fd, path)
        with os.scandir(dir_fd) as it:
            return list(it)

    def _walk(self, entries: list[Entry], seen: dict[str, _Seen]) -> None:
        """Depth first, one open descriptor per level, counting against the limits."""
        limits = self.limits
        total = 0
        root_fd = os.open(self.root, _DIR_FLAGS)
        stack = [(root_fd, "", iter(self._children(root_fd)))]
        try:
            while stack:
                dir_fd, prefix, children = stack[-1]
                child = next(children, None)
                if child is None:
                    os.close(dir_fd)
                    stack.pop()
                    continue
                path = prefix + child.name
                try:
                    st = child.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if len(entries) >= limits.max_files:
                    raise WorkspaceQuotaExceeded(
                        "", f"more than {limits.max_files} files, directories and links"
                    )
                key = _stat_key(st)
                mode = stat.S_IMODE(st.st_mode) & _MODE_BITS
                if stat.S_ISDIR(st.st_mode):
                    entry = Entry(path, "d", mode, "", 0)
                    seen[path] = _Seen(key, entry)
                    entries.append(entry)
                    if len(stack) >= MAX_DEPTH:
                        raise UnsafeWorkspace(
                            _printable(path)[:200] + "...",
                            f"more than {MAX_DEPTH} directory levels",
                        )
                    try:
                        sub = os.open(child.name, _DIR_FLAGS, dir_fd=dir_fd)
                    except (FileNotFoundError, NotADirectoryError, PermissionError):
                        continue
                    try:
                        listing = self._children(sub, path)
                    except OSError:
                        os.close(sub)
                        continue
                    stack.append((sub, path + "/", iter(listing)))
                    continue
                entry = self._entry(dir_fd, child, path, key, mode, st)
                if entry is None:
                    continue
                if entry.kind == "f":
                    total += entry.size
                    if total > limits.max_total_bytes:
                        raise WorkspaceQuotaExceeded(
                            "",
                            f"more than {limits.max_total_bytes >> 20} MiB of files "
                            "(apparent size: sparse files count in full)",
                        )
                seen[path] = _Seen(key, entry)
                entries.append(entry)
        finally:
            for fd, _, _ in stack:
                os.close(fd)

    def _entry(
        self,
        dir_fd: int,
        child: os.DirEntry[str],
        path: str,
        key: tuple[int, int, int, int, int],
        mode: int,
        st: os.stat_result,
    ) -> Entry | None:
        """The manifest line of a non-directory, rehashed only if its key changed."""
        old = self._seen.get(path)
        if old is not None and old.key == key:
            return old.entry
        if stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(child.name, _READ_FLAGS, dir_fd=dir_fd)
            except OSError:
                return None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                return Entry(path, "f", mode, *_hash_fd(fd))
            finally:
                os.close(fd)
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.fsencode(os.readlink(child.name, dir_fd=dir_fd))
            except OSError:
                return None
            return Entry(path, "l", 0o777, hashlib.sha256(target).hexdigest(), len(target))
        return None

    def link_target(self, path: str) -> str:
        """The target of a symlink in the workspace (for capture), read without following."""
        parent, _, name = path.rpartition("/")
        fd = self._open_nofollow(parent) if parent else os.open(self.root, _DIR_FLAGS)
        try:
            return os.readlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    # -- capture ----------------------------------------------------------------------

    def capture(self, store: BlobStore, limits: SnapshotLimits | None = None) -> Snapshot:
        """Scan, copy new file contents into ``store`` and store the manifest.

        Raises:
            WorkspaceQuotaExceeded: the workspace is past ``limits`` (default: the
                index's own).
            UnsafeWorkspace: it holds what a manifest cannot keep or the host must not
                follow (an escaping link, a name that is not UTF-8, a tree too deep),
                or it changed while it was read. Nothing of it is stored then.
        """
        snap = self.scan()
        if limits is not None:
            try:
                snap.check(limits)
            except UnsafeSnapshot as exc:
                raise WorkspaceQuotaExceeded(exc.path.strip("<>"), exc.reason) from None
        try:
            targets: dict[str, str] = {}
            for e in snap.entries:
                check_member_path(e.path)
                if e.kind == "l":
                    target = self.link_target(e.path)
                    if not _is_utf8(target):
                        raise UnsafeSnapshot(e.path, "the link target is not valid UTF-8")
                    _check_link(e.path, target)
                    targets[e.path] = target
            for e in snap.entries:
                if e.kind == "l":
                    store.put_bytes(targets[e.path].encode())
                elif e.kind == "f" and not store.has(e.digest):
                    fd = self._open_nofollow(e.path)
                    try:
                        store.put_fd(fd, expected=e.digest)
                    finally:
                        os.close(fd)
        except WorkspaceRejected:
            raise
        except UnsafeSnapshot as exc:
            raise UnsafeWorkspace(exc.path, exc.reason) from None
        except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
            raise UnsafeWorkspace("", f"the workspace changed while it was read ({exc})") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a directory swapped for a link meanwhile
                raise UnsafeWorkspace(
                    "", f"the workspace changed while it was read ({exc})"
                ) from None
            raise
        store.put_snapshot(snap)
        return snap

    def _open_nofollow(self, path: str) -> int:
        """Open ``path`` (a file, or a directory) without following any link on the way."""
        parts = path.split("/")
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            return os.open(parts[-1], _READ_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)

    # -- restore ----------------------------------------------------------------------

    def restore(self, snapshot: Snapshot, store: BlobStore) -> int:
        """Make the workspace equal ``snapshot`` in place; return how many entries changed.

        Entries whose ``lstat`` key is what this index last recorded for the same
        content are kept; everything else is removed and recreated from blobs. Call it
        only while no process writes to the workspace.

        Raises:
            SnapshotNotFound: a blob the snapshot needs is not in ``store``; nothing in
                the workspace has been touched.
            UnsafeSnapshot: a symlink in the snapshot would leave the workspace.
        """
        missing = [e.path for e in snapshot.entries if e.kind != "d" and not store.has(e.digest)]
        if missing:
            raise SnapshotNotFound(f"blobs for {missing[:5]} are not in the store at {store.root}")
        want = {e.path: e for e in snapshot.entries}
        root_fd = os.open(self.root, _DIR_FLAGS)
        fds: dict[str, int] = {"": root_fd}

        def dir_fd(path: str) -> int:
            if path not in fds:
                if len(fds) > _MAX_OPEN_DIRS:  # a wide tree: reopen through the parents
                    for p in [p for p in fds if p]:
                        os.close(fds.pop(p))
                parent, name = posixpath.split(path)
                fds[path] = os.open(name, _DIR_FLAGS, dir_fd=dir_fd(parent))
            return fds[path]

        try:
            if self._watch is not None:
                if self._watch.overflowed:  # the tree is the snapshot's again: watch it
                    self._watch.reset()
                self._watch.add(root_fd)
            keep: dict[str, _Seen] = {}
            changed = self._prune(root_fd, "", want, keep)
            created_dirs: list[Entry] = []
            for e in snapshot.entries:
                if e.path in keep:
                    continue
                changed += 1
                parent, name = posixpath.split(e.path)
                pfd = dir_fd(parent)
                if e.kind == "d":
                    os.mkdir(name, 0o700, dir_fd=pfd)
                    if self.owner:
                        os.chown(dir_fd(e.path), *self.owner)
                    if self._watch is not None:
                        self._watch.add(dir_fd(e.path), e.path)
                    created_dirs.append(e)
                elif e.kind == "f":
                    self._write_file(pfd, name, e, store)
                else:
                    target = store.read_blob(e.digest).decode()  # read_blob verifies
                    _check_link(e.path, target)  # a manifest may come from anywhere
                    os.symlink(target, name, dir_fd=pfd)
                    if self.owner:
                        os.chown(name, *self.owner, dir_fd=pfd, follow_symlinks=False)
                if e.kind != "d":
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                    keep[e.path] = _Seen(_stat_key(st), e)
            # Directory modes last, deepest first: a read-only directory must not block
            # its children.
            for e in reversed(created_dirs):
                os.chmod(dir_fd(e.path), e.mode)
                keep[e.path] = _Seen(_stat_key(os.fstat(dir_fd(e.path))), e)
        except BaseException:
            if self._watch is not None:
                self._watch.dirty = True  # half restored: the next scan must walk
            self._last = None
            raise
        finally:
            for fd in fds.values():
                os.close(fd)
        # The keys just recorded let the next scan skip every restored file; the
        # snapshot is what the workspace now holds, so no rescan is needed either.
        self._seen = keep
        self._last = snapshot
        if self._watch is not None:
            self._watch.drop_events()  # our own writes
        return changed

    def _prune(
        self, dir_fd: int, prefix: str, want: dict[str, Entry], keep: dict[str, _Seen]
    ) -> int:
        removed = 0
        with os.scandir(dir_fd) as it:
            children = list(it)
        for child in children:
            path = prefix + child.name
            try:
                st = child.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            target = want.get(path)
            old = self._seen.get(path)
            if stat.S_ISDIR(st.st_mode) and target is not None and target.kind == "d":
                if stat.S_IMODE(st.st_mode) != target.mode:
                    os.chmod(child.name, target.mode, dir_fd=dir_fd, follow_symlinks=False)
                sub = open_dir(child.name, dir_fd)
                if self._watch is not None:
                    # With its path: the kernel gives a directory one watch, and this
                    # call names it; a restore with no scan after it (an episode with
                    # no tool call) would otherwise report reads here at the root.
                    self._watch.add(sub, path)
                try:
                    removed += self._prune(sub, path + "/", want, keep)
                finally:
                    os.close(sub)
                keep[path] = _Seen(_stat_key(st), target)
                continue
            unchanged = (
                target is not None
                and old is not None
                and old.key == _stat_key(st)
                and old.entry == target
            )
            if unchanged:
                keep[path] = old
                continue
            removed += 1
            remove_tree(dir_fd, child.name)  # iterative: agent trees may be any depth
        return removed

    def _write_file(self, pfd: int, name: str, e: Entry, store: BlobStore) -> None:
        src = store.open_verified(e.digest)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        dst = os.open(name, flags, 0o600, dir_fd=pfd)
        try:
            remaining = e.size
            copy = os.copy_file_range
            while remaining > 0:
                try:
                    n = copy(src, dst, remaining)
                except OSError as exc:
                    # The store and a tmpfs workspace are different file systems, which
                    # copy_file_range refuses on some kernels; sendfile copies anyway.
                    if copy is _sendfile or exc.errno not in (
                        errno.EXDEV,
                        errno.EINVAL,
                        errno.ENOSYS,
                    ):
                        raise
                    copy = _sendfile
                    continue
                if n == 0:
                    raise UnsafeSnapshot(e.path, "blob is shorter than the manifest says")
                remaining -= n
            if self.owner:
                os.fchown(dst, *self.owner)
            os.fchmod(dst, e.mode)
        finally:
            os.close(src)
            os.close(dst)


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
                _check_link(name, m.linkname)
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
                    raise UnsafeSnapshot(name, f"parent {parent!r} is a {_KIND_NAMES[e.kind]}")
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
