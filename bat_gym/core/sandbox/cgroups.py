"""Caps on a whole sandbox's memory and process count, through cgroups.

rlimits bound each process on its own: three processes of 2 GB each took 6.2 GB of a
host whose sandboxes were each meant to hold 4 GB. A cgroup bounds all of a sandbox's
processes together. Each sandbox gets a group with two leaves, in every hierarchy that
holds the ``memory`` or ``pids`` controller::

    <the cgroup this process is in>/bat_gym/<name>/supervisor   no limits: our own code
    <the cgroup this process is in>/bat_gym/<name>/agent        memory and pids capped

The groups sit under the cgroup this process is in, so any limit already set above
it still applies to every sandbox. Two mechanisms are used, whichever works here:

* cgroup v2 (``"v2"``): a subtree this process may write, as root or through
  delegation (``systemd-run --user --scope -p Delegate=yes ...``). A v2 group that
  hands controllers to its children may hold no process itself, so the processes of
  the group this process is in move into ``bat_gym/host`` first, once, on the first
  probe; later probes (in children of this process) find the tree already made.
* cgroup v1 (``"v1"``): writable ``memory`` and ``pids`` hierarchies (as root).

Joining is by file descriptor. The host opens the leaves' ``cgroup.procs`` files
(:meth:`SandboxCgroup.join_fds`) and hands them to the supervisor, which writes
``b"0"`` to the supervisor descriptors to move itself; every process that will run
agent code (the bash server, each python call's child) writes ``b"0"`` to the agent
descriptors and closes them first (:func:`join`; under v1 the agent leaf is joined
through ``tasks``, see ``_AGENT_JOIN``). The kernel checks a write against
the credentials of whoever *opened* the file, so this works after the process has
dropped to an unprivileged uid. The same rule makes these descriptors capabilities:
whoever holds one may move any process it can name into that group, so agent code
must never inherit one, and only the supervisor may keep the agent descriptors.

Suggested limits: :data:`DEFAULT_MEMORY_MB` and :data:`DEFAULT_MAX_PROCESSES`.
Linux only; standard library only.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import itertools
import logging
import os
import re
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bat_gym.core.errors import SandboxError, SandboxUnavailable

__all__ = [
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_MEMORY_MB",
    "CapSupport",
    "SandboxCgroup",
    "detect_caps",
    "join",
    "require_caps",
]

log = logging.getLogger(__name__)

DEFAULT_MEMORY_MB = 4096
"""Suggested memory for all of one sandbox's agent processes together, MiB."""
DEFAULT_MAX_PROCESSES = 128
"""Suggested cap on one sandbox's agent tasks (the kernel counts threads too)."""

_DIR = "bat_gym"
_HOST = "host"  # v2: where the processes of the group we started in move to
_SUPERVISOR, _AGENT = "supervisor", "agent"
_CONTROLLERS = ("memory", "pids")
_BACKEND = "local"
# A sandbox group's name says which process made it: pid namespace, pid, and the
# pid's start time (so a reused pid does not pass for the owner), then a counter.
_NAME = re.compile(r"sb-(\d+)-(\d+)-(\d+)-\w+")
# A directory that another process removes between our mkdir calls (the tree under
# bat_gym/ is pruned when its last sandbox closes) is made again this many times.
_MKDIR_TRIES = 5


class CapSupport(enum.StrEnum):
    """Which mechanism caps a sandbox's memory and process count here."""

    V2 = "v2"
    """A writable cgroup v2 subtree with the memory and pids controllers."""
    V1 = "v1"
    """Writable cgroup v1 memory and pids hierarchies."""
    NONE = "none"
    """No cap is possible; sandboxes run with per-process rlimits only."""


# The file an agent process writes ``0`` to, to move itself into the agent leaf. A
# write to ``cgroup.procs`` moves a whole thread group and takes the kernel's global
# threadgroup lock for writing, which waits out an RCU grace period: milliseconds, on
# every other python call. Under v1, a single-threaded process (each one that joins:
# the bash server and a python call's process, just forked) moves whole by writing to
# ``tasks``, which moves only the calling thread and skips that lock. v2 has no such
# file for a domain group.
_AGENT_JOIN = {CapSupport.V1: "tasks", CapSupport.V2: "cgroup.procs"}


@dataclass(frozen=True)
class _Layout:
    """Where sandbox groups go: one ``bat_gym`` directory per hierarchy.

    ``roots`` maps each controller to the ``bat_gym`` directory of its hierarchy; under
    v2 (or v1 with both controllers mounted together) both map to the same one.
    """

    support: CapSupport
    roots: dict[str, Path]

    @property
    def dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.roots.values()))


