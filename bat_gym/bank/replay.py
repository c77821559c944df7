"""Teacher trajectories, and stepping them through a real E2E env.

A trajectory is a list of :class:`RecordedTurn` (stage, assistant message, tokens):
the benchmark's scripted teacher rendered in the tool protocol
(:func:`scripted_turns`), or a policy's recorded actions
(:func:`~bat_gym.bank.load_trajectory`). :func:`play_turns` steps one through an E2E env
from a start state, calling back at each stage boundary, and returns an
:class:`PlayedEpisode` with the counts the admission gates check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from bat_gym.bank.states import MemoryStates
from bat_gym.benchmark import Benchmark
from bat_gym.core.completion import Completion
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import E2E, StageState
from bat_gym.rollout import run_episode

__all__ = [
    "PlayedEpisode",
    "RecordedTurn",
    "play_turns",
    "replay_teacher",
    "scripted_turns",
    "verdict_summary",
]


class RecordedTurn(NamedTuple):
    """One assistant action of a bank trajectory.

    Attributes:
        stage: the stage the action belongs to (its row boundary is before the first
            action of each stage).
        text: the whole assistant message, as the env's tool protocol writes it.
        num_tokens: the tokens the policy generated for it (None: not counted).
    """

    stage: str
    text: str
    num_tokens: int | None = None


def scripted_turns(bench: Benchmark, task: Any, outcome: str, protocol: str) -> list[RecordedTurn]:
    """The benchmark's scripted teacher for ``outcome``, rendered in ``protocol``."""
    from bat_gym.core.protocol import get_protocol

    proto = get_protocol(protocol)
    return [
        RecordedTurn(t.stage, proto.render(t.content, list(t.calls)))
        for t in bench.teacher_script(task, outcome)
    ]


@dataclass
class PlayedEpisode:
    """How a replayed trajectory ended, and the counts the admission gates check.

    Attributes:
        reason: why the trajectory is rejected (None: it ran to ``finish``).
        reward: the E2E rubric reward (when scored; a null verdict counts as 0).
        turns: assistant turns taken.
        tool_calls: tool calls run.
        pilot_runs: validation passes (see :func:`_pilot_runs`).
        verdict: the E2E verdict in brief (:func:`verdict_summary`), when scored.
    """

    reason: str | None
    reward: float | None = None
    turns: int = 0
    tool_calls: int = 0
    pilot_runs: int = 0
    verdict: dict[str, Any] | None = None


def _evidence_text(e: Any) -> str:
    if e.kind == "artifact":
        return f"{e.path} (sha256 {e.sha256[:12]})" if e.sha256 else str(e.path)
    return f"tool call #{e.call}"


def verdict_summary(verdict: Any) -> dict[str, Any]:
    """A verdict in brief, as a bank journal keeps it: what fell short, and why.

    Keeps the reward, task score, evidence completeness η, each stage's credit, the
    gates that closed, the notes, and every item that did not pass cleanly: failed,
    null, or passed without its required evidence (which lowers η), each with its
    detail and the evidence it rests on.
    """
    items = []
    for stage in verdict.stages:
        for item in stage.items:
            if item.passed is True and item.evidence_complete:
                continue
            status = {True: "no evidence", False: "failed", None: "null"}[item.passed]
            items.append(
                {
                    "stage": stage.stage,
                    "item": item.id,
                    "check": item.check,
                    "status": status,
                    "detail": item.detail[:300],
                    "evidence": [_evidence_text(e) for e in item.evidence][:5],
                    "requires": list(item.requires),
                }
            )
    return {
        "reward": verdict.reward,
        "task_score": verdict.task_score,
        "eta": verdict.eta,
        "stages": {s.stage: s.credit for s in verdict.stages},
        "gates": [f"{g.gate}: {g.reason}" for g in verdict.gates if not g.passed],
        "notes": list(verdict.notes)[:10],
        "items": items,
    }


