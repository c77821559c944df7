"""verifiers v1 (what prime-rl trains with): Stage Bank states as a taskset, played by a harness.

verifiers 0.4 splits an environment into a *taskset* (serializable task rows), the
*harness* a model runs in (the program that calls the model and executes its tool
calls), and an *env* that seats agents (harness x model x runtime) on each task. Every
model call goes through verifiers' interception server, which records it in the trace
that ``vf-eval`` scores and prime-rl trains on. Here:

* :class:`StageTaskset` yields one :class:`StageTask` per Stage Bank state. Its
  :class:`StageData` is all an episode needs to rebuild its env anywhere: the
  benchmark, the bank directory (or the held-out track and seed) and the ``state_id``.
* :class:`StageHarness` is the program the model plays in: it resets the rubric-scored
  stage env (``bat/E2E-v0``) to the task's state and plays it with the project's one
  episode loop (:func:`bat_gym.rollout.run_episode`). Each turn asks the model at the
  interception endpoint (OpenAI chat completions, with the env's messages and tool
  schemas); the assistant message it returns, tool calls as they came, is the env
  step's action in the env's ``openai`` protocol, so the env parses, budgets, runs and
  refuses calls exactly as for any other policy. It runs in-process (verifiers'
  ``Harness.launch`` allows that when every model call goes through the endpoint).
* :class:`StageTask` scores the trace: the rubric reward is its reward
  (``rubric_reward``), and the verdict's task score, stage score and per-stage credits
  are its metrics.
* :class:`StageEpisodes` seats one agent on the subprocess runtime: the stage env
  brings its own sandbox, so no container or cloud box is provisioned.

``vf-eval`` and prime-rl load an environment by module name; the module
:mod:`bat_gym_stages` (id ``bat-gym-stages``) exports these classes.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from bat_gym.core.errors import BatGymError, ConfigError
from bat_gym.integrations._states import make_env, state_rows
from bat_gym.rollout import run_episode

try:
    import openai
    import verifiers.v1 as vf
except ImportError as exc:
    raise ImportError(
        "bat_gym.integrations.verifiers needs verifiers 0.4: pip install 'bat-gym[verifiers]'"
    ) from exc

__all__ = [
    "ENV_ID",
    "NullVerdict",
    "StageData",
    "StageEpisodes",
    "StageEpisodesConfig",
    "StageHarness",
    "StageHarnessConfig",
    "StageTask",
    "StageTaskset",
    "StageTasksetConfig",
    "episode_scores",
]

ENV_ID = "bat/E2E-v0"
"""The env every task plays: a rubric-scored StageEnv that resets to any focus's state."""

PROTOCOL = "openai"
"""The env's tool protocol here: the action is the model's OpenAI assistant message as JSON."""

RESULT_KEY = "bat_gym"
"""Where the harness leaves the episode's scores in ``trace.info``."""


class NullVerdict(BatGymError, RuntimeError):
    """The rubric could not score the episode (a null verdict): drop it, never score it 0."""

    def __init__(self, state_id: str, notes: tuple[str, ...]) -> None:
        super().__init__(
            f"the verdict on state {state_id} is null ({'; '.join(notes) or 'no notes'}): "
            "an infrastructure failure, not the policy's; play the task again"
        )
        self.state_id = state_id


class StageData(vf.TaskData):
    """One task's wire data: enough to rebuild its env and state in any process.

    Attributes:
        state_id: the state the episode starts from.
        benchmark: the registered benchmark name.
        bank: a Stage Bank directory holding the state; None for a held-out state.
        track: the held-out task's track (held-out states only).
        seed: the held-out task's seed (held-out states only).
    """

    state_id: str
    benchmark: str
    bank: str | None = None
    track: str | None = None
    seed: int | None = None


class StageTask(vf.Task[StageData]):
    """A Stage Bank state; scored by the rubric verdict the harness left on the trace."""

    @property
    def key(self) -> str:
        """The task's durable identity: its ``state_id``.

        Unique in a bank and in a benchmark's held-out states; the default, a hash of
        the task data, changes with the task's ``idx``.
        """
        return self.data.state_id

    @vf.reward
    async def rubric_reward(self, trace: vf.Trace) -> float:
        """The rubric reward of the episode, in [0, 1].

        Raises:
            NullVerdict: the rubric could not score it (the rollout is to be dropped).
        """
        result = _result(trace)
        if result["reward"] is None:
            raise NullVerdict(self.data.state_id, tuple(result["notes"]))
        return float(result["reward"])

    @vf.metric
    async def verdict(self, trace: vf.Trace) -> dict[str, float]:
        """The verdict's scores: ``task_score``, ``stage_score`` and ``stage_<id>`` credits.

        A null score (a stage or task the rubric could not score) is left out.
        """
        return {k: v for k, v in _result(trace)["scores"].items() if v is not None}


