"""EnvActor: one env and its sandbox in a Ray actor process; EnvResult: one call's outcome."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym

__all__ = ["EnvActor", "EnvResult", "EnvSource"]

log = logging.getLogger(__name__)

EnvSource = str | Callable[[], gym.Env]
"""A registered env id (``"bat/E2E-v0"``) or a zero-argument env factory."""


@dataclass(frozen=True)
class EnvResult:
    """The outcome of one call on one env of a pool.

    Attributes:
        index: which env of the pool.
        kind: ``"reset"`` or ``"step"``.
        obs: the observation (the prompt after a reset).
        reward: the step's reward (0.0 after a reset; the rubric verdict's reward on an
            episode's last step).
        terminated: the policy called ``finish``.
        truncated: a budget ran out.
        info: the env's info dict (``info["verdict"]`` on an episode's last step).
        final_obs: with ``autoreset=True``, the ended episode's last observation
            (``obs``/``info`` then belong to the new episode); else None.
        final_info: as ``final_obs``, for the info.
    """

    index: int
    kind: Literal["reset", "step"]
    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    final_obs: str | None = None
    final_info: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """The episode ended on this step (terminated or truncated)."""
        return self.terminated or self.truncated


class EnvActor:
    """The body of one env actor: one env and its sandbox, in its own process.

    A plain class, so it can be used (and tested) without Ray; :class:`RayEnvPool`
    turns it into a Ray actor. Starting one first sweeps slot directories that dead
    processes left on this node (see :func:`bat_gym.core.sandbox.slots.sweep_stale`), so a
    pool cleans up after a driver that was killed with ``SIGKILL``.

    Args:
        env: a registered env id (``"bat/E2E-v0"``) or a zero-argument callable that
            returns an env (e.g. one wrapped in :class:`~bat_gym.curriculum.wrapper.StageCurriculum`).
        env_kwargs: keyword arguments for ``gym.make`` (only with an id).
    """

    def __init__(self, env: EnvSource, env_kwargs: dict[str, Any] | None = None) -> None:
        import bat_gym  # noqa: F401 - registers the bat/* ids in this process
        from bat_gym.core.sandbox.slots import sweep_stale

        swept = sweep_stale()
        if swept:
            log.info("removed %d sandbox slot(s) left by processes that died", swept)
        if isinstance(env, str):
            self.env = gym.make(env, **(env_kwargs or {}))
        else:
            if env_kwargs:
                raise ValueError("env_kwargs go with an env id, not with an env factory")
            self.env = env()
        self._closed = False
        # Ray runs atexit hooks when it ends an actor gracefully (its handles went out
        # of scope, or the node is shutting down); a forced kill runs nothing.
        atexit.register(self.close)

    def spaces(self) -> dict[str, Any]:
        """What a vector env over this env needs: spaces, metadata, render mode, spec."""
        return {
            "observation_space": self.env.observation_space,
            "action_space": self.env.action_space,
            "metadata": dict(self.env.metadata),
            "render_mode": self.env.render_mode,
            "spec": self.env.spec,
        }

    def where(self) -> dict[str, Any]:
        """Where this env runs: host name, process id and, for a local sandbox, its slot."""
        sandbox = getattr(self.env.unwrapped, "sandbox", None)
        workspace = getattr(sandbox, "workspace", None)
        return {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": _node_id(),
            "slot": str(workspace.parent) if workspace is not None else None,
        }

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``env.reset(seed=seed, options=options)``."""
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any, autoreset: bool = False) -> tuple[Any, ...]:
        """``env.step(action)``; with ``autoreset``, an ended episode is reset at once.

        Returns:
            ``(obs, reward, terminated, truncated, info, final)``: ``final`` is None,
            or ``(final_obs, final_info)`` when ``autoreset`` reset an ended episode
            (``obs`` and ``info`` are then the new episode's).
        """
        obs, reward, terminated, truncated, info = self.env.step(action)
        final = None
        if autoreset and (terminated or truncated):
            final = (obs, info)
            obs, info = self.env.reset()
        return obs, float(reward), bool(terminated), bool(truncated), info, final

    def call(
        self, name: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Call the env's method ``name`` (looked up through wrappers), or read it."""
        attr = self.env.get_wrapper_attr(name)
        return attr(*args, **(kwargs or {})) if callable(attr) else attr

    def set_attr(self, name: str, value: Any) -> None:
        """Set an attribute on the env (through wrappers)."""
        self.env.set_wrapper_attr(name, value)

    def close(self) -> None:
        """Close the env: its sandbox is killed and its workspace deleted (idempotent)."""
        if not self._closed:
            self._closed = True
            self.env.close()


def _node_id() -> str | None:
    """This process's Ray node, or None outside Ray (without starting Ray)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie holds no locks


def sweep_node(pids: list[int], timeout_s: float) -> int:
    """Remote task body: once ``pids`` are gone, sweep stale slots on this node.

    A killed actor releases its slot lock only when its process is gone, and
    ``ray.kill`` returns before that.
    """
    from bat_gym.core.sandbox.slots import sweep_stale

    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sweep_stale()
