"""The Ray backend: many bat_gym envs, sandbox and all, as Ray actors across a cluster.

Each env lives in an :class:`EnvActor`: one Ray actor process holding one
``gym.make(env_id, **env_kwargs)`` (or ``env_fn()``), and with it one sandbox on the
node the actor runs on. Two interfaces sit on top:

* :class:`RayVectorEnv`, a :class:`gymnasium.vector.VectorEnv` with the same spaces,
  metadata and autoreset modes as ``SyncVectorEnv`` over the same id; ``reset`` and
  ``step`` run on every actor at once;
* :class:`RayEnvPool`, per-env futures for trainers that must not wait for the slowest
  env: submit a step to some envs, then take each result as soon as it is ready
  (:meth:`RayEnvPool.as_completed`). ``RayVectorEnv.step_some`` is the same thing on
  the vector env. A GRPO trainer resets G envs to one ``state_id`` and feeds each
  episode's next action as soon as its previous observation arrives;
* :class:`ActorEnv`, one pool env behind plain blocking ``reset``/``step``, so
  thread-per-episode code (the GRPO trainer's rollouts, ``bat-gym eval``) runs on
  actors unchanged.

Ray is an optional dependency (``pip install 'bat-gym[ray]'``); it is imported when a
pool is created, never by ``import bat_gym``.

Cleanup. ``close()`` lets each env finish the call it is running (up to
``close_timeout_s``), closes it (the sandbox is killed and its workspace deleted), then
kills the actor. On interpreter exit, Ctrl-C (``KeyboardInterrupt``), ``SIGTERM``
(Ray's driver handler exits the interpreter) and ``SIGHUP`` (handled here when nothing
else handles it), every open pool is closed the same way, and Ray is shut down if a
pool started it. What survives a ``SIGKILL`` of the driver is described in
:func:`~bat_gym.distributed.runtime.close_all`.
"""

from __future__ import annotations

from bat_gym.distributed.actor import EnvActor, EnvResult
from bat_gym.distributed.actor_env import ActorEnv
from bat_gym.distributed.pool import DEFAULT_NUM_CPUS, RayEnvPool
from bat_gym.distributed.runtime import EnvActorLost, EnvActorsUnavailable, close_all
from bat_gym.distributed.vector import RayVectorEnv

__all__ = [
    # the two interfaces
    "RayVectorEnv",
    "RayEnvPool",
    # what they are made of
    "ActorEnv",
    "EnvActor",
    "EnvResult",
    "DEFAULT_NUM_CPUS",
    # failures and cleanup
    "EnvActorLost",
    "EnvActorsUnavailable",
    "close_all",
]