def _validation_stage(bench: Benchmark) -> Any:
    """The stage named ``Validate`` (S3 in the reference benchmarks), or None."""
    return next((s for s in bench.spec.stages if s.name == "Validate"), None)


def _pilot_runs(bench: Benchmark, record: Any, turns: Sequence[RecordedTurn]) -> int:
    """Validation passes in a trajectory: tool calls of the Validate stage that ran the pilot.

    A call counts when it belongs to a Validate turn, names the pilot artifact (the
    stage's first artifact, ``validation/pilot.csv`` in the reference benchmarks) in
    its code, and changed the workspace. Reading the pilot back (``cat``) changes
    nothing and does not count. A pilot run hidden behind another script's name is
    not seen, so the count is a lower bound; the scripted teachers name the path.
    """
    stage = _validation_stage(bench)
    if stage is None or not stage.artifacts or record is None:
        return 0
    pilot = stage.artifacts[0]
    validate = {i for i, t in enumerate(turns) if t.stage == stage.id}
    return sum(
        1 for c in record.calls if c.turn in validate and c.changed_workspace and pilot in c.code
    )


def play_turns(
    bench: Benchmark,
    start: StageState,
    store: BlobStore,
    turns: Sequence[RecordedTurn],
    *,
    backend: str,
    protocol: str,
    on_boundary: Callable[[str, Any], None],
    score: bool,
) -> PlayedEpisode:
    """Step recorded turns through a real E2E env from ``start``.

    ``on_boundary(stage, env)`` runs before the first turn of each stage.
    """
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.verifier.reward import RubricReward

    base = StageEnv(
        E2E,
        benchmark=bench,
        states=MemoryStates(store, [start]),
        backend=backend,
        protocol=protocol,
    )
    env = RubricReward(base) if score else base
    pending = iter(turns)
    current = None

    def act(_: dict[str, Any]) -> Completion | None:
        nonlocal current
        turn = next(pending, None)
        if turn is None:
            return None
        if turn.stage != current and turn.stage != E2E:
            current = turn.stage
            on_boundary(current, env)
        return Completion(turn.text, turn.num_tokens)

    try:
        # A recorded trajectory is replayed as it was, a restarted sandbox included.
        end = run_episode(env, act, state_id=start.state_id, on_restart="ignore")
        terminated, truncated = end.terminated, end.truncated
        episode = PlayedEpisode(
            reason=None,
            turns=base.turns,
            tool_calls=base.tool_calls,
            pilot_runs=_pilot_runs(bench, base.record, turns),
        )
        if truncated:
            episode.reason = "teacher ran out of budget"
        elif not terminated:
            episode.reason = "teacher did not call finish"
        elif score:
            verdict = env.last_verdict  # type: ignore[union-attr]
            episode.reward = float(verdict.reward or 0.0) if verdict is not None else 0.0
            if verdict is not None:
                episode.verdict = verdict_summary(verdict)
        return episode
    finally:
        env.close()


def replay_teacher(
    bench: Benchmark,
    task: Any,
    outcome: str,
    start: StageState,
    store: BlobStore,
    *,
    backend: str,
    protocol: str,
    on_boundary: Callable[[str, Any], None],
    score: bool,
    turns: Sequence[RecordedTurn] | None = None,
) -> tuple[str | None, float | None]:
    """Step the teacher through a real E2E env from ``start``, calling back at stage boundaries.

    ``on_boundary(stage, env)`` runs before the first turn of each stage. ``turns``
    replays recorded actions (a policy's trajectory); default: the scripted teacher's
    turns for ``outcome``. Returns a rejection reason (None when the trajectory ran to
    finish) and, when ``score``, the E2E rubric reward of the finished episode (a null
    verdict counts as 0).
    """
    if turns is None:
        turns = scripted_turns(bench, task, outcome, protocol)
    episode = play_turns(
        bench,
        start,
        store,
        turns,
        backend=backend,
        protocol=protocol,
        on_boundary=on_boundary,
        score=score,
    )
    return episode.reason, episode.reward
