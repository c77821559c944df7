"""RayEnvPool: envs as Ray actors, with per-env futures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError

from bat_gym.core.errors import ConfigError
from bat_gym.distributed.actor import EnvActor, EnvResult, EnvSource, sweep_node
from bat_gym.distributed.runtime import (
    LIVE,
    EnvActorLost,
    EnvActorsUnavailable,
    connect,
    import_ray,
    install_exit_hooks,
    shutdown_if_owned,
)

__all__ = ["CLOSE_TIMEOUT_S", "DEFAULT_NUM_CPUS", "START_TIMEOUT_S", "RayEnvPool"]

# A sandboxed env spends most of a step waiting on its sandbox's pipes; the agent code
# it runs is not Ray's to schedule anyway. A quarter CPU per env lets four envs share a
# core's reservation while still spreading a large pool over a cluster's nodes.
DEFAULT_NUM_CPUS = 0.25
CLOSE_TIMEOUT_S = 10.0
START_TIMEOUT_S = 300.0


class RayEnvPool:
    """``num_envs`` envs as Ray actors, with per-env futures.

    At most one call per env is in flight; its result is collected with
    :meth:`wait`, :meth:`as_completed` or :meth:`gather`.

    An actor that dies (its process, or the node under it) fails its call in flight
    with :class:`~bat_gym.distributed.runtime.EnvActorLost`; the env's next
    ``submit_*`` starts a replacement wherever the cluster has room, so a caller that
    restarts the episode with a reset carries on (:attr:`replaced` counts them).

    >>> pool = RayEnvPool("bat/E2E-v0", 4, states="banks/med")  # doctest: +SKIP
    >>> for i, r in enumerate(pool.reset_all(options={"state_id": sid})):  # doctest: +SKIP
    ...     pool.submit_step(i, policy(r.obs))
    >>> for r in pool.as_completed():  # each as soon as it is ready  # doctest: +SKIP
    ...     if not r.done:
    ...         pool.submit_step(r.index, policy(r.obs))

    Args:
        env: a registered env id or a zero-argument env factory (pickled with
            cloudpickle; what it imports must be installed on every node).
        num_envs: how many envs (actors).
        ray_address: None: the Ray this process is connected to, else a new local one;
            ``"auto"``: the cluster running on this machine (``ray start --head``) or
            ``RAY_ADDRESS``; ``"HOST:6379"``: a cluster's head; ``"ray://HOST:10001"``:
            Ray Client (needs ``ray[client]``). Ignored when Ray is already initialized.
        num_cpus: Ray CPU resource reserved per env actor, fractional allowed. 0
            reserves nothing (Ray then packs envs onto few nodes unless
            ``actor_options`` asks for ``"SPREAD"``). Default :data:`DEFAULT_NUM_CPUS`.
        actor_options: further ``ActorClass.options(...)``, e.g. ``{"resources":
            {"sandbox": 1}}`` (for nodes started with that custom resource),
            ``{"scheduling_strategy": "SPREAD"}`` or
            ``{"runtime_env": {"env_vars": {...}}}``.
        ray_init_kwargs: keyword arguments for ``ray.init`` when this pool connects
            (``include_dashboard`` defaults to False).
        start_timeout_s: how long to wait for every actor to start (and build its env)
            before giving up with :class:`EnvActorsUnavailable`.
        close_timeout_s: how long :meth:`close` lets running calls finish before it
            kills their actors.
        **env_kwargs: keyword arguments for ``gym.make(env, ...)``.

    Raises:
        EnvActorsUnavailable: the actors did not all start in time.
        ValueError: ``num_envs < 1`` or ``num_cpus < 0``.
    """

    def __init__(
        self,
        env: EnvSource,
        num_envs: int,
        *,
        ray_address: str | None = None,
        num_cpus: float = DEFAULT_NUM_CPUS,
        actor_options: dict[str, Any] | None = None,
        ray_init_kwargs: dict[str, Any] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
        **env_kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise ConfigError(f"expected num_envs >= 1, got {num_envs}")
        if num_cpus < 0:
            raise ConfigError(f"expected num_cpus >= 0, got {num_cpus}")
        ray = import_ray()
        started_local = connect(ray_address, dict(ray_init_kwargs or {}))
        install_exit_hooks()
        self.num_envs = int(num_envs)
        self.num_cpus = float(num_cpus)
        if started_local:
            # A local Ray started here cannot grow: fail now rather than at the timeout.
            cpus = float(ray.cluster_resources().get("CPU", 0.0))
            if self.num_envs * self.num_cpus > cpus:
                shutdown_if_owned()
                raise EnvActorsUnavailable(0, self.num_envs, self.num_envs * self.num_cpus, cpus)
        self.close_timeout_s = float(close_timeout_s)
        self.closed = False
        self._busy: dict[int, Any] = {}  # env index -> ObjectRef of its call in flight
        self._pending: dict[Any, tuple[int, str]] = {}  # ObjectRef -> (index, kind)
        self._where: dict[int, dict[str, Any]] = {}  # env index -> its actor's node and pid
        self._lost: set[int] = set()  # envs whose actor died; replaced at their next call
        self.replaced = 0
        self.start_timeout_s = float(start_timeout_s)
        options = {"num_cpus": self.num_cpus, "max_restarts": 0, **(actor_options or {})}
        self._sweep_options = {
            k: v for k, v in options.items() if k in ("runtime_env", "resources")
        }
        self._remote_cls = ray.remote(EnvActor).options(**options)
        self._env_args = (env, env_kwargs or None)
        self.actors = [self._remote_cls.remote(*self._env_args) for _ in range(self.num_envs)]
        LIVE.add(self)
        try:
            self._spaces = self._wait_started(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_started(self, timeout_s: float) -> dict[str, Any]:
        ray = import_ray()
        refs = [a.spaces.remote() for a in self.actors]
        where = [a.where.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        position = {ref: i for i, ref in enumerate(refs)}
        for i in sorted(
            position[r] for r in ready
        ):  # close() asks only these to close; the rest are just killed
            with contextlib.suppress(Exception):
                self._where[i] = ray.get(where[i])
        if len(ready) < len(refs):
            cpus = float(ray.cluster_resources().get("CPU", 0.0))
            raise EnvActorsUnavailable(len(ready), len(refs), self.num_cpus * len(refs), cpus)
        spaces = ray.get(refs)  # raises the first actor's error, e.g. bad env kwargs
        first = spaces[0]
        for i, s in enumerate(spaces[1:], start=1):
            if (s["observation_space"], s["action_space"]) != (
                first["observation_space"],
                first["action_space"],
            ):
                raise RuntimeError(f"env {i} has other spaces than env 0: {s} vs {first}")
        return first

    # -- what the envs look like ----------------------------------------------------------

    @property
    def single_observation_space(self) -> gym.Space:
        """One env's observation space."""
        return self._spaces["observation_space"]

    @property
    def single_action_space(self) -> gym.Space:
        """One env's action space."""
        return self._spaces["action_space"]

    @property
    def env_metadata(self) -> dict[str, Any]:
        """One env's metadata."""
        return dict(self._spaces["metadata"])

    @property
    def render_mode(self) -> str | None:
        """One env's render mode."""
        return self._spaces["render_mode"]

    @property
    def env_spec(self) -> Any:
        """One env's ``EnvSpec`` (None for a factory without one)."""
        return self._spaces["spec"]

    @property
    def in_flight(self) -> list[int]:
        """Indices of envs with a call whose result has not been collected."""
        return sorted(self._busy)

    # -- submitting calls ---------------------------------------------------------------

    def _submit(self, index: int, kind: str, ref: Any) -> None:
        self._busy[index] = ref
        self._pending[ref] = (index, kind)

    def _check_free(self, index: int) -> None:
        if self.closed:
            raise RuntimeError("the pool is closed")
        if not 0 <= index < self.num_envs:
            raise IndexError(f"env index {index} out of range for {self.num_envs} envs")
        if index in self._busy:
            raise AlreadyPendingCallError(
                f"env {index} has a call in flight; collect its result first (wait, "
                "as_completed or gather)",
                "step",
            )
        if index in self._lost:
            self._replace(index)

    def _replace(self, index: int) -> None:
        """Start a new actor for env ``index`` in place of one that died.

        Raises:
            EnvActorsUnavailable: the replacement did not start within
                ``start_timeout_s`` (no live node has room for it).
        """
        ray = import_ray()
        with contextlib.suppress(Exception):
            ray.kill(self.actors[index], no_restart=True)
        self._where.pop(index, None)
        actor = self._remote_cls.remote(*self._env_args)
        self.actors[index] = actor
        ready, _ = ray.wait([actor.spaces.remote()], timeout=self.start_timeout_s)
        if not ready:
            cpus = float(ray.cluster_resources().get("CPU", 0.0))
            raise EnvActorsUnavailable(0, 1, self.num_cpus, cpus)
        ray.get(ready[0])  # the new actor's own start-up error, if any
        with contextlib.suppress(Exception):
            self._where[index] = ray.get(actor.where.remote())
        self._lost.discard(index)
        self.replaced += 1

    def submit_reset(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Start ``reset(seed=seed, options=options)`` on env ``index``; returns at once."""
        self._check_free(index)
        self._submit(index, "reset", self.actors[index].reset.remote(seed, options))

    def submit_step(self, index: int, action: Any, *, autoreset: bool = False) -> None:
        """Start ``step(action)`` on env ``index``; returns at once.

        Args:
            index: the env.
            action: the assistant's message.
            autoreset: reset the env in the same call when the episode ends; the result
                then carries the ended episode in ``final_obs``/``final_info``.
        """
        self._check_free(index)
        self._submit(index, "step", self.actors[index].step.remote(action, autoreset))

    # -- collecting results --------------------------------------------------------------

    def _collect(self, ref: Any) -> EnvResult:
        index, kind = self._pending.pop(ref)
        del self._busy[index]
        ray = import_ray()
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            # The actor is gone, and with it the episode's sandbox: not the env's error.
            self._lost.add(index)
            node = self._where.get(index, {}).get("node_id")
            raise EnvActorLost(index, node, kind, type(exc).__name__) from exc
        except Exception as exc:
            exc.add_note(f"raised by env {index} of the pool ({kind})")
            raise
        if kind == "reset":
            obs, info = value
            return EnvResult(index, "reset", obs, info=info)
        obs, reward, terminated, truncated, info, final = value
        return EnvResult(
            index,
            "step",
            obs,
            reward,
            terminated,
            truncated,
            info,
            final_obs=None if final is None else final[0],
            final_info=None if final is None else final[1],
        )

    def _refs(self, indices: Iterable[int] | None) -> list[Any]:
        if indices is None:
            return list(self._pending)
        return [self._busy[i] for i in indices if i in self._busy]

    def wait(
        self, indices: Iterable[int] | None = None, timeout: float | None = None
    ) -> list[EnvResult]:
        """Block until at least one call (of ``indices``, default all) finishes.

        Returns:
            Every result ready by then, in completion order; empty if ``timeout``
            seconds passed first or nothing is in flight.
        """
        refs = self._refs(indices)
        if not refs:
            return []
        ray = import_ray()
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # take whatever else finished meanwhile too
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return [self._collect(ref) for ref in ready]

    def as_completed(
        self, indices: Iterable[int] | None = None, timeout: float | None = None
    ) -> Iterator[EnvResult]:
        """Yield each in-flight call's result (of ``indices``) as soon as it is ready.

        Calls submitted while iterating are picked up too when ``indices`` is None.
        Stopping early leaves the rest in flight, to collect later.

        Args:
            indices: only these envs; default every env with a call in flight.
            timeout: give up (``TimeoutError``) when nothing finishes for this long.
        """
        wanted = None if indices is None else set(indices)
        while True:
            refs = self._refs(wanted)
            if not refs:
                return
            results = self.wait(wanted, timeout)
            if not results:
                raise TimeoutError(
                    f"no env of {sorted(wanted or self._busy)} answered in {timeout} s"
                )
            yield from results

    def gather(
        self, indices: Iterable[int] | None = None, timeout: float | None = None
    ) -> list[EnvResult]:
        """Wait for every in-flight call (of ``indices``); results in env order.

        Raises:
            TimeoutError: not all finished within ``timeout`` seconds; the calls stay in
                flight, and a later ``gather`` collects them.
        """
        refs = self._refs(indices)
        if refs:
            ready, _ = import_ray().wait(refs, num_returns=len(refs), timeout=timeout)
            if len(ready) < len(refs):
                raise TimeoutError(f"{len(refs) - len(ready)} envs did not answer in {timeout} s")
        return sorted((self._collect(r) for r in refs), key=lambda r: r.index)

    def discard(self, indices: Iterable[int] | None = None) -> None:
        """Wait for in-flight calls (of ``indices``) and drop their results and errors."""
        for ref in self._refs(indices):
            with contextlib.suppress(Exception):
                self._collect(ref)

    # -- blocking conveniences ----------------------------------------------------------

    def reset_all(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> list[EnvResult]:
        """Reset every env at once and return the results in env order.

        Args:
            seed: one int (env ``i`` gets ``seed + i``), one per env, or None.
            options: one dict for every env, or one per env (e.g. different
                state ids).
        """
        seeds = per_env_seeds(seed, self.num_envs)
        opts = per_env_options(options, self.num_envs)
        for i in range(self.num_envs):
            self.submit_reset(i, seed=seeds[i], options=opts[i])
        return self.gather()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) on every env."""
        ray = import_ray()
        return tuple(ray.get([a.call.remote(name, args, kwargs) for a in self.actors]))

    def set_attr(self, name: str, values: Any | Sequence[Any]) -> None:
        """Set attribute ``name`` on every env: one value for all, or a list of one per env."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ConfigError(f"expected {self.num_envs} values, got {len(values)}")
        ray = import_ray()
        ray.get([a.set_attr.remote(name, v) for a, v in zip(self.actors, values, strict=True)])

    def where(self) -> list[dict[str, Any]]:
        """For each env: host name, actor process id, node id and sandbox slot directory."""
        return list(import_ray().get([a.where.remote() for a in self.actors]))

    # -- cleanup ------------------------------------------------------------------------

    def close(self) -> None:
        """Close every env (sandbox teardown), then kill the actors. Idempotent.

        Each env first finishes the call it is running, for up to ``close_timeout_s``;
        an actor that has not closed by then is killed (its sandbox dies with it) and
        its node is swept of the slot directory it leaves.
        """
        if self.closed:
            return
        self.closed = True
        LIVE.discard(self)
        ray = import_ray()
        if not ray.is_initialized():  # Ray already shut down: nothing left to reach
            return
        refs = {self.actors[i].close.remote(): i for i in self._where if i not in self._lost}
        ready: list[Any] = []
        with contextlib.suppress(Exception):
            if refs:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.close_timeout_s)
        closed = set()
        for ref in ready:
            with contextlib.suppress(Exception):
                ray.get(ref)
                closed.add(refs[ref])
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._sweep([w for i, w in self._where.items() if i not in closed])
        self._busy.clear()
        self._pending.clear()
        shutdown_if_owned()

    def _sweep(self, killed: list[dict[str, Any]]) -> None:
        """Remove slot directories of force-killed actors, one task on each of their nodes."""
        ray = import_ray()
        alive = set()
        with contextlib.suppress(Exception):
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        pids: dict[str, list[int]] = {}
        for w in killed:
            # A dead node's slots go with it; a task pinned there would never start.
            if w.get("node_id") in alive:
                pids.setdefault(w["node_id"], []).append(w["pid"])
        if not pids:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(sweep_node)
        refs = [
            task.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                **self._sweep_options,
            ).remote(node_pids, self.close_timeout_s)
            for node, node_pids in pids.items()
        ]
        with contextlib.suppress(Exception):
            # The task waits up to close_timeout_s for the processes; starting it takes a moment.
            ray.wait(refs, num_returns=len(refs), timeout=self.close_timeout_s + 10.0)

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Interpreter shutdown is close_all's job; this covers a pool dropped early.
        if not getattr(self, "closed", True):
            with contextlib.suppress(Exception):
                self.close()


def per_env_seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ConfigError(f"expected {n} seeds, got {len(seeds)}")
    return seeds


def per_env_options(
    options: dict[str, Any] | Sequence[dict[str, Any] | None] | None, n: int
) -> list[dict[str, Any] | None]:
    if options is None or isinstance(options, dict):
        return [None if options is None else dict(options) for _ in range(n)]
    opts = list(options)
    if len(opts) != n:
        raise ConfigError(f"expected one options dict per env ({n}), got {len(opts)}")
    return [None if o is None else dict(o) for o in opts]
