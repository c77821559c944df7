"""Isolated, resettable workspaces that run agent code.

``make_sandbox("local")`` (bubblewrap, the default) or ``make_sandbox("docker")``. A
backend is a :class:`Sandbox` subclass registered in :data:`BACKENDS` (entry point
group ``bat_gym.sandboxes``); its ``backend`` attribute is the name it is registered
under.
"""

from __future__ import annotations

from bat_gym.core.errors import SandboxBackendNotFound
from bat_gym.core.plugins import Expect, Registry
from bat_gym.core.sandbox.base import (
    LANGUAGES,
    ExecResult,
    Isolation,
    Language,
    Sandbox,
    SandboxLimits,
)
from bat_gym.core.sandbox.snapshot import (
    BlobStore,
    Entry,
    Snapshot,
    SnapshotLimits,
    WorkspaceIndex,
    export_tar,
    import_tar,
)

__all__ = [
    "BACKENDS",
    "BlobStore",
    "Entry",
    "ExecResult",
    "Isolation",
    "LANGUAGES",
    "Language",
    "Sandbox",
    "SandboxLimits",
    "Snapshot",
    "SnapshotLimits",
    "WorkspaceIndex",
    "export_tar",
    "import_tar",
    "make_sandbox",
]


BACKENDS: Registry[type[Sandbox]] = Registry(
    "bat_gym.sandboxes",
    expect=Expect("sandbox backend", Sandbox, subclass=True, self_name="backend"),
    not_found=SandboxBackendNotFound,
)
"""The sandbox backends, by name (``local``, ``docker``, and any a package declares)."""


def make_sandbox(backend: str = "local", **kwargs: object) -> Sandbox:
    """Create a sandbox of the named backend; keyword arguments go to its constructor.

    Raises:
        SandboxBackendNotFound: no backend has that name.
        SandboxUnavailable: the backend cannot run on this machine.
    """
    return BACKENDS[backend](**kwargs)
