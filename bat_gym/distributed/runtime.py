"""Ray connection and process-wide cleanup for the Ray backend.

A pool connects this process to Ray (:func:`connect`) and registers here, so that
whatever way the driver ends, every open pool's envs are closed (:func:`close_all`):
at interpreter exit, after Ctrl-C (``KeyboardInterrupt``), after ``SIGTERM`` (Ray's
driver handler exits the interpreter) and after ``SIGHUP`` (handled here when nothing
else handles it). Ray is shut down afterwards if a pool started it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import weakref
from typing import Any, Protocol

from bat_gym.core.errors import BatGymError, EnvLost

__all__ = [
    "LIVE",
    "EnvActorLost",
    "EnvActorsUnavailable",
    "close_all",
    "connect",
    "import_ray",
    "install_exit_hooks",
    "shutdown_if_owned",
]


def import_ray() -> Any:
    """Import Ray, or fail with the install command."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the Ray backend needs Ray: pip install 'bat-gym[ray]' (or 'ray>=2.40')"
        ) from exc
    return ray


class EnvActorsUnavailable(BatGymError, RuntimeError):
    """Env actors did not start in time, usually for want of cluster resources.

    Attributes:
        started: how many actors answered.
        requested: how many were asked for.
        cpus_needed: ``requested * num_cpus``.
        cpus_in_cluster: the cluster's total CPU resource when the pool gave up.
    """

    def __init__(
        self, started: int, requested: int, cpus_needed: float, cpus_in_cluster: float
    ) -> None:
        self.started = started
        self.requested = requested
        self.cpus_needed = cpus_needed
        self.cpus_in_cluster = cpus_in_cluster
        super().__init__(
            f"only {started} of {requested} env actors started; the pool asks for "
            f"{cpus_needed:g} CPUs and the cluster has {cpus_in_cluster:g}: pass a smaller "
            "num_cpus (a sandboxed env mostly waits on I/O) or add nodes"
        )


class EnvActorLost(EnvLost):
    """An env actor died mid-call (its process, or the node it ran on).

    The pool starts a replacement on a live node at the env's next ``submit_*``;
    the call that was lost is not replayed (the episode restarts from a reset).

    Attributes:
        index: the env's index in its pool.
        node_id: the Ray node the actor ran on, when known.
        kind: the lost call, ``"reset"`` or ``"step"``.
    """

    def __init__(self, index: int, node_id: str | None, kind: str, cause: str) -> None:
        self.index, self.node_id, self.kind = index, node_id, kind
        where = f" on node {node_id[:12]}" if node_id else ""
        super().__init__(
            f"env {index}'s actor{where} died during {kind} ({cause}); the pool replaces it "
            "at the env's next call: restart the episode with a reset"
        )


class Closable(Protocol):
    """What :func:`close_all` closes: a pool of env actors (``RayEnvPool``)."""

    def close(self) -> None: ...


LIVE: weakref.WeakSet[Closable] = weakref.WeakSet()
_state = {"owns_ray": False, "hooks": False}
_hooks_lock = threading.Lock()


def close_all() -> None:
    """Close every open pool, then shut Ray down if a pool started it.

    Runs at interpreter exit (after Ctrl-C and ``SIGTERM`` too). A second Ctrl-C while
    it runs is ignored, because an interrupted cleanup is what leaks sandboxes; each
    pool's wait is bounded by its ``close_timeout_s``.

    After a ``SIGKILL`` of the driver nothing here runs. What still holds: Ray's
    reaper stops a local Ray cluster the driver started, and the actor processes die
    with it; each sandbox's bubblewrap runs with ``--die-with-parent``, so its
    processes die with the actor. Left behind: the sandboxes' slot directories (the
    next :class:`EnvActor` on that node, or :func:`~bat_gym.core.sandbox.slots.sweep_stale`,
    removes them), a remote cluster's actors until Ray notices the driver is gone
    (they are owned by the driver, so Ray ends them), and, with Ray 2.60 on some
    machines, the local dashboard and runtime-env agent processes (``ray stop``).
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for pool in list(LIVE):
            with contextlib.suppress(Exception):
                pool.close()
        shutdown_if_owned()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def shutdown_if_owned() -> None:
    """Shut Ray down if a pool started it and no pool is open any more."""
    if _state["owns_ray"] and not len(LIVE):
        _state["owns_ray"] = False
        with contextlib.suppress(Exception):
            import_ray().shutdown()


def _exit_on_signal(signum: int, frame: Any) -> None:
    # SystemExit unwinds the main thread and runs atexit, which closes the pools.
    raise SystemExit(128 + signum)


def install_exit_hooks() -> None:
    """Register :func:`close_all` at exit (after Ray's own hook, so it runs first)."""
    with _hooks_lock:
        if _state["hooks"]:
            return
        _state["hooks"] = True
        atexit.register(close_all)
        # Ray's driver turns SIGTERM into an exit already; SIGHUP (the terminal went
        # away) would otherwise end the process with no cleanup at all.
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
                    signal.signal(signal.SIGHUP, _exit_on_signal)


def connect(ray_address: str | None, init_kwargs: dict[str, Any]) -> bool:
    """Connect this process to Ray: an existing connection, a cluster, or a new local one.

    Returns:
        True when this call started a new local Ray (which cannot grow).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    kwargs = {"include_dashboard": False, **init_kwargs}
    if ray_address is not None:
        kwargs["address"] = ray_address
    ray.init(**kwargs)
    # This process connected, so it disconnects once its last pool closes (for a local
    # cluster that also stops it; a remote cluster keeps running).
    _state["owns_ray"] = True
    return ray_address is None and not os.environ.get("RAY_ADDRESS")
