"""Building one task of a bank: its rows, or why it was rejected, as a journal record.

:func:`_build_task` starts the task's E2E state, gets the teacher's turns (scripted,
or a policy's episode), replays them once, capturing every stage's start state
(:func:`_stage_state`), labels the trajectory by its E2E reward, passes each row
through the admission gates and admits it only when a demonstration played from it
wins it (:func:`_demonstrate`, :mod:`bat_gym.bank.demonstrate`). :func:`run_jobs`
builds tasks in this process or in forked workers, and hands each record to its
caller in this process (a bank build journals it, :mod:`bat_gym.bank.build`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from bat_gym.bank.demonstrate import (
    Demonstration,
    Demonstrator,
    demonstration_turns,
    reference_reward,
    scored_trajectory,
    store_demonstration,
)
from bat_gym.bank.gates import Admission
from bat_gym.bank.policy_teacher import policy_trajectory, trajectory_blob
from bat_gym.bank.replay import PlayedEpisode, RecordedTurn, play_turns, scripted_turns
from bat_gym.bank.states import SURROGATE, fit_history, initial_state, prompt_chars
from bat_gym.benchmark import Benchmark
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.service import capture_service
from bat_gym.core.spec import E2E, StageState

if TYPE_CHECKING:
    from bat_gym.core.progress import ProgressTask
    from bat_gym.policies.base import Policy

__all__ = [
    "SUCCESS_MIN_REWARD",
    "Builder",
    "Job",
    "demonstrate_pending",
    "run_jobs",
    "success_threshold",
]


SUCCESS_MIN_REWARD = 0.95
"""A success earns at least this fraction of what a correct run earns on its task.

Relative, not absolute: where the provided model is imperfect (a hard tier), a correct
run's task score, and so its E2E reward, is below 1; see :func:`success_threshold`.
"""


# One reason for every task (the bar is per task), so the manifest counts them together.
_BELOW = f"success below {SUCCESS_MIN_REWARD} of the reward of a correct run"


def success_threshold(bench: Benchmark, task: Any, backend: str = "local") -> float:
    """The least E2E reward a trajectory on ``task`` needs to be admitted as a success.

    ``SUCCESS_MIN_REWARD * reference_reward(task)``
    (:func:`~bat_gym.bank.demonstrate.reference_reward`).
    """
    return SUCCESS_MIN_REWARD * reference_reward(bench, task, backend)


class Job(NamedTuple):
    """One trajectory of a build: a task, the outcome asked for, and a reduction."""

    key: str
    track: str
    seed: int
    outcome: str | None  # None: a policy plays, and the verifier labels the outcome
    reduction: dict[str, Any] | None = None


@dataclass
class Builder:
    """What every task of one build shares (a forked worker inherits a copy)."""

    bench: Benchmark
    store: BlobStore
    backend: str
    protocol: str
    teacher: Policy | None
    labels: tuple[str, ...]
    tracks: tuple[str, ...]
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.bench, self.store, self.backend, tracks=self.tracks)

    def build(
        self,
        job: Job,
        *,
        defer: Callable[[StageState], bool] | None = None,
        score: bool = True,
    ) -> dict[str, Any]:
        """One task's journal record.

        ``defer``: rows for which it is true are not demonstrated now; the record keeps
        them under ``pending`` for :func:`demonstrate_pending` (the default states
        demonstrate a row when it is first asked for). ``score=False`` leaves a
        scripted recovery or failure trajectory unscored (see :func:`_build_task`).
        """
        return _build_task(self, job, self.admission, defer=defer, score=score)

    def close(self) -> None:
        """Release the admission gates' sandbox."""
        self.admission.close()


_WORKER: dict[str, Builder] = {}


def _work(job: Job) -> dict[str, Any]:
    return _WORKER["builder"].build(job)


def _set_worker(builder: Builder) -> None:
    from multiprocessing import util

    _WORKER["builder"] = builder
    # A pool worker leaves through os._exit, which skips atexit and __del__; the
    # finalizers of multiprocessing still run, so the gate sandbox is closed there.
    util.Finalize(builder, builder.close, exitpriority=10)


