"""The Runner: many episodes on a pool of envs, with one retry rule.

Evaluation, the reward audit and the trainers' rollouts all play their episodes
through a :class:`Runner`: ``workers`` env slots (one env, one sandbox each, built on
first use), worker threads (:meth:`Runner.map`), coroutines (:meth:`Runner.arun`), and
Ray actors in place of local envs (``ray=``, through :mod:`bat_gym.distributed`).

**The retry rule.** An episode that fails for a reason that is not the policy's answer
is played again from the start: *play again, count an attempt, never a failure*.
Those reasons (:data:`REPLAYABLE`) are a lost env (:class:`~bat_gym.core.errors.EnvLost`: a
Ray actor or its node died), a sandbox that could not run or crashed
(:class:`~bat_gym.core.errors.SandboxError`, :class:`~bat_gym.rollout.loop.SandboxRestarted`),
and a policy backend that failed (:class:`~bat_gym.policies.PolicyError`). Each play
counts an attempt (:attr:`Played.attempts`); after ``max_attempts`` the last error is
the answer. Any other error is a bug or a setting, which playing again cannot fix: it
ends the episode at once. A sandbox error, or any error not in the rule, also replaces
the slot's env (closed, rebuilt at the next play); the others leave it in place (the
sandbox was restarted, a lost actor is replaced at its next call, the policy failed),
and so does an env on a Ray actor, which its pool renews.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bat_gym.core.errors import ConfigError, EnvLost, SandboxError
from bat_gym.policies.base import PolicyError
from bat_gym.rollout.loop import SandboxRestarted

__all__ = ["REPLAYABLE", "Played", "Runner", "replayable"]

log = logging.getLogger(__name__)

T = TypeVar("T")
J = TypeVar("J")
R = TypeVar("R")

REPLAYABLE: tuple[type[BaseException], ...] = (EnvLost, SandboxError, SandboxRestarted, PolicyError)
"""Errors that are not the policy's answer: the episode is played again."""

# After these the slot's env is still good: the sandbox was restarted in place, a lost
# Ray actor is replaced at the env's next call, and a policy failure left the env as is.
_ENV_SURVIVES: tuple[type[BaseException], ...] = (EnvLost, SandboxRestarted, PolicyError)


def _renewed_by_its_pool(env: Any) -> bool:
    """Whether ``env`` is a view of a Ray actor (an ``ActorEnv``), kept after any error.

    Its pool renews the actor behind it (a lost one is replaced at its next call) and
    closing it does nothing; a new view would need a free actor index, which a caller's
    ``make_env`` (the GRPO trainer's hands each index out once) may not have.
    """
    # Looked up, not imported: without Ray's extra installed no env can be one.
    actor_env = sys.modules.get("bat_gym.distributed.actor_env")
    return actor_env is not None and isinstance(env, actor_env.ActorEnv)


def replayable(exc: BaseException) -> bool:
    """Whether ``exc`` ends an attempt that is played again (see the module doc)."""
    return isinstance(exc, REPLAYABLE)


@dataclass(frozen=True)
class Played(Generic[T]):
    """One episode's outcome after the retry rule.

    Attributes:
        value: what the play function returned (None when every attempt failed).
        attempts: plays it took, 1 to ``max_attempts``.
        error: the error of the last attempt when no attempt succeeded; None otherwise.
    """

    value: T | None
    attempts: int
    error: Exception | None = None

    def unwrap(self) -> T:
        """The value; the last error, with a note of the attempts, if there is none."""
        if self.error is not None:
            self.error.add_note(f"(played {self.attempts} time(s); no attempt succeeded)")
            raise self.error
        return self.value  # type: ignore[return-value]


