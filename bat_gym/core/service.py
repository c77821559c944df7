"""State beyond files: a benchmark's service, snapshot and restored with the workspace.

Some benchmarks keep part of an env's state in a service the tools talk to (a DICOM
server's studies, series and annotations; a database). A benchmark with one returns
a fresh :class:`ServiceState` per env from :meth:`Benchmark.make_service
<bat_gym.benchmark.Benchmark.make_service>` and each task's starting content from
:meth:`Benchmark.service_blobs <bat_gym.benchmark.Benchmark.service_blobs>`.

A service's state is a set of named blobs (``{"studies/1.2.3/0001.dcm": b"..."}``):
:meth:`ServiceState.snapshot` writes them, :meth:`ServiceState.restore` makes the
service hold exactly them. Like a workspace, each blob is stored once in the blob
store under its sha256, and the state is a :class:`ServiceSnapshot` manifest (name to
sha256) stored under the sha256 of its canonical JSON; a Stage Bank state names that
digest (:attr:`bat_gym.core.spec.StageState.service`), so equal service states have equal
digests. ``restore`` receives the blobs as :class:`ServiceBlobs`, a lazy mapping that
also gives each blob's digest, so a service can keep what it already holds and load
only what differs: a reset costs what changed, not the whole state.

A state is capped (:class:`ServiceLimits`: how many blobs, how many bytes in all),
because a policy drives what a service holds: tools that store annotations, a
sandbox that could reach the server. The cap is enforced where a state is taken
(:func:`capture_service`, before anything is stored) and should be enforced by the
service at the tool boundary, before a write that would pass it
(:meth:`ServiceLimits.check`); either way :class:`ServiceStateTooLarge` names the limit
and how to raise it. At the tool boundary it is a :class:`~bat_gym.core.tools.ToolError`:
the agent sees its message and the episode goes on.

Host tools run in a child process forked per call (:mod:`bat_gym.core.tools`), so a handler
changes the server, never this process's service object; the service hears of each call
through :meth:`ServiceState.after_tool_call` and must not trust what it remembers of the
server after it. A service whose state is its Python object sets ``IN_PROCESS = True``
and its handlers run in a thread instead.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bat_gym.core.errors import ConfigError
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.tools import ToolError

__all__ = [
    "ServiceBlobs",
    "ServiceLimits",
    "ServiceSnapshot",
    "ServiceState",
    "ServiceStateTooLarge",
    "capture_service",
    "load_service_snapshot",
    "put_service_blobs",
    "restore_service",
]

_MAX_NAME = 1024


class ServiceStateTooLarge(ToolError):
    """A service state would pass one of its limits.

    Attributes:
        limit: the limit's name (``ServiceLimits.max_bytes``, or a service's own).
        value: what the state would hold (blobs, bytes, records).
        maximum: the limit's value.
    """

    def __init__(self, limit: str, value: int, maximum: int, unit: str, how: str) -> None:
        self.limit, self.value, self.maximum = limit, value, maximum
        super().__init__(
            f"the service state would hold {value:,} {unit}, over its limit of {maximum:,} "
            f"({limit}); {how}"
        )


class ServiceLimits(BaseModel):
    """How big one service state may be: what a snapshot stores and a reset loads.

    The defaults hold a few hundred DICOM studies of the sizes the shipped suites use;
    the bank stores every distinct state, so the cap bounds its disk use per state too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_blobs: int = Field(4096, ge=1, description="Blobs in one state.")
    max_bytes: int = Field(
        256 * 2**20, ge=1, description="Bytes of all blobs of one state, together."
    )

    def check(self, blobs: int, total_bytes: int) -> None:
        """Raise if a state of ``blobs`` blobs and ``total_bytes`` bytes passes a limit.

        Raises:
            ServiceStateTooLarge: naming the limit passed and how to raise it.
        """
        for name, value, maximum, unit in (
            ("max_blobs", blobs, self.max_blobs, "blobs"),
            ("max_bytes", total_bytes, self.max_bytes, "bytes"),
        ):
            if value > maximum:
                raise ServiceStateTooLarge(
                    f"ServiceLimits.{name}",
                    value,
                    maximum,
                    unit,
                    f"a benchmark whose service needs more sets `limits = ServiceLimits({name}=...)` "
                    "on its ServiceState",
                )


