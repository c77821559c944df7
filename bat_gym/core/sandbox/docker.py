"""The ``docker`` sandbox backend: one warm container per sandbox.

The container runs the base image (see ``docker_image.py``) with no network, a
read-only root filesystem, a private tmpfs ``/tmp``, cgroup limits on memory and
processes, every capability dropped and ``no-new-privileges``. Its main process is
the local backend's supervisor (``_supervisor.py``, copied in read-only), running as
the agent's unprivileged uid. Being the PID namespace's init, it cannot be signalled
from inside; it marks itself non-dumpable, so agent code can neither trace it nor
open its descriptors.

The supervisor is reached without the engine: at start it connects to a unix socket
the host listens on in the read-only run directory; the host accepts that one
connection, removes the socket, and hands over the supervisor's ends of five pipes
(``SCM_RIGHTS``). Calls, replies, bash output and status then travel over pipes
between the host and the container's processes, exactly as in the local backend
(:mod:`~bat_gym.core.sandbox._supervisor_link`): a step costs a pipe round trip, not an
engine request. The bash server runs from an execute-only copy of the image's bash,
so code it forks cannot reach the status pipe through ``/proc`` either. A reply that
never comes (the container died, or was killed for memory) restarts the container,
and the call is reported lost, never guessed.

The workspace is a host directory (the same locked slot directories the ``local``
backend uses) bind-mounted at ``/workspace``. A reset is one request: the supervisor
kills every other process in the container and empties ``/tmp``, ``/dev/shm`` and
System V IPC, while the host restores the files that changed, incrementally; the
container stays up.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socket
import struct
import tarfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import SandboxCrashed, SandboxUnavailable
from bat_gym.core.sandbox import _supervisor, exec_filter, trees
from bat_gym.core.sandbox._supervisor_link import (
    SupervisorLink,
    exec_listener,
    make_pipes,
    provenance,
    to_result,
)
from bat_gym.core.sandbox.base import (
    AGENT_ENV,
    ExecResult,
    Isolation,
    Language,
    Sandbox,
    SandboxLimits,
)
from bat_gym.core.sandbox.docker_image import ensure_image, import_check
from bat_gym.core.sandbox.engine import connect, load_sdk
from bat_gym.core.sandbox.exec_trace import ExecLog, exec_tracer
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.sandbox.slots import Slot, UidLease, runtime_dir
from bat_gym.core.sandbox.snapshot import BlobStore, Snapshot

if TYPE_CHECKING:
    import docker

__all__ = ["DockerSandbox", "connect"]

log = logging.getLogger(__name__)

_LABEL = "bat-gym.slot"
_RUN_DIR = "/run/bat"
_LINK = "link.sock"
_START_TIMEOUT_S = 30.0
# How often a start that waits for the supervisor's connection looks whether the
# container died meanwhile.
_START_POLL_S = 0.25
# What runs inside the container: real files beside this one, copied in, never imported.
_IN_CONTAINER = {
    "supervisor.py": Path(_supervisor.__file__),
    "trees.py": Path(trees.__file__),
    "exec_filter.py": Path(exec_filter.__file__),
}
# Where the image keeps bash; the first that is a regular file is copied out.
_IMAGE_BASH = ("/usr/bin/bash", "/bin/bash")
_PRELOAD = ("numpy", "numpy.random")
# Out of memory, the kernel kills an agent process before the supervisor (whose death
# would cost a container restart).
_AGENT_OOM_SCORE_ADJ = 1000

_checked_images: set[tuple[str, tuple[str, ...]]] = set()
_image_bash: dict[str, bytes] = {}  # image id -> its bash, read once per process
_image_bash_lock = threading.Lock()


def _finalize(
    client: docker.DockerClient,
    box: list[str],
    links: list[SupervisorLink],
    call_fd: int,
    slot: Slot,
    lease: UidLease | None,
    own_client: bool,
) -> None:
    # Runs on close(), on garbage collection or at exit: must not touch the sandbox.
    for link in links:
        link.close()
    links.clear()
    if box:
        with contextlib.suppress(Exception):
            client.api.remove_container(box[0], force=True)
        box.clear()
    with contextlib.suppress(OSError):
        os.close(call_fd)
    slot.release()
    if lease is not None:
        lease.release()
    if own_client:
        with contextlib.suppress(Exception):
            client.close()


_LEFTOVER_POLLS = 5


def _pids_current_path(pid: int) -> Path | None:
    """The ``pids.current`` file of the cgroup process ``pid`` is in, if the host shows it."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/pids") / path.lstrip("/") / "pids.current"
        elif controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "pids.current"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


