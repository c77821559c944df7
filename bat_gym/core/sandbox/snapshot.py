"""Content-addressed workspace snapshots, and exact, incremental restore: the public face.

The ideas live in their own modules; this one gathers their public names, so
``from bat_gym.core.sandbox.snapshot import BlobStore, Snapshot, WorkspaceIndex`` keeps
working:

* :mod:`~bat_gym.core.sandbox.snapshot_model`: the manifest (:class:`Snapshot`,
  :class:`Entry`, :class:`SnapshotLimits`) and the rules of what it may hold;
* :mod:`~bat_gym.core.sandbox.blobs`: :class:`BlobStore`, file contents under their sha256;
* :mod:`~bat_gym.core.sandbox.workspace_index`: :class:`WorkspaceIndex`, incremental scans
  and in-place restores of a live workspace, never following a link out of it;
* :mod:`~bat_gym.core.sandbox.tarball`: :func:`import_tar` and :func:`export_tar`.
"""

from __future__ import annotations

from bat_gym.core.sandbox.blobs import BlobStore, ScratchStore
from bat_gym.core.sandbox.snapshot_model import (
    MAX_DEPTH,
    Entry,
    Snapshot,
    SnapshotLimits,
    changed_paths,
    check_member_path,
    without_paths,
)
from bat_gym.core.sandbox.tarball import export_tar, import_tar
from bat_gym.core.sandbox.workspace_index import WorkspaceIndex

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
    "without_paths",
]
