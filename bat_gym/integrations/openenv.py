"""A rubric-scored StageEnv as a typed OpenEnv environment (``bat-gym serve openenv``).

OpenEnv (the ``openenv`` package, 0.10) serves an ``Environment[Action, Observation,
State]`` over HTTP and WebSocket with its own ``create_app``; one such server reaches
TRL's ``environment_factory``, torchforge, SkyRL, ART and, through their bridges,
verifiers and NeMo Gym. :class:`BatOpenEnv` is that environment over the real
:class:`~bat_gym.env.StageEnv` wrapped in :class:`~bat_gym.rubrics.verifier.reward.RubricReward`:

* ``reset(state_id=...)`` restores one Stage Bank state; the observation's ``text`` is
  the state's prompt as the env renders it and ``tools`` the env's tool schemas;
* one :class:`BatAction` is one tool call (``execute_code``, ``finish`` or one of the
  benchmark's own) and one env step: the call is written in the env's protocol, so the
  env parses, checks, budgets, runs and records it exactly as an in-process policy's
  turn with that single call;
* a call the env refuses (unknown tool, bad arguments), a step before ``reset`` and a
  step after the end come back as an observation whose ``error`` says what is wrong;
  the session goes on;
* the step that ends the episode (``finish``, or a budget) carries the reward, the
  verdict's one-line :meth:`~bat_gym.rubrics.verifier.verdict.Verdict.summary` and each
  stage's credit; ``metadata`` holds ``terminated`` and ``truncated`` apart (OpenEnv's
  single ``done`` merges them) and the stop reason.

Each WebSocket session gets its own environment, so its own sandbox
(``SUPPORTS_CONCURRENT_SESSIONS``); the server binds 127.0.0.1 only, because a caller
runs code in the sandbox. OpenEnv's stateless ``POST /reset`` and ``POST /step`` make a
new environment per request, so an episode is played over the WebSocket (the typed
client :class:`~bat_gym.integrations.openenv_client.BatEnvClient` does).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import ToolCall
from bat_gym.integrations._states import EnvSpec, make_env

if TYPE_CHECKING:
    import gymnasium as gym

    from bat_gym.rubrics.verifier.verdict import Verdict

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "LOCALHOST",
    "BatAction",
    "BatObservation",
    "BatOpenEnv",
    "BatState",
    "app_from_environ",
    "create_bat_app",
    "serve",
]

LOCALHOST = "127.0.0.1"
"""The only address the server binds: a caller runs code in the sandbox."""

DEFAULT_MAX_SESSIONS = 64
"""Concurrent WebSocket sessions a server admits by default (each holds one sandbox)."""


class BatAction(Action):
    """One tool call: the tool's name and its arguments, as the env's tool schemas give them."""

    tool: str = Field(
        min_length=1,
        description="The tool to call: execute_code, finish, or one of the benchmark's own.",
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="The call's arguments (checked by the env)."
    )


class BatObservation(Observation):
    """What the env answered; ``reward`` and ``done`` are OpenEnv's own fields."""

    text: str = Field(
        "",
        description="After reset: the state's prompt as the env renders it. After a step: the "
        "tool's result, or the env's [tool call error] sentence.",
    )
    state_id: str | None = Field(None, description="The Stage Bank state being played.")
    tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="After reset: every tool the agent may call, as OpenAI function schemas.",
    )
    error: str | None = Field(
        None, description="Why the action was not run; None when it ran. The session goes on."
    )
    stop_reason: str | None = Field(None, description="Why the episode ended; None while it runs.")
    verdict: str | None = Field(
        None, description="Final step: the rubric verdict's one-line summary."
    )
    stage_scores: dict[str, float | None] = Field(
        default_factory=dict,
        description="Final step: each stage's credit (score x evidence completeness), 0..1; "
        "None where the stage could not be scored.",
    )
    stage_score: float | None = Field(
        None, description="Final step: the stage's credit, or E2E's weighted mean of them."
    )
    task_score: float | None = Field(
        None, description="Final step of an E2E episode: the benchmark's task metric, 0..1."
    )


class BatState(State):
    """The session's episode: which state, how far, and whether it ended."""

    state_id: str | None = Field(None, description="The Stage Bank state being played.")
    benchmark: str | None = Field(None, description="The benchmark of that state.")
    stage: str | None = Field(None, description="The state's focus: S1..S9 or E2E.")
    turns: int = Field(0, ge=0, description="Env steps taken (one per tool call here).")
    tool_calls: int = Field(0, ge=0, description="Tool calls that ran.")
    stop_reason: str | None = Field(None, description="Why the episode ended; None while it runs.")
    reward: float | None = Field(None, description="The episode's reward once it ended.")


