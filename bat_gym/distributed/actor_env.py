"""ActorEnv: one env of a :class:`~bat_gym.distributed.RayEnvPool` as a plain, blocking env.

Code written against ``env.reset`` / ``env.step`` (an episode loop, a
:class:`~bat_gym.rollout.TokenEpisode`, the evaluation harness, the GRPO rollout
workers) runs unchanged on a Ray actor through it: each call is submitted to the
env's actor and waited for. Many threads, each holding the ``ActorEnv`` of a different
index, step their envs concurrently; the pool owns the actors and closes them.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

from bat_gym.distributed.pool import RayEnvPool

__all__ = ["ActorEnv"]


class ActorEnv:
    """Env ``index`` of ``pool``, with the Gymnasium ``reset``/``step`` signatures.

    Args:
        pool: the pool that owns the actor.
        index: which of its envs; one ``ActorEnv`` (one thread) per index at a time.
    """

    def __init__(self, pool: RayEnvPool, index: int) -> None:
        if not 0 <= index < pool.num_envs:
            raise ValueError(f"index must be in [0, {pool.num_envs}), got {index}")
        self.pool, self.index = pool, index
        self.observation_space = pool.single_observation_space
        self.action_space = pool.single_action_space
        self.metadata = pool.env_metadata

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``reset`` on the actor; blocks until it returns."""
        self.pool.submit_reset(self.index, seed=seed, options=options)
        (result,) = self.pool.gather([self.index])
        return result.obs, result.info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """``step`` on the actor (no autoreset); blocks until it returns."""
        self.pool.submit_step(self.index, action)
        (result,) = self.pool.gather([self.index])
        return result.obs, result.reward, result.terminated, result.truncated, result.info

    def close(self) -> None:
        """Nothing to do: the pool closes its actors (:meth:`RayEnvPool.close`)."""
        return None
