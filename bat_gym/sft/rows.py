"""SFT rows: a conversation prefix and exactly one target action, from the Stage Bank.

A row holds a multi-turn context (system, user, earlier turns and their tool results)
and ONE target assistant action, stored model-neutrally as ``content`` plus ``calls``
(tool syntax is the tokenizer adapter's business, see :mod:`bat_gym.sft.render`).

Rows come from the bank's E2E success states: each is replayed once through a real
:class:`~bat_gym.env.StageEnv` with the actions its bank was built from (the scripted
teacher's turns, regenerated from the row's provenance seed, or a policy teacher's
recorded turns, see :func:`~bat_gym.bank.load_trajectory`), and the conversation
before every step becomes a row's context.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.bank import RecordedTurn, load_trajectory
from bat_gym.benchmark import Benchmark
from bat_gym.core.errors import BatGymError
from bat_gym.core.protocol import ToolCall, ToolProtocol, get_protocol
from bat_gym.core.spec import E2E, Outcome, StageState
from bat_gym.rollout import Step, run_episode

__all__ = [
    "IGNORE_INDEX",
    "SFTAction",
    "SFTRow",
    "SFTRejection",
    "SFTRejected",
    "SFTRenderError",
    "sft_rows",
]

IGNORE_INDEX = -100
"""Label of a token that carries no loss (the PyTorch cross-entropy default)."""

_STRICT = ConfigDict(extra="forbid", frozen=True)


class SFTAction(BaseModel):
    """One assistant action, model-neutral: free text and the tool calls it makes."""

    model_config = _STRICT

    content: str = ""
    calls: tuple[ToolCall, ...] = ()


class SFTRow(BaseModel):
    """One SFT example: a conversation prefix and the single action that follows it."""

    model_config = _STRICT

    row_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    trajectory_id: str = Field(description="The source trajectory: the task id of its E2E row.")
    source_state_id: str = Field(description="The bank state the trajectory was replayed from.")
    benchmark: str
    stage: str = Field(description="The stage the target action belongs to.")
    track: str
    outcome: Outcome
    turn: int = Field(ge=0, description="Index of the target among the trajectory's turns.")
    context: tuple[dict[str, Any], ...] = Field(
        min_length=2, description="OpenAI chat messages before the target (system first)."
    )
    target: SFTAction


class SFTRejection(BaseModel):
    """A row left out of the export, and why."""

    model_config = _STRICT

    row_id: str
    reason: str = Field(description="A short code, e.g. ``too_long``.")
    detail: str


class SFTRejected(BatGymError, ValueError):
    """A row that cannot become a training example as it stands (e.g. it is too long)."""

    def __init__(self, row_id: str, reason: str, detail: str) -> None:
        super().__init__(f"SFT row {row_id} rejected ({reason}): {detail}")
        self.rejection = SFTRejection(row_id=row_id, reason=reason, detail=detail)


class SFTRenderError(BatGymError, RuntimeError):
    """The chat template does not render a row consistently (a template bug, not a row's)."""


class _Step(NamedTuple):
    """One action of a replayed trajectory: its stage, its target, and the message sent."""

    stage: str
    target: SFTAction
    message: str


def _scripted_steps(benchmark: Benchmark, state: StageState, proto: ToolProtocol) -> list[_Step]:
    """The scripted teacher's turns for ``state``'s task, rendered in ``proto``."""
    task = benchmark.task_of_state(state)
    if task is None:
        raise ValueError(f"cannot regenerate the task of {state.state_id} from its provenance")
    return [
        _Step(
            turn.stage,
            SFTAction(content=turn.content, calls=tuple(turn.calls)),
            proto.render(turn.content, list(turn.calls)),
        )
        for turn in benchmark.teacher_turns(task)
    ]


def _recorded_steps(turns: list[RecordedTurn], proto: ToolProtocol) -> list[_Step]:
    """A policy teacher's recorded turns: sent as recorded, targets parsed with ``proto``.

    Each message carries its token count, as the build sent it, so the env's budgets
    see the same episode.
    """
    from bat_gym.core.completion import Completion

    steps = []
    for turn in turns:
        parsed = proto.parse(turn.text)
        target = SFTAction(content=parsed.content, calls=parsed.calls)
        steps.append(_Step(turn.stage, target, Completion(turn.text, turn.num_tokens)))
    return steps


def _replay(
    env: Any, benchmark: Benchmark, state: StageState, steps: list[_Step], *, strict: bool
) -> list[SFTRow]:
    """Replay ``steps`` from ``state`` in ``env``; one row per turn the env accepted.

    ``strict``: a refused turn is an error (scripted turns), not a policy's mistake.
    """
    pending = iter(steps)
    contexts: list[tuple[dict[str, Any], ...]] = []
    rows: list[SFTRow] = []

    def act(_: dict[str, Any]) -> Any:
        step = next(pending, None)
        if step is None:
            return None
        contexts.append(tuple(dict(m) for m in env.unwrapped.messages))
        return step.message

    def keep(turn: Step) -> None:
        i = turn.turn - 1
        refused = bool(turn.info["tool_errors"])  # the env ran none of the turn's calls
        if turn.truncated or (refused and strict):
            raise RuntimeError(
                f"replaying {state.state_id}: turn {i} was not accepted by the env: "
                f"{turn.observation[:200]}"
            )
        if refused:
            return  # the policy's mistake: replayed, but not imitated
        rows.append(
            SFTRow(
                row_id=f"{state.task_id}.t{i:03d}",
                trajectory_id=state.task_id,
                source_state_id=state.state_id,
                benchmark=benchmark.name,
                stage=steps[i].stage,
                track=state.track,
                outcome=state.outcome,
                turn=i,
                context=contexts[i],
                target=steps[i].target,
            )
        )

    # The trajectory is replayed as it was built, a restarted sandbox included.
    end = run_episode(env, act, state_id=state.state_id, on_step=keep, on_restart="ignore")
    if end.terminated and end.turns < len(steps):
        raise RuntimeError(
            f"replaying {state.state_id}: the teacher called finish at turn {end.turns - 1} "
            f"of {len(steps)}"
        )
    if not end.terminated:
        raise RuntimeError(f"replaying {state.state_id}: the teacher did not call finish")
    return rows


def sft_rows(
    bank: Any,
    benchmark: Benchmark,
    *,
    protocol: str | ToolProtocol = "hermes",
    backend: str = "local",
) -> list[SFTRow]:
    """One row per teacher turn of every E2E success trajectory in ``bank``.

    Each E2E success state is replayed once in a real env with the turns its bank was
    built from, and before every step the messages so far (prompt plus earlier turns
    and their tool results) become the context of a row whose target is that turn.
    The turns are the scripted teacher's, regenerated from the state's provenance
    seed, or, in a bank built with a policy teacher, the policy's recorded actions
    (:func:`~bat_gym.bank.load_trajectory`). A recorded turn the env refused (no
    readable tool call) is replayed, so later contexts show it and its error, but is
    no row's target.

    Args:
        bank: a :class:`~bat_gym.bank.StageBank` (or any state source with ``select``,
            ``get`` and ``store``).
        benchmark: the benchmark the bank was built from.
        protocol: the tool protocol the env parses the replayed turns with (for a
            policy-taught bank, the protocol it was built with).
        backend: sandbox backend for the replay.

    Returns:
        Rows ordered by trajectory (sorted state id), then turn.

    Raises:
        RuntimeError: a scripted turn was refused by the env, a turn ran out of
            budget, or the trajectory did not finish: the bank and the benchmark (or
            ``protocol``) disagree.
    """
    from bat_gym.env import StageEnv

    proto = get_protocol(protocol)
    rows: list[SFTRow] = []
    env = StageEnv(E2E, benchmark=benchmark, states=bank, backend=backend, protocol=proto)
    try:
        for state_id in bank.select(focus=E2E):
            state = bank.get(state_id)
            if state.outcome != "success":
                continue  # recovery and failure trajectories are not imitation targets
            recorded = load_trajectory(bank.store, state)
            if recorded is None:
                steps = _scripted_steps(benchmark, state, proto)
            else:
                steps = _recorded_steps(recorded, proto)
            rows.extend(_replay(env, benchmark, state, steps, strict=recorded is None))
    finally:
        env.close()
    return rows