class _TaskCount:
    """The container's task count, read from the host's cgroupfs in one ``pread``.

    Unavailable (``None``) where the engine's cgroups are not visible here: a rootless
    or remote engine. Located from the supervisor's host pid at each start (a restart
    makes the cgroup anew); ``idle`` is the count then: the supervisor and its bash
    server.
    """

    def __init__(self) -> None:
        self.fd = -1
        self.idle = 0

    def reset(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def locate(self, pid: int) -> None:
        self.reset()
        path = _pids_current_path(pid)
        with contextlib.suppress(OSError, ValueError):
            if path is not None:
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                self.idle = int(os.pread(self.fd, 32, 0))

    def read(self) -> int | None:
        if self.fd < 0:
            return None
        try:
            return int(os.pread(self.fd, 32, 0))
        except (OSError, ValueError):
            self.reset()
            return None


class DockerSandbox(Sandbox):
    """A sandbox in a warm Docker container.

    Args:
        limits: resource limits for agent code.
        image: the image to run; by default the offline-built base image with what
            ``requirements`` ask for (:func:`bat_gym.core.sandbox.docker_image.ensure_image`),
            built on first use. It needs ``python3`` (3.10 or later) and ``bash``.
        requirements: the modules agent code must be able to import (the benchmark's
            :meth:`~bat_gym.benchmark.Benchmark.sandbox_requirements`); checked in the
            first container of each image in this process.
        store: blob store for snapshots (default: one under the slot directory).
        client: a Docker SDK client (default: :func:`connect`); one passed in is not
            closed with the sandbox.
        observe: record every program a call runs (as the ``local`` backend does); it
            needs root or ``CAP_SYS_PTRACE`` on the host, and without it
            :attr:`observe_note` says so. Workspace reads are recorded either way.

    ``limits.total_memory_mb`` bounds the whole container (a cgroup limit, which also
    counts files in ``/tmp``), as on the ``local`` backend; ``limits.memory_mb`` (a
    per-process address-space limit there) is not applied here. ``limits.max_processes``
    bounds the container's tasks (threads count, the supervisor's two included).
    Processes a call leaves running are killed when it returns, where the engine's
    cgroups are visible from this host.

    The engine must run on this host (a local socket): the host hands the container
    pipe descriptors through a unix socket on a bind mount.

    Raises:
        SandboxUnavailable: the Docker SDK is missing, no engine answers, the image
            cannot be had, or it cannot import a module ``requirements`` name. The
            message says what to do.
    """

    backend = "docker"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        image: str | None = None,
        store: BlobStore | None = None,
        client: docker.DockerClient | None = None,
        requirements: SandboxRequirements | None = None,
        observe: bool = True,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.requirements = requirements
        self.isolation = Isolation.CONTAINER
        # Reading each program's argv from a container process's memory needs the
        # right to ptrace it: the host is not its ancestor.
        self.observe = observe and _may_ptrace_any()
        self._observe_note = (
            ""
            if self.observe
            else "programs run are not recorded: observe=False"
            if not observe
            else "programs run are not recorded: the host needs root or CAP_SYS_PTRACE "
            "to read what a container's processes execute"
        )
        self._sdk = load_sdk()
        self._client = client or connect()
        self._api = self._client.api
        try:
            self.image = image or ensure_image(requirements, client=self._client)
            self._slot = Slot(runtime_dir(), "docker")
        except BaseException:
            if client is None:
                self._client.close()
            raise
        self._closed = False
        # As root, agent code gets a leased uid of its own (from the pool the local
        # backend uses too) and the workspace belongs to it; otherwise the bind mount is
        # only writable by the caller's uid, so agent code runs as that.
        self._root = os.getuid() == 0
        self._lease = UidLease("docker") if self._root else None
        self._uid = self._lease.uid if self._lease else os.getuid()
        self._gid = self._lease.uid if self._lease else os.getgid()
        self._box: list[str] = []  # the container id, shared with the finalizer
        self._links: list[SupervisorLink] = []  # the running supervisor's, likewise
        self._exec_log: ExecLog | None = None
        self._tasks = _TaskCount()
        # Read-only inside: the supervisor, its helpers, and each bash call's code.
        self._run = self._slot.dir / "run"
        self._run.mkdir(mode=0o755)
        self._call_fd = os.open(self._run / "call.sh", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._finalizer = weakref.finalize(
            self,
            _finalize,
            self._client,
            self._box,
            self._links,
            self._call_fd,
            self._slot,
            self._lease,
            client is None,
        )
        # A container labelled with our slot belongs to a process that died holding it:
        # the slot's lock is ours now, so nobody else can be using it.
        self._remove_stale()
        # On a tmpfs of the quota's size where the host may mount one (see mounts.py).
        self._ws, self.workspace_capped, self.index = self._slot.open_workspace(
            self.limits, (self._uid, self._gid) if self._root else None
        )
        for name, source in _IN_CONTAINER.items():
            (self._run / name).write_bytes(source.read_bytes())
            (self._run / name).chmod(0o644)
        self.store = store or BlobStore(self._slot.dir / "store")
        try:
            self._create()
            self._check_requirements(chosen=image is not None)
        except BaseException:
            self.close()
            raise

    def _check_requirements(self, *, chosen: bool) -> None:
        """Refuse an image that cannot import a required module (once per image and set)."""
        modules = self.requirements.modules if self.requirements else ()
        if not modules:
            return
        try:
            key = (self._api.inspect_image(self.image)["Id"], modules)
        except Exception:  # noqa: BLE001 - the container runs it, so it exists
            key = (self.image, modules)
        if key in _checked_images:
            return
        r = self.execute_code("python", import_check(modules), timeout_s=60)
        if not r.ok:
            fix = (
                "pass an image that has them, or leave image= unset so that bat-gym builds one"
                if chosen
                else f"remove it (`docker rmi {self.image}`) so that the next start rebuilds it"
            )
            raise SandboxUnavailable(
                "docker",
                f"image {self.image!r} cannot import what the sandbox needs:\n"
                f"{r.output.strip()[-2000:]}\nFix: {fix}",
            )
        _checked_images.add(key)

    # -- the container ----------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """Host path of the workspace, bound at ``/workspace`` inside."""
        return self._ws

    @property
    def container_id(self) -> str | None:
        """The id of the container, or ``None`` once closed."""
        return self._box[0] if self._box else None

    def _remove_stale(self) -> None:
        with contextlib.suppress(Exception):
            for c in self._api.containers(
                all=True, filters={"label": f"{_LABEL}={self._slot.dir}"}
            ):
                with contextlib.suppress(Exception):
                    self._api.remove_container(c["Id"], force=True)

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            **AGENT_ENV,
        }

    def _create(self) -> None:
        """Create the container, put the image's bash in the run directory, start it."""
        sdk = self._sdk
        lim = self.limits
        mib = 1 << 20
        # No CPU limit here: the supervisor is one of the container's processes and
        # sets each call's own (RLIMIT_CPU) in the process that runs it.
        ulimits = [
            sdk.types.Ulimit(name="fsize", soft=lim.max_file_mb * mib, hard=lim.max_file_mb * mib),
            sdk.types.Ulimit(name="nofile", soft=1024, hard=1024),
            sdk.types.Ulimit(name="core", soft=0, hard=0),
        ]
        host_config = self._api.create_host_config(
            binds={
                str(self._ws): {"bind": "/workspace", "mode": "rw"},
                str(self._run): {"bind": _RUN_DIR, "mode": "ro"},
            },
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={lim.tmp_mb}m,mode=1777"},
            shm_size=lim.tmp_mb * mib,
            mem_limit=lim.total_memory_mb * mib,
            memswap_limit=lim.total_memory_mb * mib,  # no swap beyond the memory limit
            pids_limit=lim.max_processes,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=ulimits,
            ipc_mode="private",
        )
        try:
            created = self._api.create_container(
                self.image,
                # -s: no user site; the image's own site-packages are on the path.
                command=[
                    "python3",
                    "-s",
                    f"{_RUN_DIR}/supervisor.py",
                    "--connect",
                    f"{_RUN_DIR}/{_LINK}",
                ],
                user=f"{self._uid}:{self._gid}",
                working_dir="/workspace",
                environment=self._env(),
                hostname="sandbox",
                labels={_LABEL: str(self._slot.dir)},
                host_config=host_config,
                network_disabled=True,
            )
            self._box[:] = [created["Id"]]
            self._copy_bash()
        except self._sdk.errors.DockerException as exc:
            raise SandboxUnavailable(
                "docker", f"the container could not be made from image {self.image!r}: {exc}"
            ) from None
        self._start()

    def _copy_bash(self) -> None:
        """The image's bash, into the run directory, executable but not readable.

        The kernel marks a process running a binary it may not read non-dumpable, so
        code the bash server forks cannot open its status descriptor through ``/proc``.
        """
        key = self._api.inspect_container(self._box[0])["Image"]
        with _image_bash_lock:
            data = _image_bash.get(key)
            if data is None:
                data = _read_image_file(self._api, self._box[0], _IMAGE_BASH)
                if data is None:
                    raise SandboxUnavailable(
                        "docker",
                        f"image {self.image!r} has no bash at {' or '.join(_IMAGE_BASH)}: "
                        "use an image that has bash, or leave image= unset",
                    )
                _image_bash[key] = data
        dest = self._run / "bash"
        if not dest.exists():
            tmp = self._run / ".bash.tmp"
            tmp.write_bytes(data)
            os.chmod(tmp, 0o711 if self._root else 0o111)
            os.replace(tmp, dest)

    def _cfg(self) -> dict:
        """What the supervisor is told at start (see ``_supervisor.main``)."""
        return {
            "workspace": "/workspace",
            "tmp": "/tmp",
            "scratch": ["/dev/shm"],
            "call_file": f"{_RUN_DIR}/call.sh",
            "pid_namespace": True,
            "bash": f"{_RUN_DIR}/bash",
            "trees": f"{_RUN_DIR}/trees.py",
            "env": self._env(),
            "preload": list(_PRELOAD),
            "site_dirs": [],
            "drop_to": None,  # the container's user is the agent's already
            # The supervisor shares the container's memory limit with agent code.
            "agent_oom_score_adj": _AGENT_OOM_SCORE_ADJ,
            "exec_filter": f"{_RUN_DIR}/exec_filter.py" if self.observe else None,
            "rlimits": {
                "RLIMIT_FSIZE": self.limits.max_file_mb << 20,
                "RLIMIT_NOFILE": 1024,
                "RLIMIT_CORE": 0,
                # POSIX message queues live outside any file system a reset clears.
                "RLIMIT_MSGQUEUE": 0,
            },
        }

    def _start(self) -> None:
        """Start the container and link up with its supervisor.

        Raises:
            SandboxUnavailable: the container did not start, or its supervisor did not
                connect and report ready (the message has the end of its log).
        """
        cid = self._box[0]
        path = self._run / _LINK
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        conn: socket.socket | None = None
        run = os.open(self._run, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # Through the directory's descriptor: a socket's path may be at most 107
            # bytes, and the runtime directory can be anywhere.
            listener.bind(f"/proc/self/fd/{run}/{_LINK}")
            if self._root:
                os.chown(path, self._uid, self._gid)
            os.chmod(path, 0o600)
            listener.listen(1)
            listener.settimeout(_START_POLL_S)
            self._api.start(cid)
            conn = self._accept(listener)
        except self._sdk.errors.DockerException as exc:
            raise SandboxUnavailable(
                "docker", f"the container did not start from image {self.image!r}: {exc}"
            ) from None
        finally:
            # One connection only, taken before any agent code could run: nothing
            # else in the container can ever connect.
            listener.close()
            os.close(run)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        with conn:
            ours, theirs = make_pipes()
            try:
                data = json.dumps(self._cfg()).encode()
                socket.send_fds(conn, [struct.pack("!Q", len(data)) + data], theirs)
            except OSError as exc:
                for fd in ours:
                    os.close(fd)
                raise SandboxUnavailable(
                    "docker", f"the supervisor hung up at start: {exc}{self._log_tail()}"
                ) from None
            finally:
                for fd in theirs:
                    os.close(fd)
            link = SupervisorLink(ours, self._call_fd, self.limits.record_output_bytes)
            self._links[:] = [link]
            self._exec_log = self._take_exec_listener(conn) if self.observe else None
        ready = link.recv(_START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            raise SandboxUnavailable(
                "docker", f"the sandbox's supervisor did not start{self._log_tail()}"
            )
        with contextlib.suppress(Exception):
            self._tasks.locate(int(self._api.inspect_container(cid)["State"]["Pid"]))

    def _accept(self, listener: socket.socket) -> socket.socket:
        """The supervisor's connection; fails early if the container stops first."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if time.monotonic() >= deadline or not self._running():
                    raise SandboxUnavailable(
                        "docker", f"the sandbox's supervisor never connected{self._log_tail()}"
                    ) from None
                continue
            conn.settimeout(_START_TIMEOUT_S)
            return conn

    def _log_tail(self) -> str:
        with contextlib.suppress(Exception):
            text = self._api.logs(self._box[0], tail=20).decode(errors="replace").strip()
            if text:
                return f"; its output ends:\n{text[-2000:]}"
        return ""

    def _take_exec_listener(self, conn: socket.socket) -> ExecLog | None:
        """Receive the supervisor's exec listener and serve it; None (and why) if none came."""
        execs, self._observe_note = exec_listener(conn, 0)
        return execs

    def _running(self) -> bool:
        try:
            state = self._api.inspect_container(self._box[0])["State"]
        except Exception:
            return False
        return bool(state.get("Running")) and not state.get("Restarting")

    def _unlink(self) -> None:
        """Let go of the supervisor: its pipes and the record of its execs."""
        for link in self._links:
            link.close()
        self._links.clear()
        if self._exec_log is not None:
            exec_tracer().close(self._exec_log)
            self._exec_log = None
        self._tasks.reset()

    def _restart(self) -> None:
        """Kill everything in the container and start it again; the workspace stays."""
        self._stop_container()
        self._start_again()

    def _stop_container(self) -> None:
        """Kill everything in the container and wait for it to stop."""
        self._unlink()
        cid = self._box[0] if self._box else None
        if cid is not None:
            with contextlib.suppress(Exception):
                self._api.kill(cid)
            with contextlib.suppress(Exception):
                self._api.wait(cid, timeout=_START_TIMEOUT_S)

    def _start_again(self) -> None:
        """Start the stopped container, or a new one if it cannot start or is gone."""
        cid = self._box[0] if self._box else None
        if cid is not None:
            try:
                self._start()
                return
            except SandboxUnavailable:
                self._unlink()
                with contextlib.suppress(Exception):
                    self._api.remove_container(cid, force=True)
                self._box.clear()
        self._create()  # the container is gone: make a new one

    # -- the Sandbox API ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")

    def _link(self) -> SupervisorLink:
        self._check_open()
        if not self._links:  # an earlier restart failed: try once more
            self._restart()
        return self._links[0]

    def execute_code(
        self, language: Language, code: str, timeout_s: float | None = None
    ) -> ExecResult:
        """Run ``code`` in a fresh process; never raises for anything the code does."""
        if language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', got {language!r}")
        self._check_open()
        timeout = float(timeout_s if timeout_s is not None else self.limits.timeout_s)
        cpu_s = min(self.limits.cpu_s, max(1, int(timeout) + 1))
        start = time.monotonic()
        try:
            link = self._link()
        except SandboxUnavailable as exc:
            log.warning("docker sandbox %s: %s", self._slot.dir, exc)
            return ExecResult.lost(time.monotonic() - start)
        execs = self._exec_log
        if execs is not None:
            execs.discard()  # what ran between calls: the sandbox's own restarts
        self.index.take_reads()  # the host's own reads, while it scanned
        reply = link.run(language, code, timeout, cpu_s)
        if reply is None:
            return self._crashed(start, f"no reply to a {language} call")
        return to_result(
            reply,
            timeout,
            self._stop_leftovers,
            lambda: provenance(self.index.take_reads(), execs, self._exec_log),
        )

    def _crashed(self, start: float, why: str) -> ExecResult:
        """Restart the container and report that nothing is known about the call."""
        log.warning("docker sandbox %s: %s; restarting the container", self._slot.dir, why)
        try:
            self._restart()
        except SandboxUnavailable as exc:  # the next call tries again
            log.warning("docker sandbox %s: the restart failed: %s", self._slot.dir, exc)
        return ExecResult.lost(time.monotonic() - start)

    def _stop_leftovers(self) -> bool:
        """Kill what a finished call left running; True if there was anything.

        One ``pread`` of the container's task count when nothing was left; where the
        count cannot be read from here (see :class:`_TaskCount`), leftovers live on
        until the next reset.
        """
        count = self._tasks.read()
        if count is None or count <= self._tasks.idle:
            return False
        # A child that exited just now counts until the supervisor reaps it, and it
        # reaps what has exited before it answers a request; an orphan's last exit may
        # still be on its way, so look again for a few milliseconds.
        try:
            if not self._links or not self._links[0].ok("ping"):
                self._restart()
                return True
            for _ in range(_LEFTOVER_POLLS):
                count = self._tasks.read()
                if count is None or count <= self._tasks.idle:
                    return False
                time.sleep(0.001)
            self._stop_agent()
        except SandboxUnavailable as exc:  # the call's result stands; the next call retries
            log.warning("docker sandbox %s: the restart failed: %s", self._slot.dir, exc)
        return True

    @property
    def observes(self) -> frozenset[str]:  # noqa: D102
        return frozenset({"runs", "reads"} if self._exec_log is not None else {"reads"})

    def _stop_agent(self) -> None:
        """Kill the agent's processes (a fresh container if that fails)."""
        self._check_open()
        if not self._links or not self._links[0].ok("kill"):
            self._restart()

    def restore(self, snapshot: Snapshot) -> None:
        """Kill the agent's processes, clear its scratch space, restore the workspace in place.

        Scratch space is ``/tmp``, ``/dev/shm`` and System V IPC objects. A supervisor
        that does not answer has its container stopped, and started again (no process,
        empty scratch space) only once the workspace is restored: the container starts
        in the workspace, which the agent may have locked (``chmod 000 /workspace``).
        """
        self._check_open()
        reset = bool(self._links) and self._links[0].ok("reset")
        if not reset:
            self._stop_container()  # no process of the agent's may write while the host restores
        self.index.restore(snapshot, self.store)
        if not reset:
            self._start_again()

    def close(self) -> None:
        """Remove the container and delete the slot directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._exec_log is not None:
            exec_tracer().close(self._exec_log)
            self._exec_log = None
        self._tasks.reset()
        self.index.close()
        self._finalizer()


def _may_ptrace_any() -> bool:
    """Whether this process holds ``CAP_SYS_PTRACE`` (root normally does)."""
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caps >> 19 & 1)


def _read_image_file(api: Any, cid: str, paths: tuple[str, ...]) -> bytes | None:
    """The bytes of the first of ``paths`` that is a regular file in container ``cid``."""
    for path in paths:
        try:
            stream, _ = api.get_archive(cid, path)
        except Exception:  # noqa: BLE001 - not there: try the next
            continue
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            if member is not None and member.isfile():
                f = tar.extractfile(member)
                if f is not None:
                    return f.read()
    return None