_DETECT_LOCK = threading.Lock()
_DETECTED: dict[str, tuple[CapSupport, str, _Layout | None]] = {}


def detect_caps() -> tuple[CapSupport, str]:
    """Return the mechanism that can cap a sandbox here and a line saying why.

    Probes once per process: it makes (and removes) a throwaway sandbox group, so the
    answer is what creation will meet. Under cgroup v2 the first probe may move the
    processes of the group this process is in into ``bat_gym/host`` (see the module
    docstring); the reason says so.
    """
    support, why, _ = _detect()
    return support, why


def require_caps(opt_out: bool = False) -> CapSupport:
    """Return the mechanism to cap sandboxes with; raise where none is possible.

    Args:
        opt_out: the caller asked for no caps (``caps="none"``): return
            :attr:`CapSupport.NONE` without probing.

    Without ``opt_out``, a host where no cap is possible runs uncapped (with a
    warning) only when ``BAT_GYM_ALLOW_UNCAPPED=1`` is set.

    Raises:
        SandboxUnavailable: no cap is possible and nobody opted out. The message
            names the fixes.
    """
    if opt_out:
        return CapSupport.NONE
    support, why = detect_caps()
    if support is not CapSupport.NONE:
        return support
    if os.environ.get("BAT_GYM_ALLOW_UNCAPPED") == "1":
        log.warning("%s; running sandboxes uncapped (BAT_GYM_ALLOW_UNCAPPED=1)", why)
        return CapSupport.NONE
    raise SandboxUnavailable(
        _BACKEND,
        f"{why}. Without a cgroup, one sandbox can take all of the host's memory and "
        "processes: run as root on a cgroup v1 host, or start this process in a "
        "delegated cgroup v2 subtree (systemd-run --user --scope -p Delegate=yes "
        "<command>); or, only for code you trust, set BAT_GYM_ALLOW_UNCAPPED=1 or "
        "pass caps='none' to run uncapped.",
    )


def join(fds: Iterable[int]) -> None:
    """Move the calling process into the groups behind ``fds``, then close them.

    This is the whole protocol; code that cannot import bat_gym (the supervisor)
    copies it. Write ``b"0"`` (the writer itself) to each descriptor from
    :meth:`SandboxCgroup.join_fds`, then close it. A process for which a write fails
    must not go on to run agent code: it would run uncapped. From a shell, the same
    is ``printf 0 >&N || exit 1; exec N>&-``. The process must be single-threaded
    (as a process is just after ``fork``): under v1 the agent descriptors move only
    the calling thread; threads started afterwards are born in the group.

    Raises:
        OSError: a write failed; every descriptor is closed all the same.
    """
    fds = list(fds)
    try:
        for fd in fds:
            os.write(fd, b"0")
    finally:
        for fd in fds:
            os.close(fd)


