"""Isolated, resettable workspaces that run agent code.

``make_sandbox("local")`` (bubblewrap, the default) or ``make_sandbox("docker")``. A
backend is a :class:`Sandbox` subclass registered in :data:`BACKENDS` (entry point
group ``bat_gym.sandboxes``); its ``backend`` attribute is the name it is registered
under.
"""

from __future__ import annotations

from typing import Any

from bat_gym.errors import PluginError, SandboxBackendNotFound
from bat_gym.plugins import Registry
from bat_gym.sandbox.base import LANGUAGES, ExecResult, Isolation, Language, Sandbox, SandboxLimits
from bat_gym.sandbox.snapshot import (
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


def _as_backend(name: str, cls: Any) -> type[Sandbox]:
    if not (isinstance(cls, type) and issubclass(cls, Sandbox)):
        raise PluginError(f"sandbox backend {name!r} is {cls!r}, not a Sandbox subclass")
    if getattr(cls, "backend", name) != name:
        raise PluginError(
            f"sandbox backend registered as {name!r} calls itself {cls.backend!r}; "
            "set its backend attribute to the name it is registered under"
        )
    return cls


BACKENDS: Registry[type[Sandbox]] = Registry(
    "bat_gym.sandboxes", not_found=SandboxBackendNotFound, adapt=_as_backend
)
"""The sandbox backends, by name (``local``, ``docker``, and any a package declares)."""


def make_sandbox(backend: str = "local", **kwargs: object) -> Sandbox:
    """Create a sandbox of the named backend; keyword arguments go to its constructor.

    Raises:
        SandboxBackendNotFound: no backend has that name.
        SandboxUnavailable: the backend cannot run on this machine.
    """
    return BACKENDS[backend](**kwargs)