def _result(trace: vf.Trace) -> dict[str, Any]:
    result = trace.info.get(RESULT_KEY)
    if result is None:
        raise ConfigError(
            "the trace holds no bat_gym episode: StageTask is scored from what StageHarness "
            "leaves on it; play it with the bat-gym-stages harness"
        )
    return result


class StageTasksetConfig(vf.TasksetConfig):
    """Which states the taskset yields (``--env.taskset.*``)."""

    benchmark: str = "toy_pipeline"
    """The registered benchmark the states belong to."""
    bank: str | None = None
    """A Stage Bank directory: its states (filtered by focus, track, state_ids). None:
    the benchmark's held-out E2E start states, which never enter a bank."""
    focus: str | None = None
    """Bank states of this focus only (``S3``, ``E2E``); None: every focus."""
    track: str | None = None
    """States of this track only; None: every track."""
    state_ids: list[str] = Field(default_factory=list)
    """Exactly these bank states, in this order (empty: all that match)."""
    repeats: int | None = Field(None, ge=1)
    """Held-out tasks per track (the first ``repeats`` evaluated seeds); None: all the
    benchmark's ``splits.heldout_repeats``."""


class StageTaskset(vf.Taskset[StageTask, StageTasksetConfig]):
    """Stage Bank states (or a benchmark's held-out start states) as verifiers tasks."""

    def load(self) -> Iterator[StageTask]:
        """One task per state: the bank's rows in order, or held-out tasks track by track."""
        cfg = self.config
        if cfg.bank is not None:
            bank = str(Path(cfg.bank).resolve())
            rows = state_rows(
                bank, focus=cfg.focus, track=cfg.track, state_ids=cfg.state_ids or None
            )
            for row in rows:
                yield self._task(row["messages"], state_id=row["state_id"], bank=bank)
            return
        if cfg.focus not in (None, "E2E") or cfg.state_ids:
            raise ConfigError(
                "held-out states are E2E start states named by track and seed: give a bank "
                "for focus or state_ids"
            )
        for state, track, seed in _held_out(cfg.benchmark, cfg.track, cfg.repeats):
            yield self._task(state.messages, state_id=state.state_id, track=track, seed=seed)

    def _task(self, messages: Any, **where: Any) -> StageTask:
        system = [str(m.get("content") or "") for m in messages if m["role"] == "system"]
        users = [str(m.get("content") or "") for m in messages if m["role"] == "user"]
        data = StageData(
            id=where["state_id"],
            name=where["state_id"],
            system_prompt=system[0] if system else None,
            # What a reader of the trace sees; the harness prompts with the env's messages.
            prompt=users[0] if users else None,
            benchmark=self.config.benchmark,
            **where,
        )
        return StageTask(data, self.config.task)


def _held_out(benchmark: str, track: str | None, repeats: int | None) -> list[tuple[Any, str, int]]:
    """The benchmark's held-out E2E start states: ``(state, track, seed)``, track by track."""
    from bat_gym.bank import task_states
    from bat_gym.catalog import get_benchmark
    from bat_gym.core.sandbox.snapshot import BlobStore

    bench = get_benchmark(benchmark)
    seeds = bench.evaluated_seeds()
    if repeats is not None and repeats > len(seeds):
        raise ConfigError(
            f"{benchmark} evaluates {len(seeds)} held-out tasks per track; ask for at most "
            f"{len(seeds)} repeats, got {repeats}"
        )
    tracks = [bench.spec.track(track).name] if track else [t.name for t in bench.spec.tracks]
    tasks = [(t, s) for t in tracks for s in seeds[:repeats]]
    with tempfile.TemporaryDirectory(prefix="bat-gym-heldout-") as tmp:
        # Only the ids and prompts are kept; each episode rebuilds its own state.
        source = task_states(bench, tasks, "heldout", BlobStore(Path(tmp)))
        states = [source.get(i) for i in source.select()]
    return [(s, s.track, int(s.provenance["seed"])) for s in states]


class StageHarnessConfig(vf.HarnessConfig):
    """The stage harness's settings (``--env.agent.harness.*``)."""

    backend: str = "local"
    """The stage env's sandbox backend: ``local`` (bubblewrap) or ``docker``."""


