"""The ``docker`` sandbox backend: one warm container per sandbox.

The container runs the base image (see ``docker_image.py``) with no network, a
read-only root filesystem, a private tmpfs ``/tmp``, cgroup limits on memory and
processes, every capability dropped and ``no-new-privileges``. Its main process is a
sleeping ``sleep infinity`` under Docker's init, both as the container's root; agent
code runs in it through ``docker exec`` as an unprivileged uid, so agent code can
neither signal the main process nor keep the container from being reset.

The workspace is a host directory (the same locked slot directories the ``local``
backend uses) bind-mounted at ``/workspace``. Restores therefore happen on the host,
incrementally, while the container stays up: a reset is one ``exec`` that kills every
agent process and clears ``/tmp``, plus a host-side restore of changed files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import struct
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.errors import SandboxCrashed, SandboxUnavailable
from bat_gym.sandbox import exec_filter, fdwait
from bat_gym.sandbox._supervisor import OutputCapture
from bat_gym.sandbox.base import (
    AGENT_ENV,
    ExecResult,
    Isolation,
    Language,
    Provenance,
    Sandbox,
    SandboxLimits,
)
from bat_gym.sandbox.docker_image import ensure_image, import_check
from bat_gym.sandbox.engine import connect, load_sdk
from bat_gym.sandbox.exec_trace import ExecLog, exec_tracer, steal_fd
from bat_gym.sandbox.requirements import SandboxRequirements
from bat_gym.sandbox.slots import Slot, UidLease, runtime_dir
from bat_gym.sandbox.snapshot import BlobStore, Snapshot, WorkspaceIndex

if TYPE_CHECKING:
    import docker

__all__ = ["DockerSandbox", "connect"]

log = logging.getLogger(__name__)

_LABEL = "bat-gym.slot"
_RUN_DIR = "/run/bat"
# Longest code passed as an argument; the kernel refuses a single argument past 128 KiB
# (MAX_ARG_STRLEN), so longer code goes through a file in the read-only run directory.
_MAX_ARG_BYTES = 100_000
_KILL_TIMEOUT_S = 10.0
_DRAIN_GRACE_S = 2.0
_FRAME = struct.Struct(">BxxxL")
_STDOUT = 1
# What runs inside the container: real files beside this one, copied in, never imported.
_IN_CONTAINER = {
    "boot.py": Path(__file__).with_name("_docker_boot.py"),
    "reset.py": Path(__file__).with_name("_docker_reset.py"),
    "exec_filter.py": Path(exec_filter.__file__),
}

_checked_images: set[tuple[str, tuple[str, ...]]] = set()


# A first kill from the shell, which starts in a fraction of Python's time: under a
# fork bomb of CPU-bound processes, every millisecond of CPU the reset needs takes long.
_RESET_SH = f'kill -9 -1 2>/dev/null; exec python3 -I -S {_RUN_DIR}/reset.py "$1"'


def _finalize(
    client: docker.DockerClient,
    box: list[str],
    slot: Slot,
    lease: UidLease | None,
    own_client: bool,
) -> None:
    # Runs on close(), on garbage collection or at exit: must not touch the sandbox.
    if box:
        with contextlib.suppress(Exception):
            client.api.remove_container(box[0], force=True)
        box.clear()
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
    or remote engine. Located lazily from the container's init pid, again after a
    restart (which makes the cgroup anew).
    """

    def __init__(self) -> None:
        self.fd = -1
        self.idle = 0

    def reset(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def read(self, api: Any, cid: str) -> int | None:
        if self.fd < 0:
            with contextlib.suppress(Exception):
                path = _pids_current_path(int(api.inspect_container(cid)["State"]["Pid"]))
                if path is not None:
                    self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    self.idle = int(os.pread(self.fd, 32, 0))  # init and sleep, at start
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
            ``requirements`` ask for (:func:`bat_gym.sandbox.docker_image.ensure_image`),
            built on first use.
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
    bounds the container's tasks (threads count). Processes a call leaves running are
    killed when it returns, where the engine's cgroups are visible from this host.

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
        # Taking boot's listener (pidfd_getfd) needs the right to ptrace into the container.
        self._trace_execs = observe and _may_ptrace_any()
        self._observe_note = (
            ""
            if self._trace_execs
            else "programs run are not recorded: observe=False"
            if not observe
            else "programs run are not recorded: the host needs root or CAP_SYS_PTRACE "
            "to take each call's exec listener from the container"
        )
        # As root, agent code gets a leased uid of its own (from the pool the local
        # backend uses too) and the workspace belongs to it; otherwise the bind mount is
        # only writable by the caller's uid, so agent code runs as that.
        self._root = os.getuid() == 0
        self._lease = UidLease("docker") if self._root else None
        self._uid = self._lease.uid if self._lease else os.getuid()
        self._gid = self._lease.uid if self._lease else os.getgid()
        self._box: list[str] = []  # the container id, shared with the finalizer
        self._tasks = _TaskCount()
        self._finalizer = weakref.finalize(
            self, _finalize, self._client, self._box, self._slot, self._lease, client is None
        )
        # A container labelled with our slot belongs to a process that died holding it:
        # the slot's lock is ours now, so nobody else can be using it.
        self._remove_stale()
        # On a tmpfs of the quota's size where the host may mount one (see mounts.py).
        self._ws, self.workspace_capped = self._slot.make_workspace(
            size_mb=self.limits.workspace_mb,
            files=self.limits.workspace_files,
            owner=(self._uid, self._gid) if self._root else None,
        )
        # Read-only inside: boot.py, and code too long to pass as an argument.
        self._run = self._slot.dir / "run"
        self._run.mkdir(mode=0o755)
        for name, source in _IN_CONTAINER.items():
            (self._run / name).write_bytes(source.read_bytes())
            (self._run / name).chmod(0o644)
        self.store = store or BlobStore(self._slot.dir / "store")
        self.index = WorkspaceIndex(
            self._ws,
            owner=(self._uid, self._gid) if self._root else None,
            watch=True,
            limits=self.limits.workspace_limits(),
        )
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

    def _create(self) -> None:
        sdk = self._sdk
        lim = self.limits
        mib = 1 << 20
        ulimits = [
            sdk.types.Ulimit(name="fsize", soft=lim.max_file_mb * mib, hard=lim.max_file_mb * mib),
            sdk.types.Ulimit(name="nofile", soft=1024, hard=1024),
            sdk.types.Ulimit(name="cpu", soft=lim.cpu_s, hard=lim.cpu_s),
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
            mem_limit=lim.total_memory_mb * mib,
            memswap_limit=lim.total_memory_mb * mib,  # no swap beyond the memory limit
            pids_limit=lim.max_processes,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=ulimits,
            init=True,
            ipc_mode="private",
        )
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            **AGENT_ENV,
        }
        try:
            created = self._api.create_container(
                self.image,
                command=["sleep", "infinity"],
                user="0:0",  # the main process only; every exec names the agent uid
                working_dir="/workspace",
                environment=env,
                hostname="sandbox",
                labels={_LABEL: str(self._slot.dir)},
                host_config=host_config,
                network_disabled=True,
            )
            self._box[:] = [created["Id"]]
            self._api.start(created["Id"])
        except self._sdk.errors.DockerException as exc:
            raise SandboxUnavailable(
                "docker", f"the container did not start from image {self.image!r}: {exc}"
            ) from None

    def _running(self) -> bool:
        try:
            state = self._api.inspect_container(self._box[0])["State"]
        except Exception:
            return False
        return bool(state.get("Running")) and not state.get("Restarting")

    def _restart(self) -> None:
        """Kill everything in the container and start it again; the workspace stays."""
        self._tasks.reset()
        cid = self._box[0] if self._box else None
        if cid is not None:
            with contextlib.suppress(Exception):
                self._api.kill(cid)
            try:
                self._api.start(cid)
                return
            except self._sdk.errors.DockerException:
                with contextlib.suppress(Exception):
                    self._api.remove_container(cid, force=True)
                self._box.clear()
        self._create()  # the container is gone: make a new one

    def _start_exec(self, argv: list[str]) -> tuple[str, _Stream]:
        """Start ``argv`` as the agent uid in the workspace; return its id and output."""
        exec_id = self._api.exec_create(
            self._box[0],
            argv,
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
            user=f"{self._uid}:{self._gid}",
            workdir="/workspace",
        )["Id"]
        return exec_id, _Stream(self._api.exec_start(exec_id, socket=True))

    def _kill_all(self, clear_tmp: bool) -> bool:
        """Kill every agent process (and empty /tmp); False if that could not be done."""
        try:
            _, stream = self._start_exec(
                ["/bin/sh", "-c", _RESET_SH, "sh", "clear" if clear_tmp else "keep"]
            )
        except Exception:
            return False
        out = bytearray()
        try:
            deadline = time.monotonic() + _KILL_TIMEOUT_S
            while (frame := stream.read(deadline)) is not None:
                out += frame[1]
        except (TimeoutError, OSError):
            return False
        finally:
            stream.close()
        # Only a script that ran to its end says so; agent code that kills every process
        # of its uid in a loop can kill this one too, and then the container restarts.
        return bytes(out) == b"done\n"

    def _exit_code(self, exec_id: str) -> int | None:
        # The stream ends when the process does, but the engine may record the status
        # a moment later.
        deadline = time.monotonic() + 1.0
        while True:
            try:
                info = self._api.exec_inspect(exec_id)
            except Exception:
                return None
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)

    # -- the Sandbox API ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")

    def _argv(self, language: Language, code: str, cpu_s: int) -> list[str]:
        data = code.encode("utf-8", errors="surrogateescape")
        interpreter = "python3" if language == "python" else "bash"
        if len(data) <= _MAX_ARG_BYTES and "\x00" not in code:
            program = [interpreter, "-c", code]
        else:
            name = "call.py" if language == "python" else "call.sh"
            tmp = self._run / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            os.replace(tmp, self._run / name)
            program = [interpreter, f"{_RUN_DIR}/{name}"]
        trace = "trace" if self._trace_execs else "notrace"
        return ["python3", "-I", "-S", f"{_RUN_DIR}/boot.py", str(cpu_s), trace, *program]

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
        deadline = start + timeout
        cap = OutputCapture(self.limits.record_output_bytes)
        status = bytearray()
        if self._tasks.fd < 0 and self._box:  # the idle count, before anything runs
            self._tasks.read(self._api, self._box[0])
        argv = self._argv(language, code, cpu_s)
        try:
            exec_id, stream = self._start_exec(argv)
        except Exception:
            return self._crashed(start, "the exec could not start")  # the container is gone or not running
        tracer = _CallTrace(self, exec_id, tuple(argv[6:]))
        self.index.take_reads()  # the host's own reads, while it scanned
        try:
            while (frame := stream.read(deadline)) is not None:
                if frame[0] == _STDOUT:
                    cap.feed(frame[1])
                elif len(status) < 4096:
                    status += frame[1]
                    tracer.saw(status)
                    if tracer.failed:
                        raise OSError("the call's exec listener could not be taken")
        except TimeoutError:
            tracer.close()
            return self._timed_out(stream, cap, start, timeout)
        except OSError:
            tracer.close()
            stream.close()
            return self._crashed(start, "the exec's stream broke")
        stream.close()
        if self._stop_leftovers():
            cap.feed(b"\n[processes this call left running were stopped: none outlives its call]\n")
        provenance = tracer.finish()
        rc = _parse_status(status)
        if rc is None:
            # boot never reported: the call killed it (it runs as the agent's uid), it
            # could not start, or the container died under it.
            if not self._running():
                return self._crashed(start, "boot reported no status and the container is down")
            rc = self._exit_code(exec_id)
            if rc is None:
                return self._crashed(start, "boot reported no status and the engine none")
            if rc == 128 + signal.SIGKILL:
                cap.feed(b"\n[the process running this call was killed]\n")
                rc = -signal.SIGKILL
            else:
                cap.feed(b"\n" + bytes(status))
        return ExecResult(
            exit_code=rc,
            output=cap.text(),
            output_bytes=cap.total,
            duration_s=time.monotonic() - start,
            provenance=provenance,
        )

    def _timed_out(
        self, stream: _Stream, cap: OutputCapture, start: float, timeout: float
    ) -> ExecResult:
        killed = self._kill_all(clear_tmp=False)
        # What the killed processes wrote before they died may still be in flight.
        grace = time.monotonic() + _DRAIN_GRACE_S
        with contextlib.suppress(TimeoutError, OSError):
            while (frame := stream.read(grace)) is not None:
                if frame[0] == _STDOUT:
                    cap.feed(frame[1])
        stream.close()
        if not killed:
            self._restart()
        return ExecResult(
            exit_code=None,
            output=cap.text()
            + f"\n[timed out after {timeout:g} s: every process in the sandbox was killed]",
            output_bytes=cap.total,
            duration_s=time.monotonic() - start,
            timed_out=True,
            restarted=not killed,
        )

    def _crashed(self, start: float, why: str) -> ExecResult:
        """Restart the container and report that nothing is known about the call."""
        log.warning("docker sandbox %s: %s; restarting the container", self._slot.dir, why)
        self._restart()
        return ExecResult.lost(time.monotonic() - start)

    def _stop_leftovers(self) -> bool:
        """Kill what a finished call left running; True if there was anything.

        Compares the container's task count with the count it had idle; where the
        count cannot be read from here (see :class:`_TaskCount`), leftovers live on.
        """
        if not self._box:
            return False
        # The engine reaps a finished exec's process a moment after its stream ends:
        # give it a few milliseconds before calling what is left a leftover.
        for _ in range(_LEFTOVER_POLLS):
            count = self._tasks.read(self._api, self._box[0])
            if count is None or count <= self._tasks.idle:
                return False
            time.sleep(0.002)
        self._stop_agent()
        return True

    @property
    def observes(self) -> frozenset[str]:  # noqa: D102
        return frozenset({"reads"} if self._observe_note else {"runs", "reads"})

    def _stop_agent(self) -> None:
        """Kill the agent's processes before a freeze (a fresh container if that fails)."""
        self._check_open()
        if not self._kill_all(clear_tmp=False):
            self._restart()

    def restore(self, snapshot: Snapshot) -> None:
        """Kill the agent's processes, clear ``/tmp``, and restore the workspace in place."""
        self._check_open()
        if not self._kill_all(clear_tmp=True):
            self._restart()  # a fresh container has no process and an empty /tmp
        self.index.restore(snapshot, self.store)

    def close(self) -> None:
        """Remove the container and delete the slot directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
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


def _parse_status(data: bytearray) -> int | None:
    """The exit status boot reported: its last line, after the listener line."""
    lines = bytes(data).strip().split(b"\n")
    if lines and lines[0].startswith((b"listener ", b"nolistener")):
        lines = lines[1:]
    if len(lines) == 1 and lines[0].startswith(b"status "):
        with contextlib.suppress(ValueError):
            return int(lines[0][7:])
    return None


class _CallTrace:
    """The exec record of one docker call: takes boot's listener once boot names it.

    Taking a descriptor of a process in the container (``pidfd_getfd``) needs the
    right to ptrace it, which the host has as root; otherwise calls record no runs
    and :attr:`DockerSandbox.observe_note` says so.
    """

    def __init__(self, box: DockerSandbox, exec_id: str, own_argv: tuple[str, ...]) -> None:
        self.box, self.exec_id, self.own_argv = box, exec_id, own_argv
        self.log: ExecLog | None = None
        self.done = False  # boot's first line has been handled
        self.failed = False  # boot installed a listener the host could not take

    def saw(self, status: bytearray) -> None:
        """Called with boot's status channel so far; acts on its first complete line."""
        if self.done or b"\n" not in status:
            return
        self.done = True
        line = bytes(status).split(b"\n", 1)[0]
        if not line.startswith(b"listener "):
            self.box._observe_note = "programs run are not recorded: " + line.decode(
                errors="replace"
            ).removeprefix("nolistener ")
            return
        try:
            fd = self._take(int(line.split()[1]))
        except Exception as exc:  # no right to take its descriptor
            # The call's first exec now waits for an answer nobody will give: this call
            # is lost, and later calls run untraced.
            log.warning("docker sandbox: cannot take the exec listener: %s", exc)
            self.box._observe_note = f"programs run are not recorded: {exc}"
            self.box._trace_execs = False
            self.failed = True
            return
        self.box._observe_note = ""
        self.log = exec_tracer().watch(fd, ignore=frozenset({self.own_argv}))

    def _take(self, number: int) -> int:
        """Boot's descriptor ``number``, in this process; a few tries under load."""
        deadline = time.monotonic() + 2.0
        while True:
            try:
                pid = int(self.box._api.exec_inspect(self.exec_id).get("Pid") or 0)
                if pid <= 0:
                    raise ProcessLookupError("the engine reports no pid for the call yet")
                return steal_fd(pid, number)
            except PermissionError:
                raise
            except Exception:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)

    def finish(self) -> Provenance:
        """The call's runs and reads (once its processes are over); the listener closed."""
        reads = self.box.index.take_reads()
        if self.log is None:
            return Provenance(reads=reads)
        runs, dropped = self.log.take()
        self.close()
        return Provenance(runs=runs, runs_dropped=dropped, reads=reads)

    def close(self) -> None:
        if self.log is not None:
            exec_tracer().close(self.log)
            self.log = None


class _Stream:
    """The multiplexed output of one exec: frames of an 8-byte header, then the payload.

    ``exec_start(socket=True)`` hands back the engine's connection (as a SocketIO or
    a socket); reading the socket directly lets ``select`` bound every wait. Bytes of a
    frame that is not complete yet stay buffered, so a timeout never breaks the framing.
    """

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._buf = bytearray()

    def read(self, deadline: float) -> tuple[int, bytes] | None:
        """Return the next ``(stream, payload)``, or ``None`` at the end of the output.

        Raises:
            TimeoutError: the deadline passed first.
            OSError: the connection broke.
        """
        while True:
            if len(self._buf) >= _FRAME.size:
                kind, size = _FRAME.unpack_from(self._buf)
                end = _FRAME.size + size
                if len(self._buf) >= end:
                    payload = bytes(self._buf[_FRAME.size : end])
                    del self._buf[:end]
                    return kind, payload
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            # A TLS socket may hold decrypted bytes that select() cannot see.
            pending = getattr(self._raw, "pending", None)
            if not (pending and pending()) and not fdwait.readable([self._raw.fileno()], wait):
                raise TimeoutError
            chunk = self._raw.recv(1 << 16)
            if not chunk:
                return None
            self._buf += chunk

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._raw.close()