class Runner:
    """A pool of env slots playing episodes under the one retry rule.

    Args:
        make_env: builds one env (called on a slot's first play, and again after its
            env was replaced); with ``ray``, it is pickled to each actor.
        workers: env slots, so episodes played at once (one env, one sandbox each).
        max_attempts: plays of one episode before its last error is the answer.
        ray: play on Ray actors (:class:`~bat_gym.distributed.RayEnvPool`, one per
            slot): ``"local"``, ``"auto"`` or a cluster address; None: envs in this
            process.
        name: the prefix of the worker threads' names.
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        *,
        workers: int,
        max_attempts: int = 3,
        ray: str | None = None,
        name: str = "bat-runner",
    ) -> None:
        for setting, value in (("workers", workers), ("max_attempts", max_attempts)):
            if value < 1:  # no slot could play, or no episode would be played at all
                raise ConfigError(f"{setting} must be >= 1, got {value}")
        self.workers = workers
        self.max_attempts = max_attempts
        self.name = name
        self._make_env = make_env
        self._actors: Any = None
        if ray is not None:
            from bat_gym.distributed import RayEnvPool

            self._actors = RayEnvPool(
                make_env, workers, ray_address=None if ray == "local" else ray
            )
        self._envs: list[Any] = [None] * workers
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(workers):
            self._free.put(slot)

    # -- env slots -------------------------------------------------------------------------

    def _env(self, slot: int) -> Any:
        if self._envs[slot] is None:
            if self._actors is not None:
                from bat_gym.distributed import ActorEnv

                self._envs[slot] = ActorEnv(self._actors, slot)
            else:
                self._envs[slot] = self._make_env()
        return self._envs[slot]

    def _replace(self, slot: int) -> None:
        env, self._envs[slot] = self._envs[slot], None
        if env is not None:
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - a broken env may fail to close too
                log.warning("closing a broken env failed: %s", exc)

    # -- playing ---------------------------------------------------------------------------

    def attempt(self, play: Callable[[Any], T], *, what: str = "an episode") -> Played[T]:
        """Play ``play(env)`` on a free slot's env under the retry rule; never raises ``Exception``.

        Args:
            play: plays one episode from its start on the env it is given.
            what: names the episode in the log line of a replay.
        """
        slot = self._free.get()
        try:
            for attempt in range(1, self.max_attempts + 1):
                try:
                    return Played(play(self._env(slot)), attempt)
                except Exception as exc:  # noqa: BLE001 - sorted by the retry rule
                    if (failed := self._failed(slot, exc, attempt, what)) is not None:
                        return failed
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._free.put(slot)

    def run(self, play: Callable[[Any], T], *, what: str = "an episode") -> T:
        """:meth:`attempt`, then its value; the last error when no attempt succeeded."""
        return self.attempt(play, what=what).unwrap()

    async def arun(
        self, play: Callable[[Any], Awaitable[T]], *, what: str = "an episode"
    ) -> Played[T]:
        """:meth:`attempt` on an event loop, with ``await play(env)``.

        Slots are taken, and envs built and closed, in the default executor (they block).
        """
        run = asyncio.get_running_loop().run_in_executor
        slot = await run(None, self._free.get)
        try:
            for attempt in range(1, self.max_attempts + 1):
                try:
                    return Played(await play(await run(None, self._env, slot)), attempt)
                except Exception as exc:  # noqa: BLE001 - sorted by the retry rule
                    failed = await run(None, self._failed, slot, exc, attempt, what)
                    if failed is not None:
                        return failed
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._free.put(slot)

    def _failed(self, slot: int, exc: Exception, attempt: int, what: str) -> Played[Any] | None:
        """The retry rule for a failed attempt: the final outcome, or None to play again."""
        if not isinstance(exc, _ENV_SURVIVES) and not _renewed_by_its_pool(self._envs[slot]):
            self._replace(slot)
        if not replayable(exc) or attempt == self.max_attempts:
            return Played(None, attempt, exc)
        log.warning(
            "%s failed (%s: %s); playing it again (attempt %d of %d)",
            what,
            type(exc).__name__,
            exc,
            attempt + 1,
            self.max_attempts,
        )
        return None

    def map(self, fn: Callable[[J], R], jobs: Iterable[J]) -> list[R]:
        """``fn(job)`` for every job on ``workers`` threads; results in the order of ``jobs``.

        ``fn`` plays through :meth:`attempt` or :meth:`run`, so each thread finds a slot.
        """
        with ThreadPoolExecutor(self.workers, thread_name_prefix=self.name) as pool:
            return list(pool.map(fn, jobs))

    def envs(self) -> list[Any]:
        """The envs built so far (slots not yet played have none)."""
        return [env for env in self._envs if env is not None]

    def close(self) -> None:
        """Close every env (and the Ray actors behind them)."""
        for slot in range(self.workers):
            self._replace(slot)
        if self._actors is not None:
            self._actors.close()
            self._actors = None