class ServiceState(ABC):
    """A benchmark's service, whose state is part of an env's start state.

    One instance serves one env: it is made on the env's first reset and closed with
    the env. Implementations must make ``restore`` exact (after ``restore(b)``,
    ``snapshot()`` returns ``b``) and ``snapshot`` deterministic (equal states give
    equal blobs, whatever the order things were stored in).

    Attributes:
        IN_PROCESS: whether the state lives in this Python object (not in a server or
            files). Then host tools run in a thread of the env's process, where their
            changes stay, and a handler past its timeout cannot be stopped; otherwise
            (the default) each runs in a child process killed at its timeout.
        limits: the size cap of one state (:class:`ServiceLimits`); set it on the
            class or the instance to raise it.
    """

    IN_PROCESS: ClassVar[bool] = False
    limits: ServiceLimits = ServiceLimits()

    @abstractmethod
    def snapshot(self) -> dict[str, bytes]:
        """The service's whole state as named blobs (names: ``/``-separated, no ``..``)."""

    @abstractmethod
    def restore(self, blobs: ServiceBlobs) -> None:
        """Make the service hold exactly ``blobs`` (and nothing else)."""

    def close(self) -> None:  # noqa: B027 - a service without resources closes as is
        """Release what the service holds (a server process, a directory)."""

    def after_tool_call(self) -> None:  # noqa: B027 - a service that caches nothing needs none
        """Called in the env's process after each host tool call ran in a child process.

        Whatever the call's outcome (a timeout too): the server may have changed in ways
        this object did not see. A service that remembers what the server holds (to make
        ``restore`` cheap) marks that memory stale here.
        """


def _check_name(name: str) -> str:
    if (
        not isinstance(name, str)
        or not name
        or len(name) > _MAX_NAME
        or name.startswith("/")
        or any(part in ("", ".", "..") for part in name.split("/"))
        or "\x00" in name
    ):
        raise ConfigError(
            f"service blob name {name!r} must be a relative '/'-separated path without "
            f"empty, '.' or '..' parts, at most {_MAX_NAME} characters"
        )
    return name


class ServiceSnapshot(BaseModel):
    """A service state's manifest: each blob name and the sha256 of its bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blobs: dict[str, str] = Field(default_factory=dict, description="Blob name to sha256.")

    @field_validator("blobs")
    @classmethod
    def _valid(cls, blobs: dict[str, str]) -> dict[str, str]:
        for name, digest in blobs.items():
            _check_name(name)
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"blob {name!r}: {digest!r} is not a sha256 hex digest")
        return dict(sorted(blobs.items()))

    def canonical(self) -> bytes:
        """The manifest as canonical JSON (sorted keys, no spaces): what its digest hashes."""
        return json.dumps({"blobs": self.blobs}, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        """sha256 of :meth:`canonical`."""
        return hashlib.sha256(self.canonical()).hexdigest()


class ServiceBlobs(Mapping[str, bytes]):
    """A service state's blobs, read from the blob store on access."""

    def __init__(self, snapshot: ServiceSnapshot, store: BlobStore) -> None:
        self.snapshot = snapshot
        self._store = store

    def __getitem__(self, name: str) -> bytes:
        return self._store.read_blob(self.snapshot.blobs[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.snapshot.blobs)

    def __len__(self) -> int:
        return len(self.snapshot.blobs)

    def digest(self, name: str) -> str:
        """The sha256 of blob ``name`` (without reading it)."""
        return self.snapshot.blobs[name]


def put_service_blobs(
    store: BlobStore, blobs: Mapping[str, bytes], limits: ServiceLimits | None = None
) -> str:
    """Store ``blobs`` and their manifest; return the manifest's digest.

    Args:
        store: the blob store.
        blobs: blob name to bytes.
        limits: checked before anything is stored (None: no cap, for a benchmark's own
            starting content).

    Raises:
        ConfigError: a blob name is not a clean relative path, or a blob is not bytes.
        ServiceStateTooLarge: the blobs pass ``limits``.
    """
    for name, data in blobs.items():
        if not isinstance(data, (bytes, bytearray)):
            raise ConfigError(f"service blob {name!r} is {type(data).__name__}, not bytes")
        _check_name(name)
    if limits is not None:
        limits.check(len(blobs), sum(len(d) for d in blobs.values()))
    entries = {name: store.put_bytes(bytes(data)) for name, data in blobs.items()}
    manifest = ServiceSnapshot(blobs=entries)
    digest = store.put_bytes(manifest.canonical())
    assert digest == manifest.digest
    return digest


def load_service_snapshot(store: BlobStore, digest: str) -> ServiceSnapshot:
    """The manifest stored under ``digest``."""
    return ServiceSnapshot.model_validate_json(store.read_blob(digest))


def capture_service(service: ServiceState, store: BlobStore) -> str:
    """Snapshot ``service`` into ``store``; return the state's digest.

    Raises:
        ServiceStateTooLarge: the state passes ``service.limits`` (nothing is stored).
    """
    return put_service_blobs(store, service.snapshot(), limits=service.limits)


def restore_service(service: ServiceState, store: BlobStore, digest: str | None) -> None:
    """Make ``service`` hold the state stored under ``digest`` (None: the empty state)."""
    snapshot = ServiceSnapshot() if digest is None else load_service_snapshot(store, digest)
    service.restore(ServiceBlobs(snapshot, store))
