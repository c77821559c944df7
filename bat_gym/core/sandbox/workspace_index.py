"""The workspace index: incremental scans and exact, in-place restores of one workspace.

:class:`WorkspaceIndex` keeps, per path, the ``lstat`` key it last saw and the digest
it computed then. Scanning a workspace rehashes only files whose key changed, and
restoring rewrites only entries that differ, so both cost O(files) ``lstat`` calls
plus O(changed bytes), never a re-run of history or a rehash of everything.

Every walk goes through directory file descriptors opened with ``O_NOFOLLOW``: code in
the sandbox may plant symlinks, FIFOs or swap directories, and the host side (often
root) must never follow one out of the workspace. Walks are iterative and bounded:
agent code decides how deep and how wide a tree is, so a scan stops with
:class:`~bat_gym.core.errors.WorkspaceQuotaExceeded` past :class:`SnapshotLimits`, and a tree
deeper than :data:`MAX_DEPTH` levels is refused as
:class:`~bat_gym.core.errors.UnsafeWorkspace`. What :meth:`WorkspaceIndex.capture` stores
can always be loaded again: it refuses what a manifest could not hold (names that are
not UTF-8, links that leave the workspace) with ``UnsafeWorkspace`` instead.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

from bat_gym.core.errors import (
    SnapshotNotFound,
    UnsafeSnapshot,
    UnsafeWorkspace,
    WorkspaceQuotaExceeded,
    WorkspaceRejected,
)
from bat_gym.core.sandbox.blobs import DIR_FLAGS, BlobStore, hash_fd
from bat_gym.core.sandbox.dir_attrs import DirBaseline, normalize_dir
from bat_gym.core.sandbox.snapshot_model import (
    MAX_DEPTH,
    MODE_BITS,
    Entry,
    Snapshot,
    SnapshotLimits,
    check_link,
    check_member_path,
    is_utf8,
    printable_path,
)
from bat_gym.core.sandbox.trees import open_dir, remove_tree
from bat_gym.core.sandbox.watch import ChangeWatch

__all__ = ["WorkspaceIndex"]

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_OPEN_DIRS = 256  # directory descriptors a restore keeps open at once


@dataclass
class _Seen:
    key: tuple[int, int, int, int, int]
    entry: Entry


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # ctime cannot be set from user space, so an edit followed by utime() still shows.
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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
        # What the last restore left, the only record a restore trusts to keep a file:
        # a scan since then has recorded the agent's own edits, metadata included.
        # None before the first restore, when the scans' record is all there is.
        self._restored: dict[str, _Seen] | None = None
        self._baseline: DirBaseline | None = None
        try:  # read while the root is fresh, before agent code runs in it
            fd = os.open(self.root, DIR_FLAGS)
        except OSError:
            pass  # none yet: read when a restore first makes it
        else:
            try:
                self._baseline = DirBaseline.of_root(fd, owner)
            finally:
                os.close(fd)
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
        self._last = Snapshot.trusted(entries)
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
        root_fd = os.open(self.root, DIR_FLAGS)
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
                mode = stat.S_IMODE(st.st_mode) & MODE_BITS
                if stat.S_ISDIR(st.st_mode):
                    entry = Entry(path, "d", mode, "", 0)
                    seen[path] = _Seen(key, entry)
                    entries.append(entry)
                    if len(stack) >= MAX_DEPTH:
                        raise UnsafeWorkspace(
                            printable_path(path)[:200] + "...",
                            f"more than {MAX_DEPTH} directory levels",
                        )
                    try:
                        sub = os.open(child.name, DIR_FLAGS, dir_fd=dir_fd)
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
                fd = os.open(child.name, READ_FLAGS, dir_fd=dir_fd)
            except OSError:
                return None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                return Entry(path, "f", mode, *hash_fd(fd))
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
        fd = self._open_nofollow(parent) if parent else os.open(self.root, DIR_FLAGS)
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
                    if not is_utf8(target):
                        raise UnsafeSnapshot(e.path, "the link target is not valid UTF-8")
                    check_link(e.path, target)
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
        fd = os.open(self.root, DIR_FLAGS)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            return os.open(parts[-1], READ_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)

    # -- restore ----------------------------------------------------------------------

    def restore(self, snapshot: Snapshot, store: BlobStore) -> int:
        """Make the workspace equal ``snapshot`` in place; return how many entries changed.

        Files and links whose ``lstat`` key is what the last restore left (before the
        first, what the last scan recorded) for the same content are kept; everything
        else is removed and recreated from blobs. Every directory kept, and the
        workspace root itself, gets its mode back and the owner, inode flags and
        extended attributes of a fresh directory (see :mod:`.dir_attrs`); a root that
        was replaced is made again. Call it only while no process writes to the
        workspace.

        Raises:
            SnapshotNotFound: a blob the snapshot needs is not in ``store``; nothing in
                the workspace has been touched.
            UnsafeSnapshot: a symlink in the snapshot would leave the workspace.
        """
        missing = [e.path for e in snapshot.entries if e.kind != "d" and not store.has(e.digest)]
        if missing:
            raise SnapshotNotFound(f"blobs for {missing[:5]} are not in the store at {store.root}")
        want = {e.path: e for e in snapshot.entries}
        root_fd = self._open_root()
        fds: dict[str, int] = {"": root_fd}

        def dir_fd(path: str) -> int:
            if path not in fds:
                if len(fds) > _MAX_OPEN_DIRS:  # a wide tree: reopen through the parents
                    for p in [p for p in fds if p]:
                        os.close(fds.pop(p))
                parent, name = posixpath.split(path)
                fds[path] = os.open(name, DIR_FLAGS, dir_fd=dir_fd(parent))
            return fds[path]

        try:
            if self._watch is not None:
                if self._watch.overflowed:  # the tree is the snapshot's again: watch it
                    self._watch.reset()
                self._watch.add(root_fd)
            if self._baseline is None:
                self._baseline = DirBaseline.of_root(root_fd, self.owner)
            baseline = self._baseline
            # Before anything is made in it: a default ACL would shape what is.
            normalize_dir(root_fd, os.fstat(root_fd), baseline)
            keep: dict[str, _Seen] = {}
            kept_modes: list[tuple[str, int]] = []
            changed = self._prune(root_fd, "", want, keep, kept_modes)
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
                    check_link(e.path, target)  # a manifest may come from anywhere
                    os.symlink(target, name, dir_fd=pfd)
                    if self.owner:
                        os.chown(name, *self.owner, dir_fd=pfd, follow_symlinks=False)
                if e.kind != "d":
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                    keep[e.path] = _Seen(_stat_key(st), e)
            # Directory modes last, deepest first (the root last of all): a read-only
            # directory must not block its children.
            for e in reversed(created_dirs):
                os.chmod(dir_fd(e.path), e.mode)
                keep[e.path] = _Seen(_stat_key(os.fstat(dir_fd(e.path))), e)
            for path, mode in kept_modes:
                os.chmod(dir_fd(path), mode)
            if stat.S_IMODE(os.fstat(root_fd).st_mode) != baseline.root_mode:
                os.fchmod(root_fd, baseline.root_mode)
        except BaseException:
            if self._watch is not None:
                self._watch.dirty = True  # half restored: the next scan must walk
            self._last = None
            self._restored = {}  # trust no file of a half-done restore
            raise
        finally:
            for fd in fds.values():
                os.close(fd)
        # The keys just recorded let the next scan skip every restored file; the
        # snapshot is what the workspace now holds, so no rescan is needed either.
        self._seen = keep
        self._restored = dict(keep)
        self._last = snapshot
        if self._watch is not None:
            self._watch.drop_events()  # our own writes
        return changed

    def _open_root(self) -> int:
        """Open the workspace root for a restore, unlocked, made anew if it was replaced.

        A sandbox's root is a mount point, which agent code can neither rename nor
        remove; an unisolated one, or a plain directory, may have become a file or a
        link since.
        """
        head, name = os.path.split(os.path.normpath(self.root))
        parent = os.open(head or ".", DIR_FLAGS)
        try:
            try:
                return open_dir(name, parent)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                remove_tree(parent, name)
            os.mkdir(name, self._baseline.root_mode if self._baseline else 0o755, dir_fd=parent)
            fd = open_dir(name, parent)
            if self.owner:
                os.fchown(fd, *self.owner)
            return fd
        finally:
            os.close(parent)

    def _prune(
        self,
        dir_fd: int,
        prefix: str,
        want: dict[str, Entry],
        keep: dict[str, _Seen],
        kept_modes: list[tuple[str, int]],
    ) -> int:
        """Remove what ``want`` does not hold as it is under ``dir_fd``; return how many.

        Directories it holds are kept and normalized (see :func:`normalize_dir`); those
        whose mode must still change are appended to ``kept_modes``, children before
        parents.
        """
        assert self._baseline is not None
        trusted = self._seen if self._restored is None else self._restored
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
            old = trusted.get(path)
            if stat.S_ISDIR(st.st_mode) and target is not None and target.kind == "d":
                sub = open_dir(child.name, dir_fd)
                try:
                    normalize_dir(sub, st, self._baseline)
                    if self._watch is not None:
                        # With its path: the kernel gives a directory one watch, and
                        # this call names it; a restore with no scan after it (an
                        # episode with no tool call) would otherwise report reads here
                        # at the root.
                        self._watch.add(sub, path)
                    removed += self._prune(sub, path + "/", want, keep, kept_modes)
                    if stat.S_IMODE(os.fstat(sub).st_mode) != target.mode:
                        kept_modes.append((path, target.mode))
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
