"""The sandbox contract every backend implements.

A sandbox is an isolated, resettable workspace that runs ``execute_code(language,
code)``. Files persist across calls; processes and interpreter state do not (each call
starts a fresh process, as the reference runtime does). Between episodes a sandbox is
restored in place to an exact, content-addressed snapshot.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import signal
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bat_gym.core.sandbox.snapshot import (
    BlobStore,
    ScratchStore,
    Snapshot,
    SnapshotLimits,
    WorkspaceIndex,
)

__all__ = [
    "AGENT_ENV",
    "Language",
    "LANGUAGES",
    "Isolation",
    "SandboxLimits",
    "ProgramRun",
    "Provenance",
    "ExecResult",
    "Sandbox",
]

Language = Literal["python", "bash"]
LANGUAGES: tuple[str, ...] = ("python", "bash")

AGENT_ENV: dict[str, str] = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    # One thread per library: many sandboxes share few cores, and results stay repeatable.
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
"""Environment every backend gives agent code, besides PATH, HOME and TMPDIR."""


class Isolation(enum.StrEnum):
    """How strongly agent code is separated from the host, strongest first."""

    CONTAINER = "container"
    """A Docker container: own root filesystem, no network, cgroup limits."""
    BWRAP = "bwrap"
    """bubblewrap: user/pid/net/ipc/uts namespaces, tmpfs root, seccomp, rlimits."""
    NONE = "none"
    """Plain subprocesses in a private directory. Only for trusted code, by opt-in."""


class SandboxLimits(BaseModel):
    """Resource limits applied to every process the agent starts, and to the sandbox.

    Defaults follow the reference runtime (120 s per tool call, 2,048 characters of
    output shown to the agent); the record keeps up to ``record_output_bytes``. The
    workspace quota (``workspace_mb``, ``workspace_files``) follows the reference
    release's sealed-state caps; a call that leaves the workspace past it ends the
    episode with a zero-credit verdict of category ``quota_exceeded``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        120.0, gt=0, description="Wall clock per call; the whole process tree is killed past it."
    )
    cpu_s: int = Field(120, gt=0, description="CPU seconds per process (RLIMIT_CPU).")
    memory_mb: int = Field(4096, ge=64, description="Address space per process (RLIMIT_AS), MiB.")
    max_processes: int = Field(
        128, ge=8, description="Processes inside one sandbox (RLIMIT_NPROC)."
    )
    max_file_mb: int = Field(
        512, ge=1, description="Largest file a process may write (RLIMIT_FSIZE), MiB."
    )
    tmp_mb: int = Field(256, ge=1, description="Size of the sandbox's private /tmp, MiB.")
    record_output_bytes: int = Field(
        65536, ge=1024, description="Output bytes kept per call in the execution record."
    )
    total_memory_mb: int = Field(
        4096,
        ge=64,
        description="Memory of every agent process together, page cache and tmpfs included "
        "(a cgroup limit), MiB. Past it the kernel kills the largest agent process.",
    )
    workspace_mb: int = Field(
        512,
        ge=1,
        description="Workspace bytes, MiB, by apparent size: a sparse file counts in full.",
    )
    workspace_files: int = Field(
        8000, ge=16, description="Files, directories and links in the workspace."
    )

    def workspace_limits(self) -> SnapshotLimits:
        """The workspace quota as the bounds a scan or capture enforces."""
        total = self.workspace_mb << 20
        return SnapshotLimits(
            max_files=self.workspace_files, max_file_bytes=total, max_total_bytes=total
        )