class BatOpenEnv(Environment[BatAction, BatObservation, BatState]):
    """An OpenEnv environment playing one rubric-scored bat_gym episode at a time.

    Args:
        env: a ``bat/...-v0`` id (made with ``gym.make(env, **env_kwargs)``, which wraps
            the StageEnv in the rubric reward) or a zero-argument factory of such envs;
            None: the class's :attr:`ENV`.
        env_kwargs: keyword arguments of ``gym.make``, e.g. ``{"benchmark":
            "toy_pipeline", "states": "banks/toy"}`` (a bank directory is loaded once per
            process and shared by the sessions); None: the class's :attr:`ENV_KWARGS`.

    A host that builds environments with no arguments (NeMo Gym's OpenEnv resources
    server imports a class by name and calls it) gets a configured one from a subclass
    that sets :attr:`ENV_KWARGS`.

    The bat_gym env is made at the first ``reset``: OpenEnv builds an environment for
    each ``/metadata`` or ``/schema`` request too, and those never play.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    ENV: EnvSpec = "bat/E2E-v0"
    """The env id (or factory) an environment built without ``env`` plays."""

    ENV_KWARGS: Mapping[str, Any] = {}
    """The ``gym.make`` keyword arguments of an environment built without ``env_kwargs``."""

    def __init__(
        self, env: EnvSpec | None = None, env_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        self._spec = self.ENV if env is None else env
        self._env_kwargs = dict(self.ENV_KWARGS if env_kwargs is None else env_kwargs)
        self._env: gym.Env[str, str] | None = None
        self._state = BatState()
        self._ended = False

    @property
    def state(self) -> BatState:
        """The session's episode (a copy)."""
        return self._state.model_copy()

    def get_metadata(self) -> EnvironmentMetadata:
        """The server's name and what it plays."""
        return EnvironmentMetadata(
            name="bat_gym",
            description="Stage Bank states of staged benchmarks, scored by rubric contracts: "
            "reset(state_id=...), then one tool call per step.",
            version=_version(),
        )

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, state_id: str | None = None
    ) -> BatObservation:
        """Restore the Stage Bank state ``state_id``; the observation is its prompt and tools.

        Raises:
            ConfigError: no ``state_id`` was given.
            StateNotFound: the states hold no such state.
        """
        if not state_id:
            raise ConfigError(
                "reset needs the state to play: reset(state_id=...) (a bank's rows.jsonl lists them)"
            )
        if self._env is None:
            self._env = make_env(self._spec, self._env_kwargs)
        prompt, info = self._env.reset(seed=seed, options={"state_id": state_id})
        self._ended = False
        self._state = BatState(
            episode_id=episode_id,
            state_id=state_id,
            benchmark=info["benchmark"],
            stage=info["stage"],
        )
        return BatObservation(
            text=prompt, state_id=state_id, tools=list(info["tools"]), metadata=_meta(info)
        )

    def step(self, action: BatAction, timeout_s: float | None = None) -> BatObservation:
        """Run ``action`` as one env step (see the module docstring).

        ``timeout_s`` is refused: the benchmark's ``tool_timeout_s`` budget bounds each
        call, as in-process.
        """
        if timeout_s is not None:
            return self._refused(
                f"timeout_s is not taken (got {timeout_s}): the benchmark's tool_timeout_s "
                "budget bounds each call; serve with --budget tool_timeout_s=SECONDS"
            )
        if self._env is None or self._state.state_id is None:
            return self._refused("no episode yet: reset(state_id=...) first")
        if self._ended:
            return self._refused(
                f"the episode has ended ({self._state.stop_reason}); reset to play again"
            )
        protocol = self._env.unwrapped.protocol  # type: ignore[attr-defined]
        turn = protocol.render("", [ToolCall(name=action.tool, arguments=action.arguments)])
        text, reward, terminated, truncated, info = self._env.step(turn)
        self._ended = bool(terminated or truncated)
        self._state = self._state.model_copy(
            update={
                "step_count": self._state.step_count + 1,
                "turns": info["turns"],
                "tool_calls": info["tool_calls"],
                "stop_reason": info["stop_reason"],
                "reward": float(reward) if self._ended else None,
            }
        )
        refused = "; ".join(e["message"] for e in info["tool_errors"]) or None
        observation = BatObservation(
            text=text,
            state_id=self._state.state_id,
            error=refused,
            stop_reason=info["stop_reason"],
            done=self._ended,
            reward=float(reward),
            metadata={**_meta(info), "terminated": bool(terminated), "truncated": bool(truncated)},
        )
        if self._ended and info.get("verdict") is not None:
            observation = observation.model_copy(update=_scores(info["verdict"]))
        return observation

    def close(self) -> None:
        """Close the bat_gym env (its sandbox and service)."""
        if self._env is not None:
            self._env.close()
            self._env = None

    def _refused(self, why: str) -> BatObservation:
        return BatObservation(
            text=f"[not run] {why}",
            state_id=self._state.state_id,
            error=why,
            stop_reason=self._state.stop_reason,
            done=self._ended,
            reward=None,
        )