class StageHarness(vf.Harness[StageHarnessConfig]):
    """The stage env's tool loop as a verifiers harness, run in-process.

    Each episode: build the rubric-scored env for the task's state, reset to it, and
    play it with :func:`bat_gym.rollout.run_episode`, asking the model at the
    interception endpoint for every turn. The verdict's scores go to
    ``trace.info["bat_gym"]`` for :class:`StageTask` to read.
    """

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = True
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        """Play the task's episode to its end; every model call goes through ``endpoint``."""
        task = StageData.model_validate(data.model_dump())
        # The env's steps run tools in a sandbox and block: the episode runs in a
        # worker thread, and the model calls from it reach the interception server,
        # which keeps serving on this event loop.
        with openai.OpenAI(base_url=endpoint, api_key=secret, max_retries=2) as client:
            result = await asyncio.to_thread(_play, task, client, ctx.model, self.config.backend)
        trace.info[RESULT_KEY] = result
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def _play(task: StageData, client: openai.OpenAI, model: str, backend: str) -> dict[str, Any]:
    """Play one episode from ``task``'s state with ``model`` at ``client``; its scores."""
    env, states_dir = _episode_env(task, backend)
    try:

        def act(info: dict[str, Any]) -> str:
            reply = client.chat.completions.create(
                model=model,
                messages=info["messages"],
                tools=info["tools"],
                # Names the episode's start state, for a server that replays a script
                # per state (bat-gym serve-policy); a model ignores it.
                user=task.state_id,
            )
            return _assistant_json(reply.choices[0].message)

        end = run_episode(env, act, state_id=task.state_id)
    finally:
        env.close()
        if states_dir is not None:
            states_dir.cleanup()
    return episode_scores(end.info, end.turns)


def _episode_env(task: StageData, backend: str) -> tuple[Any, Any]:
    """The rubric-scored env for ``task``, and the temporary directory of its held-out state."""
    kwargs: dict[str, Any] = {"benchmark": task.benchmark, "backend": backend, "protocol": PROTOCOL}
    if task.bank is not None:
        return make_env(ENV_ID, {**kwargs, "states": task.bank}), None
    if task.track is None or task.seed is None:
        raise ConfigError(
            f"task {task.state_id} names neither a bank nor a held-out track and seed"
        )
    from bat_gym.bank import task_states
    from bat_gym.catalog import get_benchmark
    from bat_gym.core.sandbox.snapshot import BlobStore

    tmp = tempfile.TemporaryDirectory(prefix="bat-gym-vf-")
    bench = get_benchmark(task.benchmark)
    source = task_states(bench, [(task.track, task.seed)], "heldout", BlobStore(Path(tmp.name)))
    if task.state_id not in source.select():
        tmp.cleanup()
        raise ConfigError(
            f"held-out task ({task.track}, {task.seed}) of {task.benchmark} starts at "
            f"{source.select()}, not {task.state_id}: the benchmark changed since the taskset loaded"
        )
    return make_env(ENV_ID, {**kwargs, "benchmark": bench, "states": source}), tmp


def _assistant_json(message: Any) -> str:
    """An OpenAI assistant message as the env's ``openai`` protocol reads it (JSON).

    Tool calls pass through as the model wrote them (arguments a JSON string), so a
    malformed call is the env's to refuse, as for any policy.
    """
    calls = [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.function.name, "arguments": c.function.arguments},
        }
        for c in message.tool_calls or []
    ]
    return json.dumps({"content": message.content or "", "tool_calls": calls}, ensure_ascii=False)


def episode_scores(info: dict[str, Any], turns: int) -> dict[str, Any]:
    """What a finished episode leaves on its trace: reward, verdict scores, how it ended.

    Args:
        info: the env's ``info`` after the last step (it holds the rubric's verdict).
        turns: the steps the episode took.

    Returns:
        ``reward`` (None: a null verdict), ``scores`` (``task_score``, ``stage_score``,
        ``stage_<id>`` credits; None where null), ``notes``, ``state_id``, ``turns``,
        ``tool_calls`` and ``stop_reason``.
    """
    verdict = info.get("verdict")
    if verdict is None:
        raise ConfigError(
            f"the episode of {info.get('state_id')} ended without a verdict after {turns} "
            "turns: the env is not rubric-scored, or the episode did not end"
        )
    scores: dict[str, float | None] = {
        "task_score": verdict.task_score,
        "stage_score": verdict.stage_score,
    }
    scores.update({f"stage_{s.stage}": s.credit for s in verdict.stages})
    return {
        "reward": verdict.reward,
        "scores": scores,
        "notes": list(verdict.notes),
        "state_id": info["state_id"],
        "turns": turns,
        "tool_calls": info["tool_calls"],
        "stop_reason": info["stop_reason"],
    }


class StageEpisodesConfig(vf.EnvConfig):
    """The env's one seat (``--env.agent.*``): the stage harness on the subprocess runtime."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The policy under evaluation or training; the stage env brings its own sandbox,
    so the harness needs no container or cloud box."""


class StageEpisodes(vf.Env[StageEpisodesConfig]):
    """One agent plays each task's episode (as verifiers' single-agent env, locally)."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        """Seat the agent on ``task``; its harness plays the whole episode."""
        await agents.agent.run(task)