class ProgramRun(BaseModel):
    """One program a tool call executed, as the sandbox observed it (``execve``).

    Recorded by the host, outside the agent's reach (see
    :mod:`bat_gym.core.sandbox.exec_trace`). ``path`` and ``argv`` are what the caller
    asked the kernel to run; ``cwd`` is its working directory then, as seen inside
    the sandbox where the backend can tell. ``exit_code`` is the process's exit
    status (negative: the signal that killed it); ``None`` when it is not known,
    and always when ``replaced`` (the process executed another program later).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    argv: list[str]
    cwd: str = ""
    pid: int = Field(0, description="Host pid; for telling runs of one process apart.")
    exit_code: int | None = None
    replaced: bool = False


class Provenance(BaseModel):
    """What a call did, observed by the sandbox: programs run, workspace files read.

    ``runs`` is ``None`` where the backend cannot observe execution (it says why in
    :attr:`Sandbox.provenance`); ``reads`` likewise for file reads. Writes are not
    here: the host computes them for every backend from the workspace scans around
    the call (:attr:`bat_gym.core.record.ToolCallRecord.writes`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: tuple[ProgramRun, ...] | None = None
    runs_dropped: int = Field(0, ge=0, description="Runs past the record's cap.")
    reads: tuple[str, ...] | None = None

    @field_validator("reads", mode="before")
    @classmethod
    def _sorted(cls, value: object) -> object:
        return tuple(sorted(value)) if isinstance(value, (set, frozenset)) else value


class ExecResult(BaseModel):
    """What one ``execute_code`` call did.

    ``exit_code`` is ``None`` when the call did not finish by itself: it timed out, or
    the sandbox crashed and was restarted (``restarted``). Output is stdout and stderr
    interleaved as written, decoded as UTF-8 with replacement, and capped.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int | None
    output: str
    output_bytes: int = Field(description="Bytes the call wrote in total, before the cap.")
    duration_s: float
    timed_out: bool = False
    restarted: bool = Field(
        False, description="The sandbox died or stopped answering and was restarted."
    )
    provenance: Provenance = Field(default_factory=Provenance)

    @property
    def ok(self) -> bool:
        """True when the call ran to completion and exited 0."""
        return self.exit_code == 0

    @classmethod
    def lost(cls, duration_s: float) -> ExecResult:
        """The result of a call whose sandbox stopped answering and was restarted.

        Nothing is known about what the call did, so nothing is guessed: no exit code,
        no output, ``restarted`` set.
        """
        return cls(
            exit_code=None,
            output="[the sandbox stopped answering and was restarted; files written so far are kept]",
            output_bytes=0,
            duration_s=duration_s,
            restarted=True,
        )


class Sandbox(ABC):
    """An isolated workspace that runs agent code.

    Backends set the class flags below; callers check them rather than backend names.
    Use a sandbox as a context manager, or call :meth:`close`: nothing it started
    (processes, containers, directories) outlives it.
    """

    NETWORK_ALLOWED: ClassVar[bool] = False
    SUPPORTS_SNAPSHOT: ClassVar[bool] = True
    backend: ClassVar[str]

    def __new__(cls, *args: Any, **kwargs: Any) -> Sandbox:
        """Create the sandbox and track it, so that a SIGTERM closes it (module end)."""
        box = super().__new__(cls)
        _track(box)
        return box

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "close" in cls.__dict__:
            cls.close = _uninterrupted(cls.__dict__["close"])  # type: ignore[method-assign]

    isolation: Isolation
    limits: SandboxLimits
    _slot: Any  # the backend's Slot: a locked directory of its own
    store: BlobStore
    index: WorkspaceIndex

    @property
    @abstractmethod
    def workspace(self) -> Path:
        """Host path of the workspace; read it only between calls."""

    @abstractmethod
    def execute_code(
        self, language: Language, code: str, timeout_s: float | None = None
    ) -> ExecResult:
        """Run ``code`` as a fresh ``python`` or ``bash`` process in the workspace."""

    @abstractmethod
    def restore(self, snapshot: Snapshot) -> None:
        """Kill every process the agent started and make the workspace equal ``snapshot``."""

    def digest(self) -> str:
        """Digest of the workspace as it is now, rehashing only files that changed."""
        return self.index.scan().digest

    @property
    def agent_workspace(self) -> str:
        """The workspace's path as agent code sees it (``/workspace`` when isolated)."""
        return "/workspace"

    def scan(self) -> Snapshot:
        """The workspace as it is now (entries and digest), rehashing only what changed.

        Raises:
            WorkspaceRejected: as :meth:`freeze`.
        """
        return self.index.scan()

    def capture(self) -> Snapshot:
        """Store the workspace's files in the blob store and return its snapshot."""
        return self.index.capture(self.store)

    @property
    def frozen_store(self) -> BlobStore:
        """Where :meth:`freeze` puts an episode's final workspace.

        A :class:`~bat_gym.core.sandbox.snapshot.ScratchStore` over :attr:`store` in the
        sandbox's own directory: it shares what the store already holds, and the next
        freeze empties it, so frozen episodes never accumulate.
        """
        scratch = getattr(self, "_frozen_store", None)
        if scratch is None or scratch.base is not self.store:
            scratch = ScratchStore(self.scratch_dir / "frozen", self.store)
            self._frozen_store = scratch
        return scratch

    @property
    def scratch_dir(self) -> Path:
        """A host directory of this sandbox's own, deleted with it."""
        return self._slot.dir

    def freeze(self) -> Snapshot:
        """Capture the workspace for scoring once an episode is over.

        The snapshot goes to :attr:`frozen_store`, emptied first; the verifier reads
        only it. A backend stops the agent's processes first (:meth:`_stop_agent`), so
        nothing is still writing while the workspace is read.

        Raises:
            WorkspaceRejected: the workspace is past its quota or holds what the host
                must not follow or store; nothing of it is kept.
        """
        self._stop_agent()
        store = self.frozen_store
        assert isinstance(store, ScratchStore)
        store.clear()
        return self.index.capture(store)

    @property
    def observes(self) -> frozenset[str]:
        """What the sandbox records of each call beyond its output (:class:`Provenance`).

        ``"runs"``: every program executed, with argv and exit status; ``"reads"``:
        the workspace files the call opened. Empty for a backend that observes
        neither; :attr:`observe_note` says why something is missing.
        """
        return frozenset()

    @property
    def observe_note(self) -> str:
        """Why :attr:`observes` lacks something, or ``""``."""
        return getattr(self, "_observe_note", "")

    @abstractmethod
    def _stop_agent(self) -> None:
        """Kill every process agent code started (the sandbox stays usable)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything the sandbox holds. Safe to call twice."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- teardown on SIGTERM ---------------------------------------------------------------
# A process ended by an unhandled SIGTERM runs no finalizer, so its sandboxes' slot
# directories (and docker containers) would outlive it. multiprocessing and Gymnasium's
# AsyncVectorEnv end their workers exactly so (``terminate()``) when the driver exits,
# e.g. on Ctrl-C. The first sandbox of a process whose SIGTERM is unhandled therefore
# installs a handler that closes that process's sandboxes and then dies of SIGTERM as
# before. A close already under way (a worker tearing down after Ctrl-C) is not cut
# short: the process dies when it returns.

_owned: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_teardown = {"closing": 0, "terminating": False}


def _forget_parent_sandboxes() -> None:
    # A forked child holds copies of its parent's sandboxes; closing those would kill
    # the parent's processes and delete its workspaces.
    _owned.clear()
    _teardown.update(closing=0, terminating=False)


os.register_at_fork(after_in_child=_forget_parent_sandboxes)


def _track(box: Sandbox) -> None:
    _owned.add(box)
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    _teardown["terminating"] = True
    if not _teardown["closing"]:
        _close_owned_and_die()


def _close_owned_and_die() -> None:
    _teardown["closing"] += 1
    try:
        for box in list(_owned):
            with contextlib.suppress(Exception):
                box.close()
    finally:
        _teardown["closing"] -= 1
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the exit status an unhandled SIGTERM gives
    else:  # only the main thread may reset the handler: let it finish there
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)


def _uninterrupted(close: Callable[[Sandbox], None]) -> Callable[[Sandbox], None]:
    """Wrap a backend's ``close`` so that a SIGTERM arriving meanwhile waits for it."""

    @functools.wraps(close)
    def wrapper(self: Sandbox) -> None:
        _teardown["closing"] += 1
        try:
            close(self)
        finally:
            _teardown["closing"] -= 1
            _owned.discard(self)
        if _teardown["terminating"] and not _teardown["closing"]:
            _close_owned_and_die()

    return wrapper
