"""Snapshots: exact restore, change detection, and refusal of unsafe archives.

Everything here runs on the host against plain directories: the guarantees hold for
any backend that restores through :class:`WorkspaceIndex`.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bat_gym.core.errors import SnapshotNotFound, UnsafeSnapshot, UnsafeWorkspace
from bat_gym.core.sandbox import workspace_index
from bat_gym.core.sandbox.snapshot import (
    BlobStore,
    Entry,
    Snapshot,
    SnapshotLimits,
    WorkspaceIndex,
    export_tar,
    import_tar,
)

FILES = {
    "README.md": b"# task\n",
    "data/train.csv": b"x,y\n" + b"1,2\n" * 5000,
    "data/empty.txt": b"",
    "src/main.py": b"print('hello')\n",
    "src/pkg/__init__.py": b"",
    "src/pkg/util.py": b"def f():\n    return 1\n",
    "bin/run.sh": b"#!/bin/sh\necho run\n",
}


def make_workspace(root: Path) -> None:
    """A workspace with nested dirs, an empty dir, an executable and an inside symlink."""
    for rel, data in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "bin/run.sh").chmod(0o755)
    (root / "empty_dir").mkdir()
    (root / "latest.csv").symlink_to("data/train.csv")


def tree(root: Path) -> dict[str, tuple[str, int, bytes | str | None]]:
    """Everything under ``root`` as (kind, mode, content or link target), never following links."""
    out: dict[str, tuple[str, int, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode), None)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("f", stat.S_IMODE(st.st_mode), path.read_bytes())
            else:
                out[rel] = ("other", stat.S_IMODE(st.st_mode), None)
    return out


def outside_state(root: Path) -> dict[str, tuple[str, int, bytes | str | None, int]]:
    """Like :func:`tree`, plus each entry's mtime: a restore must change none of it."""
    return {rel: (*v, (root / rel).lstat().st_mtime_ns) for rel, v in tree(root).items()}


