"""Isolated, resettable workspaces that run agent code.

``make_sandbox("local")`` (bubblewrap, the default) or ``make_sandbox("docker")``.
"""

from __future__ import annotations

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

BACKENDS: dict[str, str] = {
    "local": "bat_gym.sandbox.local:LocalSandbox",
    "docker": "bat_gym.sandbox.docker:DockerSandbox",
}


def make_sandbox(backend: str = "local", **kwargs: object) -> Sandbox:
    """Create a sandbox of the named backend; keyword arguments go to its constructor."""
    import importlib

    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {sorted(BACKENDS)}")
    module, _, cls = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)