class SandboxCgroup:
    """One sandbox's groups: a supervisor leaf without limits and a capped agent leaf.

    Under v1 the agent leaf's swap is capped with its memory (where the kernel
    accounts swap), under v2 its swap is turned off, so swapping cannot lift the cap.
    Creating one first removes groups whose owning process has died.

    Args:
        memory_mb: memory for all agent processes together, MiB
            (suggested: :data:`DEFAULT_MEMORY_MB`). Past it the kernel's OOM killer
            kills an agent process, and :meth:`oom_kills` counts it.
        max_processes: tasks (processes and their threads) in the agent leaf at once
            (suggested: :data:`DEFAULT_MAX_PROCESSES`); past it ``fork`` fails with
            ``EAGAIN``.

    Attributes:
        name: the group's name under each ``bat_gym`` directory, unique on the host.
        support: the mechanism in use.
        paths: the group's directory in each hierarchy.

    Raises:
        SandboxUnavailable: no cap is possible here, or the groups could not be made.
        ValueError: a limit is not positive.
    """

    _counter = itertools.count()

    def __init__(self, memory_mb: int, max_processes: int) -> None:
        if memory_mb < 1 or max_processes < 1:
            raise ValueError(
                f"memory_mb and max_processes must be positive, got {memory_mb}, {max_processes}"
            )
        support, why, layout = _detect()
        if layout is None:
            raise SandboxUnavailable(_BACKEND, why)
        self.support = support
        self.memory_mb = memory_mb
        self.max_processes = max_processes
        self.name = f"sb-{_owner_tag()}-{next(self._counter)}"
        self._layout = layout
        for root in layout.dirs:
            _sweep(root)
        self.paths: tuple[Path, ...] = tuple(root / self.name for root in layout.dirs)
        self._fds: list[int] = []  # kept open: pids.current, read by agent_pids()
        # The finalizer holds what cleanup needs, not the object: a sandbox dropped
        # without close() still leaves nothing behind.
        self._finalizer = weakref.finalize(self, _cleanup, self._fds, self.paths)
        try:
            for path in self.paths:
                _make_group(path, support)
            _set_limits(layout, self.name, memory_mb << 20, max_processes)
            agent = self._leaf("pids", _AGENT)
            self._fds.append(os.open(agent / "pids.current", os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            self._finalizer()
            raise SandboxUnavailable(
                _BACKEND, f"cannot make the sandbox's cgroup {self.name}: {_line(exc)}"
            ) from exc
        self._pids_fd = self._fds[0]

    def __enter__(self) -> SandboxCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _leaf(self, controller: str, leaf: str) -> Path:
        return self._layout.roots[controller] / self.name / leaf

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise SandboxError(f"the sandbox cgroup {self.name} is closed")

    def join_fds(self) -> tuple[list[int], list[int]]:
        """Open the leaves' ``cgroup.procs`` files for the processes that will join.

        Returns:
            ``(supervisor_fds, agent_fds)``: one close-on-exec descriptor per hierarchy
            for each leaf. The caller owns them: it passes them to the supervisor
            (``pass_fds``) and closes its own copies once the supervisor has started.
            See :func:`join` for what the receiving side does.

        Raises:
            SandboxError: the group is closed.
            OSError: a file could not be opened; none stays open.
        """
        self._check_open()
        supervisor: list[int] = []
        agent: list[int] = []
        try:
            for path in self.paths:
                for leaf, out in ((_SUPERVISOR, supervisor), (_AGENT, agent)):
                    name = _AGENT_JOIN[self.support] if leaf == _AGENT else "cgroup.procs"
                    out.append(os.open(path / leaf / name, os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in supervisor + agent:
                os.close(fd)
            raise
        return supervisor, agent

    def agent_pids(self) -> int:
        """Tasks in the agent leaf now (one ``pread`` on a descriptor held open)."""
        self._check_open()
        return int(os.pread(self._pids_fd, 32, 0))

    def memory_peak_bytes(self) -> int | None:
        """Most memory the agent leaf has used at once, in bytes.

        ``None`` where the kernel does not say (cgroup v2 before Linux 5.19).
        """
        self._check_open()
        name = "memory.max_usage_in_bytes" if self.support is CapSupport.V1 else "memory.peak"
        try:
            return int(_read(self._leaf("memory", _AGENT) / name))
        except FileNotFoundError:
            return None

    def oom_kills(self) -> int:
        """Agent processes the OOM killer has killed for the memory cap.

        A sandbox whose process died with ``SIGKILL`` while this count rose was
        killed for what agent code allocated, not by a fault of the host. It counts
        from the group's creation, so compare it before and after a call. (Under v1
        this is ``memory.oom_control``'s ``oom_kill``, not ``memory.failcnt``, which
        Linux 6.18 leaves at 0 even as the cap kills.)
        """
        self._check_open()
        name = "memory.oom_control" if self.support is CapSupport.V1 else "memory.events"
        return _keyed(_read(self._leaf("memory", _AGENT) / name)).get("oom_kill", 0)

    def close(self) -> None:
        """Remove the groups (idempotent; never raises).

        Kill the sandbox's processes first: a group that still holds one stays, and
        the first sandbox created after this process exits removes it.
        """
        self._finalizer()


# -- making and removing groups ---------------------------------------------------------


def _cleanup(fds: list[int], paths: tuple[Path, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
    for path in paths:
        _remove_group(path)
        # An empty bat_gym/ goes too, so that whoever removes the group we run in
        # finds no child left; under v2 with bat_gym/host in use, this fails.
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def _remove_group(path: Path) -> bool:
    """Remove a sandbox group, leaves first; return whether it is gone. Never raises."""
    for leaf in (_SUPERVISOR, _AGENT):
        try:
            (path / leaf).rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:  # EBUSY: a process is still in it
            log.debug("cannot remove cgroup %s: %s", path / leaf, exc)
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.debug("cannot remove cgroup %s: %s", path, exc)
        return False
    return True


def _make_group(path: Path, support: CapSupport) -> None:
    """Make the group ``path`` and its two leaves.

    Its ``bat_gym`` parent is made again where another process has just pruned it.
    """
    for attempt in range(_MKDIR_TRIES):
        _ensure_root(path.parent, support)
        try:
            path.mkdir(mode=0o755)
            break
        except FileNotFoundError:
            if attempt == _MKDIR_TRIES - 1:
                raise
    if support is CapSupport.V2:
        _enable_controllers(path)
    for leaf in (_SUPERVISOR, _AGENT):
        (path / leaf).mkdir(mode=0o755)


def _set_limits(layout: _Layout, name: str, memory_bytes: int, max_processes: int) -> None:
    memory = layout.roots["memory"] / name / _AGENT
    pids = layout.roots["pids"] / name / _AGENT
    if layout.support is CapSupport.V1:
        _write(memory / "memory.limit_in_bytes", memory_bytes)
        # memory+swap may not be set below memory, so it comes second. Without it a
        # process over the cap would swap rather than be killed.
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", memory_bytes)
    else:
        _write(memory / "memory.max", memory_bytes)
        if (memory / "memory.swap.max").exists():
            _write(memory / "memory.swap.max", 0)
    _write(pids / "pids.max", max_processes)


def _ensure_root(root: Path, support: CapSupport) -> None:
    """Make a ``bat_gym`` directory; under v2, let its children use the controllers."""
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o755)
    if support is CapSupport.V2:
        _enable_controllers(root)


def _enable_controllers(group: Path) -> None:
    """Hand the memory and pids controllers to ``group``'s children (cgroup v2)."""
    ctl = group / "cgroup.subtree_control"
    if set(_CONTROLLERS) <= set(_read(ctl).split()):
        return
    _write(ctl, " ".join(f"+{c}" for c in _CONTROLLERS))


def _sweep(root: Path) -> None:
    """Remove the groups under ``root`` whose owner died. Never raises."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    ns = _pid_namespace()
    for name in names:
        m = _NAME.fullmatch(name)
        # Groups made in another pid namespace name pids we cannot look up: theirs.
        if m is None or int(m[1]) != ns or _alive(int(m[2]), int(m[3])):
            continue
        if _remove_group(root / name):
            log.debug("removed cgroup %s, left by a process that died", root / name)


def _alive(pid: int, start_ticks: int) -> bool:
    try:
        return _start_ticks(pid) == start_ticks
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        return True  # cannot tell: leave it


def _start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces and parentheses; it ends at the last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


_OWNER: dict[int, str] = {}


def _owner_tag() -> str:
    """``<pid namespace>-<pid>-<start time>`` of this process, computed once per pid."""
    pid = os.getpid()
    if pid not in _OWNER:
        _OWNER.clear()  # a forked child: its parent's tag is not its own
        _OWNER[pid] = f"{_pid_namespace()}-{pid}-{_start_ticks(pid)}"
    return _OWNER[pid]


# -- detection ----------------------------------------------------------------------------


def _detect() -> tuple[CapSupport, str, _Layout | None]:
    with _DETECT_LOCK:
        if "result" not in _DETECTED:
            _DETECTED["result"] = _probe()
        return _DETECTED["result"]


def _probe() -> tuple[CapSupport, str, _Layout | None]:
    try:
        own = _parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
        mounts = _parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        return CapSupport.NONE, f"cannot read this process's cgroups: {_line(exc)}", None
    return _probe_from(own, mounts)


def _probe_from(
    own: dict[str, str], mounts: list[tuple[str, str, str, list[str]]]
) -> tuple[CapSupport, str, _Layout | None]:
    """Probe, given this process's groups and the cgroup mounts (parsed)."""
    # v2 first: on a hybrid host (v1 controllers, an empty v2 tree) it says so and
    # v1 is tried next.
    why = {}
    for support, probe in ((CapSupport.V2, _probe_v2), (CapSupport.V1, _probe_v1)):
        try:
            layout, why[support] = probe(own, mounts)
        except OSError as exc:
            layout, why[support] = None, _line(exc)
        if layout is not None:
            try:
                _try_group(layout)
            except OSError as exc:
                why[support] = f"{why[support]}, but a test group failed: {_line(exc)}"
                continue
            return support, why[support], layout
    return (
        CapSupport.NONE,
        f"no cgroup can cap a sandbox here: v2: {why[CapSupport.V2]}; v1: {why[CapSupport.V1]}",
        None,
    )


def _try_group(layout: _Layout) -> None:
    """Make a throwaway sandbox group with limits, then remove it."""
    name = f"sb-{_owner_tag()}-probe"
    paths = [root / name for root in layout.dirs]
    try:
        for path in paths:
            _make_group(path, layout.support)
        _set_limits(layout, name, DEFAULT_MEMORY_MB << 20, DEFAULT_MAX_PROCESSES)
    finally:
        _cleanup([], tuple(paths))


def _probe_v2(
    own: dict[str, str], mounts: list[tuple[str, str, str, list[str]]]
) -> tuple[_Layout | None, str]:
    if "" not in own:
        return None, "this process is in no cgroup v2 group"
    base = _resolve(own[""], [m for m in mounts if m[0] == "cgroup2"])
    if base is None:
        return None, f"its group {own['']} is under no cgroup2 mount here"
    # A child of a process moved to bat_gym/host starts there: the tree is made.
    if base.name == _HOST and base.parent.name == _DIR:
        base = base.parent.parent
    have = _read(base / "cgroup.controllers").split()
    missing = [c for c in _CONTROLLERS if c not in have]
    if missing:
        return None, (
            f"{base} lacks the {' and '.join(missing)} controller"
            f"{'s' if len(missing) > 1 else ''} (it has: {' '.join(have) or 'none'})"
        )
    moved = _enable_at_base(base)
    root = base / _DIR
    _ensure_root(root, CapSupport.V2)
    note = f" (moved {moved} process(es) of {base} into {root / _HOST})" if moved else ""
    return _Layout(CapSupport.V2, dict.fromkeys(_CONTROLLERS, root)), f"cgroup v2 at {root}{note}"


def _enable_at_base(base: Path) -> int:
    """Enable the controllers below ``base``; return how many processes moved out.

    They move only where they are in the way (the kernel says ``EBUSY``).
    """
    moved = 0
    for _ in range(3):  # processes may fork into base between the move and the write
        try:
            _enable_controllers(base)
            return moved
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
        # "No internal processes": base may not hold processes and hand controllers
        # to children. Its processes go to bat_gym/host, still under base's limits.
        host = base / _DIR / _HOST
        host.mkdir(mode=0o755, parents=True, exist_ok=True)
        for pid in _read(base / "cgroup.procs").split():
            try:
                _write(host / "cgroup.procs", pid)
                moved += 1
            except ProcessLookupError:  # it exited meanwhile
                pass
    _enable_controllers(base)
    return moved


def _probe_v1(
    own: dict[str, str], mounts: list[tuple[str, str, str, list[str]]]
) -> tuple[_Layout | None, str]:
    roots = {}
    for controller in _CONTROLLERS:
        if controller not in own:
            return None, f"no {controller} hierarchy"
        v1 = [m for m in mounts if m[0] == "cgroup" and controller in m[3]]
        base = _resolve(own[controller], v1)
        if base is None:
            return None, f"the {controller} hierarchy is not mounted here"
        roots[controller] = base / _DIR
    layout = _Layout(CapSupport.V1, roots)
    for root in layout.dirs:
        _ensure_root(root, CapSupport.V1)
    return layout, f"cgroup v1 at {' and '.join(map(str, layout.dirs))}"


def _parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each controller (``""`` for cgroup v2) to this process's group path."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and not controllers:
            out[""] = path
        else:
            for c in controllers.split(","):
                out.setdefault(c, path)
    return out


def _parse_mountinfo(text: str) -> list[tuple[str, str, str, list[str]]]:
    """``(fstype, root, mount point, super options)`` of each cgroup mount."""
    out = []
    for line in text.splitlines():
        fields, _, tail = line.partition(" - ")
        f, t = fields.split(), tail.split()
        if len(f) >= 5 and len(t) >= 3 and t[0] in ("cgroup", "cgroup2"):
            out.append((t[0], _unescape(f[3]), _unescape(f[4]), t[2].split(",")))
    return out


def _unescape(s: str) -> str:
    r"""Undo mountinfo's octal escapes (``\040`` is a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), s)


def _resolve(group: str, mounts: list[tuple[str, str, str, list[str]]]) -> Path | None:
    """The directory of ``group`` through the first of ``mounts`` that shows it."""
    for _, root, point, _ in mounts:
        root = root.rstrip("/")
        if group == root or group.startswith(root + "/"):
            path = Path(point + group[len(root) :])
            if path.is_dir():
                return path
    return None


# -- small file helpers ---------------------------------------------------------------------


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _write(path: Path, value: object) -> None:
    # One write call: cgroup files act on each write as a whole.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _keyed(text: str) -> dict[str, int]:
    """Parse ``key value`` lines (``memory.events``, ``memory.oom_control``)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