def blobs_stored(store: BlobStore) -> list[str]:
    """Every file under the store: blobs, manifests and any temporary file left behind."""
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory next to the workspace that agent-planted symlinks point at."""
    d = tmp_path / "outside"
    (d / "sub").mkdir(parents=True)
    (d / "secret.txt").write_bytes(b"host secret\n")
    (d / "sub" / "util.py").write_bytes(b"host file\n")
    return d


@pytest.mark.parametrize("watch", [False, True], ids=["rescan", "inotify"])
def test_restore_after_every_kind_of_edit_is_exact(
    tmp_path: Path, outside: Path, watch: bool
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws, watch=watch)
    snap = index.capture(store)
    before = tree(ws)
    outside_before = outside_state(outside)

    (ws / "README.md").write_bytes(b"# changed\n")  # modify
    (ws / "data/empty.txt").unlink()  # delete
    (ws / "new.txt").write_bytes(b"new\n")  # add a file
    (ws / "newdir/deeper").mkdir(parents=True)  # add dirs
    (ws / "newdir/deeper/x.bin").write_bytes(os.urandom(1000))
    (ws / "src/main.py").chmod(0o600)  # chmod a file
    (ws / "data").chmod(0o700)  # chmod a directory
    (ws / "bin/run.sh").unlink()  # a file becomes a directory
    (ws / "bin/run.sh").mkdir()
    (ws / "empty_dir").rmdir()  # a directory becomes a file
    (ws / "empty_dir").write_bytes(b"not a dir")
    (ws / "latest.csv").unlink()  # a symlink is retargeted
    (ws / "latest.csv").symlink_to("README.md")
    os.rename(ws / "src/pkg", tmp_path / "pkg-moved")  # a directory swapped for a
    (ws / "src/pkg").symlink_to(outside)  # symlink to a host directory
    os.mkfifo(ws / "fifo")  # a FIFO
    assert index.scan().digest != snap.digest

    index.restore(snap, store)

    assert tree(ws) == before
    assert index.scan().digest == snap.digest
    assert WorkspaceIndex(ws).scan().digest == snap.digest
    assert outside_state(outside) == outside_before
    assert {rel: data for rel, data in FILES.items()} == {
        rel: (ws / rel).read_bytes() for rel in FILES
    }


def test_restore_writes_nothing_through_planted_symlinks(tmp_path: Path, outside: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws)
    snap = index.capture(store)
    outside_before = outside_state(outside)

    # src/pkg holds util.py in the snapshot, and so does the outside directory: a
    # restore that followed the link would overwrite the host's copy.
    (ws / "src/pkg/util.py").unlink()
    (ws / "src/pkg/__init__.py").unlink()
    (ws / "src/pkg").rmdir()
    (ws / "src/pkg").symlink_to(outside / "sub")
    # A file path turned into a link to a host file, and a whole parent directory too.
    (ws / "README.md").unlink()
    (ws / "README.md").symlink_to(outside / "secret.txt")
    os.rename(ws / "data", tmp_path / "data-moved")
    (ws / "data").symlink_to(outside)

    index.restore(snap, store)

    assert outside_state(outside) == outside_before
    assert not (ws / "src/pkg").is_symlink()
    assert not (ws / "data").is_symlink()
    assert (ws / "README.md").read_bytes() == FILES["README.md"]
    assert WorkspaceIndex(ws).scan().digest == snap.digest


@pytest.mark.parametrize("watch", [False, True], ids=["rescan", "inotify"])
def test_same_size_edit_with_mtime_put_back_is_detected(tmp_path: Path, watch: bool) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "answer.txt"
    target.write_bytes(b"42\n")
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws, watch=watch)
    snap = index.capture(store)
    st = target.stat()

    target.write_bytes(b"41\n")  # same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_mtime_ns == st.st_mtime_ns

    assert index.scan().digest != snap.digest
    index.restore(snap, store)
    assert target.read_bytes() == b"42\n"
    assert index.scan().digest == snap.digest


def test_unchanged_files_are_not_rewritten(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws, watch=True)
    snap = index.capture(store)
    inodes = {rel: (ws / rel).lstat().st_ino for rel in [*FILES, "latest.csv", "empty_dir"]}

    (ws / "src/main.py").write_bytes(b"print('edited')\n")
    (ws / "scratch.txt").write_bytes(b"junk")
    index.restore(snap, store)

    for rel, ino in inodes.items():
        if rel != "src/main.py":
            assert (ws / rel).lstat().st_ino == ino, f"{rel} was rewritten"
    assert (ws / "src/main.py").read_bytes() == FILES["src/main.py"]
    assert not (ws / "scratch.txt").exists()
    assert index.restore(snap, store) == 0  # nothing left to change


def test_an_edit_during_a_scan_is_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "a.txt"
    target.write_bytes(b"one")
    index = WorkspaceIndex(ws, watch=True)
    index.scan()
    target.write_bytes(b"two")

    real_hash = workspace_index.hash_fd

    def hash_then_edit(fd: int) -> tuple[str, int]:
        # A background writer changes the file right after the scan has read it.
        result = real_hash(fd)
        target.write_bytes(b"three")
        return result

    monkeypatch.setattr(workspace_index, "hash_fd", hash_then_edit)
    index.scan()
    monkeypatch.setattr(workspace_index, "hash_fd", real_hash)

    assert index.scan().digest == WorkspaceIndex(ws).scan().digest
    entry = next(e for e in index.scan().entries if e.path == "a.txt")
    assert entry.digest == hashlib.sha256(b"three").hexdigest()


def test_restore_with_a_missing_blob_touches_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    snap = WorkspaceIndex(ws).capture(BlobStore(tmp_path / "store"))
    (ws / "README.md").write_bytes(b"edited")
    before = tree(ws)

    with pytest.raises(SnapshotNotFound):
        WorkspaceIndex(ws).restore(snap, BlobStore(tmp_path / "empty-store"))
    assert tree(ws) == before


def test_capture_refuses_a_symlink_chain_that_leaves_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a/b").mkdir(parents=True)
    # Each link alone stays inside by its text; together they resolve above ws.
    (ws / "a/b/l").symlink_to("../..")
    (ws / "e").symlink_to("a/b/l/..")
    assert not (ws / "e").resolve().is_relative_to(ws)

    with pytest.raises(UnsafeWorkspace) as err:  # the agent's doing: a verdict, not a crash
        WorkspaceIndex(ws).capture(BlobStore(tmp_path / "store"))
    assert err.value.path == "e"
    assert err.value.category == "unsafe_workspace"


def test_export_then_import_round_trips(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    make_workspace(ws)
    store = BlobStore(tmp_path / "store")
    snap = WorkspaceIndex(ws).capture(store)

    export_tar(snap, store, tmp_path / "a.tar")
    export_tar(snap, store, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()

    other = BlobStore(tmp_path / "other-store")
    imported = import_tar(tmp_path / "a.tar", other)
    assert imported.digest == snap.digest
    assert other.get_snapshot(snap.digest) == snap

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    WorkspaceIndex(fresh).restore(imported, other)
    assert WorkspaceIndex(fresh).scan().digest == snap.digest
    assert tree(fresh) == tree(ws)


def test_import_fills_in_missing_parent_directories(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "a/b/c.txt", b"deep")
    store = BlobStore(tmp_path / "store")

    snap = import_tar(archive, store)

    assert [(e.path, e.kind) for e in snap.entries] == [
        ("a", "d"),
        ("a/b", "d"),
        ("a/b/c.txt", "f"),
    ]
    ws = tmp_path / "ws"
    ws.mkdir()
    WorkspaceIndex(ws).restore(snap, store)
    assert (ws / "a/b/c.txt").read_bytes() == b"deep"


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_special(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    tar.addfile(info)


# Each builder writes a small archive with one unsafe member among safe ones; the
# member named is what the refusal must name.
UNSAFE: dict[str, tuple[Callable[[tarfile.TarFile], None], str]] = {
    "absolute path": (lambda t: add_file(t, "/etc/cron.d/x", b"x"), "/etc/cron.d/x"),
    "dot-dot": (lambda t: add_file(t, "../escape.txt", b"x"), "../escape.txt"),
    "inner dot-dot": (lambda t: add_file(t, "ok/../../escape.txt", b"x"), "ok/../../escape.txt"),
    "hard link": (lambda t: add_special(t, "hl", tarfile.LNKTYPE, "ok.txt"), "hl"),
    "char device": (lambda t: add_special(t, "dev", tarfile.CHRTYPE), "dev"),
    "fifo": (lambda t: add_special(t, "pipe", tarfile.FIFOTYPE), "pipe"),
    "absolute symlink": (lambda t: add_special(t, "etc", tarfile.SYMTYPE, "/etc"), "etc"),
    "climbing symlink": (lambda t: add_special(t, "d/up", tarfile.SYMTYPE, "../../x"), "d/up"),
    "symlink chain": (
        lambda t: (
            add_special(t, "a/b/l", tarfile.SYMTYPE, "../.."),
            add_special(t, "e", tarfile.SYMTYPE, "a/b/l/.."),
        ),
        "e",
    ),
    "member under a symlink": (
        lambda t: (
            add_special(t, "lnk", tarfile.SYMTYPE, "d"),
            add_file(t, "lnk/evil.txt", b"x"),
        ),
        "lnk/evil.txt",
    ),
    "duplicate": (lambda t: add_file(t, "ok.txt", b"again"), "ok.txt"),
    "duplicate after ./": (lambda t: add_file(t, "./ok.txt", b"again"), "ok.txt"),
    "file too big": (lambda t: add_file(t, "big.bin", b"x" * 2000), "big.bin"),
    "total too big": (
        lambda t: [add_file(t, f"part{i}.bin", b"x" * 900) for i in range(3)],
        "part2.bin",
    ),
    "too many members": (
        lambda t: [add_file(t, f"many{i}.txt", b"") for i in range(20)],
        "<archive>",
    ),
}
LIMITS = SnapshotLimits(max_files=12, max_file_bytes=1000, max_total_bytes=2000)


@pytest.mark.parametrize("case", list(UNSAFE))
def test_import_refuses_unsafe_archives_and_stores_nothing(tmp_path: Path, case: str) -> None:
    build, member = UNSAFE[case]
    archive = tmp_path / "unsafe.tar"
    with tarfile.open(archive, "w") as tar:
        add_special(tar, "d", tarfile.DIRTYPE)
        add_file(tar, "ok.txt", b"fine")
        build(tar)
    store = BlobStore(tmp_path / "store")

    with pytest.raises(UnsafeSnapshot) as err:
        import_tar(archive, store, LIMITS)

    assert err.value.path == (str(archive) if member == "<archive>" else member)
    assert blobs_stored(store) == []


def test_read_blob_detects_corruption(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    digest = store.put_bytes(b"the right bytes")
    assert store.read_blob(digest) == b"the right bytes"

    path = store.blob_path(digest)
    path.chmod(0o644)
    path.write_bytes(b"the wrong bytes")
    with pytest.raises(UnsafeSnapshot, match="corrupted"):
        store.read_blob(digest)
    with pytest.raises(SnapshotNotFound):
        store.read_blob("0" * 64)


def entries() -> list[Entry]:
    return [
        Entry("a", "d", 0o755, "", 0),
        Entry("a/x.txt", "f", 0o644, hashlib.sha256(b"x").hexdigest(), 1),
        Entry("b.txt", "f", 0o644, hashlib.sha256(b"b").hexdigest(), 1),
    ]


def test_snapshot_validation() -> None:
    good = Snapshot(entries=tuple(entries()))
    assert Snapshot(entries=tuple(entries()), digest=good.digest) == good
    assert Snapshot.model_validate_json(good.model_dump_json()) == good
    assert Snapshot.of(list(reversed(entries()))) == good

    with pytest.raises(ValueError, match="does not match"):
        Snapshot(entries=tuple(entries()), digest="0" * 64)
    with pytest.raises(ValueError, match="sorted"):
        Snapshot(entries=tuple(reversed(entries())))
    with pytest.raises(ValueError, match="unique"):
        Snapshot(entries=(*entries(), entries()[-1]))
    with pytest.raises(ValueError, match="not a directory"):
        Snapshot(entries=tuple(entries()[1:]))  # a/x.txt without its directory
    with pytest.raises(ValueError, match="climbs out"):
        Snapshot.of([Entry("../x", "f", 0o644, "", 0)])


def test_changed_paths_and_without_paths() -> None:
    from bat_gym.core.sandbox.snapshot import Entry, Snapshot, changed_paths, without_paths

    def snap(*entries: Entry) -> Snapshot:
        return Snapshot.of(list(entries))

    d = Entry("out", "d", 0o755, "", 0)
    a = Entry("out/a.csv", "f", 0o644, "1" * 64, 1)
    b = Entry("out/b.csv", "f", 0o644, "2" * 64, 1)
    before = snap(d, a)
    after = snap(d, a._replace(digest="3" * 64), b)
    assert changed_paths(before, before) == ()
    assert changed_paths(before, after) == ("out/a.csv", "out/b.csv")
    assert changed_paths(after, snap()) == ("out", "out/a.csv", "out/b.csv")
    assert [e.path for e in without_paths(after, frozenset({"out/b.csv"})).entries] == [
        "out",
        "out/a.csv",
    ]
    assert without_paths(after, frozenset({"out"})).entries == ()
    assert without_paths(after, frozenset()) is after


def test_reads_after_a_restore_keep_their_directories(tmp_path: Path) -> None:
    """A restore re-watches the directories it keeps; reads in them must be reported at
    their own paths, also when no scan runs between the restore and the read (an
    episode with no tool call, then the next episode's first call)."""
    ws = tmp_path / "ws"
    (ws / "pipeline").mkdir(parents=True)
    (ws / "pipeline" / "infer.py").write_text("print(1)\n")
    store = BlobStore(tmp_path / "store")
    index = WorkspaceIndex(ws, watch=True)
    snap = index.capture(store)
    for _ in range(2):  # one restore after another, with no scan between them
        index.restore(snap, store)
        index.take_reads()
    (ws / "pipeline" / "infer.py").read_text()
    assert index.take_reads() == frozenset({"pipeline/infer.py"})
