"""RayVectorEnv: a Gymnasium vector env whose sub-envs are Ray actors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from bat_gym.core.errors import ConfigError
from bat_gym.distributed.actor import EnvResult, EnvSource
from bat_gym.distributed.pool import RayEnvPool, per_env_options, per_env_seeds

__all__ = ["RayVectorEnv"]


class RayVectorEnv(VectorEnv):
    """A Gymnasium vector env whose sub-envs are Ray actors, possibly across a cluster.

    Spaces, metadata (``autoreset_mode`` included) and step semantics match
    ``SyncVectorEnv`` over the same env: observations are a tuple of ``str``, rewards,
    terminations and truncations are arrays, infos are batched with ``_key`` masks.
    ``reset`` and ``step`` run on every actor concurrently. For per-env asynchrony use
    :meth:`step_some` or :attr:`pool`.

    >>> envs = RayVectorEnv("bat/Infer-v0", 8, ray_address="auto", states="banks/med")  # doctest: +SKIP
    >>> obs, infos = envs.reset(options={"state_id": sid})  # a GRPO group of 8  # doctest: +SKIP
    >>> obs, rewards, terminated, truncated, infos = envs.step(actions)  # doctest: +SKIP

    Args:
        env: a registered env id or a zero-argument env factory.
        num_envs: how many envs.
        autoreset_mode: as for ``SyncVectorEnv``: ``NEXT_STEP`` (default: the step after
            an episode ends resets that env, ignoring its action), ``SAME_STEP``
            (resets at once; the ended episode is in ``infos["final_obs"]`` and
            ``infos["final_info"]``) or ``DISABLED`` (reset ended envs yourself with
            ``options={"reset_mask": ...}``).
        **kwargs: :class:`RayEnvPool` arguments (``ray_address``, ``num_cpus``,
            ``actor_options``, ...) and ``gym.make`` keyword arguments.
    """

    def __init__(
        self,
        env: EnvSource,
        num_envs: int,
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.autoreset_mode = (
            autoreset_mode
            if isinstance(autoreset_mode, AutoresetMode)
            else AutoresetMode(autoreset_mode)
        )
        self.pool = RayEnvPool(env, num_envs, **kwargs)
        self.num_envs = self.pool.num_envs
        self.metadata = {**self.pool.env_metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = self.pool.render_mode
        self.spec = self.pool.env_spec
        self.single_observation_space = self.pool.single_observation_space
        self.single_action_space = self.pool.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._env_obs: list[Any] = [None] * self.num_envs
        self._autoreset_envs = np.zeros(self.num_envs, dtype=np.bool_)
        self._batch_pending = False

    # -- Gymnasium API --------------------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Reset the envs concurrently; their calls still in flight are awaited and dropped.

        Args:
            seed: one int (env ``i`` gets ``seed + i``), one per env, or None.
            options: one dict passed to every env, where ``"reset_mask"`` (a bool array
                of shape ``(num_envs,)``) resets only those envs, as in Gymnasium; or
                a list with one dict per env (e.g. a different ``state_id`` each).

        Returns:
            Every env's current observation (reset or not) and the reset envs' infos.
        """
        if isinstance(seed, int):  # seeds this object's own np_random, as Gymnasium does
            super().reset(seed=seed)
        seeds = per_env_seeds(seed, self.num_envs)
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if isinstance(options, dict) and "reset_mask" in options:
            options = dict(options)
            mask = _check_mask(options.pop("reset_mask"), self.num_envs)
        opts = per_env_options(options, self.num_envs)
        indices = [i for i in range(self.num_envs) if mask[i]]
        # An abandoned batch step is dropped whole; otherwise only the envs being reset.
        self.pool.discard(None if self._batch_pending else indices)
        self._batch_pending = False
        for i in indices:
            self.pool.submit_reset(i, seed=seeds[i], options=opts[i])
        infos: dict[str, Any] = {}
        for r in self.pool.gather(indices):
            self._env_obs[r.index] = r.obs
            self._autoreset_envs[r.index] = False
            infos = self._add_info(infos, r.info, r.index)
        return tuple(self._env_obs), infos

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env concurrently (see ``autoreset_mode`` for ended episodes)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send one action to each env and return at once; :meth:`step_wait` collects.

        Raises:
            AlreadyPendingCallError: a batch step is pending, or an env still has a
                :meth:`step_some` call whose result was not collected.
        """
        if self._batch_pending:
            raise AlreadyPendingCallError("step_async called twice without step_wait", "step")
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ConfigError(f"expected {self.num_envs} actions, got {len(actions)}")
        if self.pool.in_flight:
            raise AlreadyPendingCallError(
                f"envs {self.pool.in_flight} have step_some calls whose results were not "
                "collected; consume step_some (or reset) first",
                "step",
            )
        for i, action in enumerate(actions):
            if self._autoreset_envs[i]:
                if self.autoreset_mode == AutoresetMode.DISABLED:
                    raise ConfigError(
                        f"env {i}'s episode ended and autoreset is disabled: reset it with "
                        "options={'reset_mask': ...} before stepping it"
                    )
                if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                    self.pool.submit_reset(i)
                    continue
            same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
            self.pool.submit_step(i, action, autoreset=same_step)
        self._batch_pending = True

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Collect the batch that :meth:`step_async` started.

        Args:
            timeout: seconds to wait before ``TimeoutError`` (the calls stay in flight
                and a later ``step_wait`` picks them up); None waits as long as it takes.
        """
        if not self._batch_pending:
            raise NoAsyncCallError("step_wait called without step_async", "step")
        results = self.pool.gather(timeout=timeout)
        self._batch_pending = False
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for r in results:
            i = r.index
            self._env_obs[i] = r.obs
            rewards[i], terminated[i], truncated[i] = r.reward, r.terminated, r.truncated
            if r.final_info is not None:
                infos = self._add_info(
                    infos, {"final_obs": r.final_obs, "final_info": r.final_info}, i
                )
            infos = self._add_info(infos, r.info, i)
        self._autoreset_envs = terminated | truncated
        return tuple(self._env_obs), rewards, terminated, truncated, infos

    # -- per-env asynchrony ---------------------------------------------------------------

    def step_some(
        self, indices: Sequence[int], actions: Sequence[Any], timeout: float | None = None
    ) -> Iterator[EnvResult]:
        """Step only ``indices`` and yield each env's result as soon as it is ready.

        A slow tool call in one env delays only that env's result. No autoreset: an
        env whose episode ended (``result.done``) must be reset (``reset`` with a
        ``reset_mask``, or :meth:`RayEnvPool.submit_reset` on :attr:`pool`) before it
        is stepped again. Stopping the iteration early leaves the other calls in
        flight; collect them with ``pool.as_completed()`` (``reset`` drops them).

        Args:
            indices: the envs to step.
            actions: one action per index.
            timeout: give up (``TimeoutError``) when no env answers for this long.
        """
        indices, actions = list(indices), list(actions)
        if len(indices) != len(actions):
            raise ConfigError(
                f"expected one action per index, got {len(actions)} for {len(indices)}"
            )
        if self._batch_pending:
            raise AlreadyPendingCallError("a batch step is pending; call step_wait first", "step")
        for i, action in zip(indices, actions, strict=True):
            self.pool.submit_step(i, action)
        return self._follow(indices, timeout)

    def _follow(self, indices: list[int], timeout: float | None) -> Iterator[EnvResult]:
        for r in self.pool.as_completed(indices, timeout):
            self._env_obs[r.index] = r.obs
            self._autoreset_envs[r.index] = r.done
            yield r

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) on every env."""
        return self.pool.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env."""
        return self.pool.call(name)

    def set_attr(self, name: str, values: Any | Sequence[Any]) -> None:
        """Set attribute ``name`` on every env (one value, or one per env)."""
        self.pool.set_attr(name, values)

    def render(self) -> tuple[Any, ...] | None:
        """Every env's ``render()``."""
        return self.pool.call("render")

    def close_extras(self, **kwargs: Any) -> None:
        """Close every env and kill the actors (see :meth:`RayEnvPool.close`)."""
        self.pool.close()


def _check_mask(mask: Any, n: int) -> np.ndarray:
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
        raise TypeError(
            f"options['reset_mask'] must be a bool numpy array of shape ({n},), got {mask!r}"
        )
    if not mask.any():
        raise ConfigError("options['reset_mask'] must select at least one env")
    return mask