def _meta(info: Mapping[str, Any]) -> dict[str, Any]:
    """What the env's info says about the episode's progress, for ``metadata``."""
    return {
        "benchmark": info["benchmark"],
        "stage": info["stage"],
        "stop_reason": info["stop_reason"],
        "turns": info["turns"],
        "tool_calls": info["tool_calls"],
        "refused_turns": info["refused_turns"],
    }


def _scores(verdict: Verdict) -> dict[str, Any]:
    return {
        "verdict": verdict.summary(),
        "stage_scores": {s.stage: s.credit for s in verdict.stages},
        "stage_score": verdict.stage_score,
        "task_score": verdict.task_score,
    }


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bat-gym")
    except PackageNotFoundError:  # pragma: no cover - a source checkout not installed
        return "0"


def create_bat_app(
    env: EnvSpec = "bat/E2E-v0",
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    max_concurrent_envs: int = DEFAULT_MAX_SESSIONS,
) -> FastAPI:
    """OpenEnv's own FastAPI app (``create_app``) serving :class:`BatOpenEnv` sessions.

    Args:
        env: as for :class:`BatOpenEnv`.
        env_kwargs: as for :class:`BatOpenEnv`.
        max_concurrent_envs: WebSocket sessions admitted at once; each holds a sandbox.
            One more is refused with OpenEnv's ``CAPACITY_REACHED`` error.

    Raises:
        ValueError: ``max_concurrent_envs`` is below 1.
    """
    if max_concurrent_envs < 1:
        raise ConfigError(f"max_concurrent_envs must be at least 1, got {max_concurrent_envs}")
    # A partial of the class, so OpenEnv reads SUPPORTS_CONCURRENT_SESSIONS without
    # building an environment.
    factory = functools.partial(BatOpenEnv, env, dict(env_kwargs or {}))
    return create_app(
        factory,
        BatAction,
        BatObservation,
        env_name="bat_gym",
        max_concurrent_envs=max_concurrent_envs,
        state_cls=BatState,
    )


def app_from_environ() -> FastAPI:
    """:func:`create_bat_app` configured by environment variables, for ``uvicorn --factory``.

    What a container runs (``deploy/openenv/Dockerfile``), where the server must listen
    beyond 127.0.0.1 and the container is the boundary:

    * ``BAT_GYM_BENCHMARK``: the benchmark (default: the default benchmark);
    * ``BAT_GYM_STATES``: a Stage Bank directory (default: the benchmark's default states);
    * ``BAT_GYM_MAX_SESSIONS``: concurrent sessions (default :data:`DEFAULT_MAX_SESSIONS`).
    """
    import os

    env_kwargs: dict[str, Any] = {}
    if os.environ.get("BAT_GYM_BENCHMARK"):
        env_kwargs["benchmark"] = os.environ["BAT_GYM_BENCHMARK"]
    if os.environ.get("BAT_GYM_STATES"):
        env_kwargs["states"] = os.environ["BAT_GYM_STATES"]
    sessions = os.environ.get("BAT_GYM_MAX_SESSIONS", str(DEFAULT_MAX_SESSIONS))
    try:
        max_sessions = int(sessions)
    except ValueError:
        raise ConfigError(
            f"BAT_GYM_MAX_SESSIONS must be a whole number, got {sessions!r}"
        ) from None
    return create_bat_app("bat/E2E-v0", env_kwargs, max_concurrent_envs=max_sessions)


def serve(app: FastAPI, port: int, *, log_level: str = "warning") -> None:
    """Serve ``app`` on 127.0.0.1:``port`` with uvicorn until the process is stopped.

    Raises:
        ConfigError: ``port`` is not a TCP port.
    """
    if not 0 < port < 65536:
        raise ConfigError(f"port must be a TCP port, 1 to 65535, got {port}")
    import uvicorn

    uvicorn.run(app, host=LOCALHOST, port=port, log_level=log_level)