def run_jobs(
    builder: Builder,
    todo: list[Job],
    keep: Callable[[dict[str, Any]], None],
    workers: int,
    shown: ProgressTask | None = None,
) -> None:
    """Build every job in ``todo`` and hand each record to ``keep`` as it arrives.

    ``keep`` runs in this process, one record at a time, whichever process built it.
    ``shown`` is advanced once per finished job; a rejected one is noted with why.
    """

    def finished(record: dict[str, Any]) -> None:
        keep(record)
        if shown is not None:
            shown.advance(line=_rejection_line(record) if record.get("rejected") else None)

    if workers <= 1 or len(todo) <= 1:
        for job in todo:
            if shown is not None:
                shown.describe(f"building {builder.bench.name} bank: {job.key}")
            finished(builder.build(job))
        return
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    # Built once, here, before the fork: every worker inherits the held-out index.
    _ = builder.admission.heldout
    # Fork, not spawn: workers inherit the benchmark and policy objects as they are
    # (a benchmark defined in a script or a test need not be importable or picklable).
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_set_worker, initargs=(builder,)
    ) as pool:
        pending = {pool.submit(_work, job) for job in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                error = future.exception()
                if error is not None:
                    for other in pending:
                        other.cancel()
                    raise error
                finished(future.result())


def _rejection_line(record: dict[str, Any]) -> str:
    """One line for a rejected job: its key, the reason, and the verdict's reward and η."""
    verdict = record.get("verdict") or {}
    scores = ""
    if verdict:
        reward = verdict.get("reward")
        scores = (
            f" (reward {'null' if reward is None else f'{reward:.3f}'}, eta {verdict['eta']:.2f})"
        )
    return f"rejected {record['key']}: {record['rejected']}{scores}"


def _build_task(
    builder: Builder,
    job: Job,
    admission: Admission,
    *,
    defer: Callable[[StageState], bool] | None = None,
    score: bool = True,
) -> dict[str, Any]:
    """One task's journal record: its admitted rows, or the reason it was rejected.

    With a reduction the task is the reduced one and only its E2E row is kept (an
    E2E surrogate); the teacher still runs the whole episode, which is scored. Rows
    ``defer`` picks (never the E2E row of a success trajectory, whose demonstration is
    the scored trajectory itself) pass the gates but are kept under ``pending``, not
    demonstrated.

    A scripted recovery or failure trajectory is kept as labelled, so its score only
    demonstrates its E2E row: with ``score=False`` (its E2E row deferred) it is not
    scored, and that row is played when it is first asked for.
    """
    bench, store, protocol = builder.bench, builder.store, builder.protocol
    reduction = job.reduction
    scripted = builder.teacher is None
    outcome = job.outcome or "success"
    # A scripted recovery or failure trajectory is kept as labelled: the verifier does not
    # decide its label, and it is not the task's reference run.
    kept_as_labelled = scripted and outcome != "success"
    try:
        start = initial_state(
            bench,
            job.seed,
            job.track,
            store,
            protocol,
            outcome=outcome,
            reduction=reduction,
            teacher="scripted" if scripted else "policy",
        )
    except ValueError:
        return {"key": job.key, "rejected": "no reduced form", "reward": None}
    task = bench.task_of(job.track, job.seed, "train", reduction)
    expected: dict[str, str] = {}
    skipped: list[str] = []
    if builder.teacher is None:
        turns = scripted_turns(bench, task, outcome, protocol)
    else:
        turns, expected, reason = policy_trajectory(
            bench, builder.teacher, start, store, backend=builder.backend, protocol=protocol
        )
        if reason is not None:
            return {"key": job.key, "rejected": reason, "reward": None}
        trajectory = store.put_bytes(trajectory_blob(turns))
        start = start.model_copy(
            update={"provenance": {**start.provenance, "trajectory": trajectory}}
        )
        played = {t.stage for t in turns}
        skipped = [s.id for s in bench.spec.stages if s.id not in played]
    if kept_as_labelled:
        # What demonstrates its rows is compared with the reference run (a success
        # trajectory is adopted as that run, this one is not): play that now, beside it.
        _prefetch_reference(bench, task, builder.backend)
    states = [start]
    diverged: list[str] = []

    def boundary(stage: str, env: Any) -> None:
        if reduction:
            digest = env.unwrapped.sandbox.digest()
        else:
            states.append(_stage_state(bench, task, env, stage, start, protocol))
            digest = states[-1].snapshot
        if builder.teacher is not None and expected.get(stage) != digest:
            diverged.append(stage)

    # A trajectory is scored: the verifier decides a success and labels a policy's
    # trajectory, and the verdict is the E2E row's demonstration (its own play). One
    # kept as labelled needs it only for that row, which score=False defers.
    episode = play_turns(
        bench,
        start,
        store,
        turns,
        backend=builder.backend,
        protocol=protocol,
        on_boundary=boundary,
        score=score or not kept_as_labelled,
    )
    reason, reward = episode.reason, episode.reward
    if reason is None and diverged:
        reason = "replay differs from the policy's episode"
    label = outcome
    # Only a reward below the absolute bar needs the (cached) reference run's figure.
    bar = SUCCESS_MIN_REWARD
    decides = not kept_as_labelled
    if reason is None and decides and (reward or 0.0) < bar:
        bar = success_threshold(bench, task, builder.backend)
    if reason is None:
        if scripted:
            if label == "success" and (reward or 0.0) < bar:
                reason = _BELOW
        else:
            label = "success" if (reward or 0.0) >= bar else "failure"
            # A surrogate stands in for a successful E2E episode: success only.
            if label not in (("success",) if reduction else builder.labels):
                reason = _BELOW if label == "failure" else "success not requested"
    if reason is not None:
        return {"key": job.key, "rejected": reason, "reward": reward, "verdict": episode.verdict}
    if reduction and "validation_passes" in reduction:
        states = [
            s.model_copy(update={"provenance": {**s.provenance, "pilot_runs": episode.pilot_runs}})
            for s in states
        ]
    if label != start.outcome:
        states = [_relabel(s, label) for s in states]
    admitted: list[dict[str, Any]] = []
    gate_rejected: Counter[str] = Counter()
    findings: list[list[str]] = []
    candidates: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    with Demonstrator(bench, store, backend=builder.backend, protocol=protocol) as demonstrator:
        for state in states:
            found = admission.check(state, episode)
            if found is not None:
                gate_rejected[found[0]] += 1
                findings.append([state.state_id, *found])
                candidates.append(_candidate(state, f"gate {found[0]}"))
                continue
            # A success trajectory's E2E row is demonstrated by the scored play itself,
            # at no cost; any other row costs an episode, so it may wait.
            own_play = state.focus == E2E and label == "success"
            if defer is not None and not own_play and defer(state):
                pending.append(state.model_dump(mode="json"))
                continue
            candidate, row = _admit(demonstrator, store, task, state, turns, episode)
            candidates.append(candidate)
            if row is not None:
                admitted.append(row)
    record: dict[str, Any] = {
        "key": job.key,
        "reward": reward,
        "rows": admitted,
        "verdict": episode.verdict,
        "candidates": candidates,
        "rows_checked": len(states),
    }
    if pending:
        record["pending"] = pending
    if not scripted:
        record["outcome"] = label
        record["stages_without_turns"] = skipped
    if findings:
        record.update(gate_rejected=dict(gate_rejected), gate_findings=findings)
    return record


def _prefetch_reference(bench: Benchmark, task: Any, backend: str) -> None:
    """Start ``task``'s reference run in a thread: its sandbox works beside the caller's.

    The verifier's own call then finds it done or waits for it (one run per task); a
    failure here is left for that call to meet.
    """
    from bat_gym.rubrics.verifier.reference import reference_workspace

    def run() -> None:
        with contextlib.suppress(Exception):
            reference_workspace(bench, task, backend=backend)

    threading.Thread(target=run, name="bat-reference-run", daemon=True).start()


def demonstrate_pending(
    builder: Builder, job: Job, record: dict[str, Any], wanted: set[str] | None = None
) -> dict[str, Any]:
    """``record`` with its ``pending`` rows (those in ``wanted``; None: all) demonstrated.

    Each is played and admitted or refused exactly as :func:`_build_task` would have
    done it: the demonstrators of :func:`_demonstrate`, from the row's own start state,
    against the task's scripted trajectory. Only records of the scripted teacher defer
    rows. Returns a new record; ``record`` is not changed.
    """
    from bat_gym.core.spec import load_model

    todo = [r for r in record.get("pending", []) if wanted is None or r["state_id"] in wanted]
    if not todo:
        return record
    bench, protocol = builder.bench, builder.protocol
    task = bench.task_of(job.track, job.seed, "train", job.reduction)
    turns = scripted_turns(bench, task, job.outcome or "success", protocol)
    rows, candidates = list(record["rows"]), list(record["candidates"])
    with Demonstrator(
        bench, builder.store, backend=builder.backend, protocol=protocol
    ) as demonstrator:
        for dump in todo:
            state = load_model(StageState, dump, origin=f"{job.key}: pending row")
            candidate, row = _admit(demonstrator, builder.store, task, state, turns, None)
            candidates.append(candidate)
            if row is not None:
                rows.append(row)
    done = {r["state_id"] for r in todo}
    left = [r for r in record["pending"] if r["state_id"] not in done]
    out = {**record, "rows": rows, "candidates": candidates, "pending": left}
    if not left:
        del out["pending"]
    return out


def _admit(
    demonstrator: Demonstrator,
    store: BlobStore,
    task: Any,
    row: StageState,
    trajectory: list[RecordedTurn],
    episode: PlayedEpisode | None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Demonstrate ``row``: its candidate entry, and the row as admitted (None: refused).

    An admitted row carries its demonstration, stored in ``store`` (the bank's).
    """
    demo = _demonstrate(demonstrator, task, row, trajectory, episode)
    if demo.refusal is not None:
        return demo.summary(row), None
    admitted = store_demonstration(store, row, demo)
    return demo.summary(row), admitted.model_dump(mode="json")


def _candidate(state: StageState, refused: str | None) -> dict[str, Any]:
    """A candidate row's entry in its task's record: who it is, and why it was refused."""
    return {
        "state_id": state.state_id,
        "focus": state.focus,
        "outcome": state.outcome,
        "reward": None,
        "attainable": None,
        "refused": refused,
    }


def _demonstrate(
    demonstrator: Demonstrator,
    task: Any,
    row: StageState,
    trajectory: list[RecordedTurn],
    episode: PlayedEpisode | None,
) -> Demonstration:
    """The first of ``row``'s demonstrators that wins it, else the best of them.

    Each is played from the row's start state and scored by the row's contract
    (:func:`~bat_gym.bank.demonstrate.demonstration_turns` lists them). An E2E row's
    own trajectory was played and scored already, from that very state: it is not
    played again.
    """
    bench, protocol = demonstrator.bench, demonstrator.protocol
    best: Demonstration | None = None
    for turns in demonstration_turns(bench, task, row, trajectory, protocol):
        if row.focus == E2E and turns == trajectory and episode is not None:
            demo = scored_trajectory(bench, row, turns, episode, demonstrator.backend)
        else:
            demo = demonstrator.play(row, turns)
        if demo.refusal is None:
            return demo
        if best is None or demo.reward > best.reward:
            best = demo
    assert best is not None  # there is always one demonstrator
    return best


def _relabel(state: StageState, outcome: str) -> StageState:
    """``state`` with its outcome (and the outcome in its id) set to ``outcome``."""
    suffix = f".{SURROGATE}" if state.provenance.get("reduction") else ""
    return state.model_copy(
        update={"outcome": outcome, "state_id": f"{state.task_id}.{state.focus}.{outcome}{suffix}"}
    )


_NOTE_ROOM = 64  # characters kept free for fit_history's "turns omitted" note


def _stage_state(
    bench: Benchmark, task: Any, env: Any, stage: str, start: StageState, protocol: str
) -> StageState:
    """The start state of ``stage``: the workspace now, and the conversation so far."""
    from bat_gym.core.protocol import get_protocol

    proto = get_protocol(protocol)
    base = env.unwrapped
    snap = base.sandbox.capture()
    head = (
        {"role": "system", "content": bench.system_prompt(stage, proto)},
        {"role": "user", "content": bench.user_prompt(task, stage)},
    )
    room = bench.spec.budgets.max_prompt_chars - prompt_chars(head)
    history = fit_history(base.messages[2:], room)
    if prompt_chars(history) > room:
        # Turns were dropped and the note saying so tipped the history over: fit again
        # with room for the note, so the prompt stays within the budget the gate checks.
        history = fit_history(base.messages[2:], room - _NOTE_ROOM)
    return start.model_copy(
        update={
            "state_id": f"{task.task_id}.{stage}.{start.outcome}",
            "focus": stage,
            "messages": (*head, *history),
            "snapshot": snap.digest,
            "service": None
            if base.service is None
            else capture_service(base.service, base.states.store),
            "contract": bench.contract_ref(stage),
            "provenance": {
                **start.provenance,
                "upstream": {"turns": base.turns, "tool_calls": base.tool_calls},
            },
        }
    )
