"""Admission by demonstration: a row enters a bank only if honest work can win it.

A row teaches by its reward: a GRPO group on it has signal only when some rollouts earn
more than others, and an imitation target is worth copying only when it pays. A row
whose earlier stages left a mistake no honest play can get past (a bug frozen in an
earlier stage's artifacts) pays nothing for honest work, and so pays only a policy
that gets around the freeze. Every candidate row is therefore played from its own
start state by a demonstrator of the behaviour it teaches and scored by the row's own
contract, and it is admitted only when that play earns at least
:data:`ADMIT_MIN_SHARE` of the row's attainable reward (:func:`attainable_reward`).

The demonstrator (:func:`demonstration_turns`): what the benchmark supplies
(:meth:`~bat_gym.benchmark.Benchmark.demonstration_turns`), else the teacher the row
was cut from, its own work on the row's stage (the scripted
teacher for the row's outcome, or a policy teacher's recorded actions). Nothing here
knows which rows are winnable today: each is played and scored.

The demonstration is stored with the row (:func:`store_demonstration`: its actions,
reward and verdict in brief, one blob named in ``provenance["demonstration"]``), and
:meth:`~bat_gym.bank.StageBank.verify` replays it (:func:`replay_demonstration`).
:class:`Demonstrator` plays them, one sandbox for many rows.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bat_gym.bank.replay import PlayedEpisode, RecordedTurn
from bat_gym.bank.states import MemoryStates
from bat_gym.benchmark import Benchmark
from bat_gym.core.sandbox.blobs import ScratchStore
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import E2E, StageState

__all__ = [
    "ADMIT_MIN_SHARE",
    "BELOW_BAR",
    "Demonstration",
    "Demonstrator",
    "attainable_reward",
    "reference_reward",
    "demonstration_turns",
    "load_demonstration",
    "play_demonstration",
    "replay_demonstration",
    "scored_trajectory",
    "store_demonstration",
]


ADMIT_MIN_SHARE = 0.9
"""A row is admitted when its demonstration earns at least this share of its attainable
reward (:func:`attainable_reward`)."""

BELOW_BAR = f"demonstration below {ADMIT_MIN_SHARE} of the attainable reward"
"""The refusal reason of a demonstration that finished but earned too little."""


def reference_reward(bench: Benchmark, task: Any, backend: str = "local") -> float:
    """The E2E reward a correct run earns on ``task`` (0..1).

    ``overall(task_score(reference), 1.0)``: the benchmark's reference run
    (:meth:`~bat_gym.benchmark.Benchmark.reference_script`, cached per task) for its
    task score and full credit for every stage. Without a reference run (none declared,
    or it failed) it is taken as 1.0.

    Args:
        bench: the benchmark.
        task: the task (a reduced one for a surrogate).
        backend: the sandbox backend the reference runs on.
    """
    from bat_gym.rubrics.verifier.reference import reference_workspace
    from bat_gym.rubrics.verifier.scoring import overall_score

    ref = reference_workspace(bench, task, backend=backend)
    score = bench.task_score(task, ref) if ref is not None else None
    best = overall_score(score, 1.0, bench.spec) if score is not None else None
    return 1.0 if best is None else min(1.0, best)


def attainable_reward(bench: Benchmark, row: StageState, backend: str = "local") -> float:
    """The most a policy can earn on ``row``, in reward units (0..1).

    A stage row's reward is its stage credit, so 1.0. An E2E row's reward mixes in the
    task metric, which an imperfect provided model caps: it is what a correct run earns
    (:func:`reference_reward`: the reference run's task score and
    full stage credit).
    """
    if row.focus != E2E:
        return 1.0
    task = bench.task_of_state(row)
    return 1.0 if task is None else reference_reward(bench, task, backend)


@dataclass(frozen=True)
class Demonstration:
    """One row's demonstration: its actions, and what the row's contract paid for them.

    Attributes:
        turns: the actions played from the row's start state, ending in ``finish``.
        reward: the row's contract's reward for them (a null verdict or an unfinished
            play counts as 0).
        attainable: the row's attainable reward (:func:`attainable_reward`).
        verdict: the verdict in brief (:func:`~bat_gym.bank.verdict_summary`), None
            when the play did not finish.
        unfinished: why the play did not end in ``finish`` (None: it did).
    """

    turns: tuple[RecordedTurn, ...]
    reward: float
    attainable: float
    verdict: dict[str, Any] | None = None
    unfinished: str | None = None

    @property
    def share(self) -> float:
        """``reward / attainable`` (1.0 where nothing is attainable)."""
        return self.reward / self.attainable if self.attainable > 0 else 1.0

    @property
    def refusal(self) -> str | None:
        """Why the row is not admitted, as the manifest counts it (None: admitted)."""
        if self.unfinished is not None:
            return f"demonstration did not finish ({self.unfinished})"
        # 1e-9: a reward equal to the bar in exact arithmetic must not fail on rounding.
        if self.reward < ADMIT_MIN_SHARE * self.attainable - 1e-9:
            return BELOW_BAR
        return None

    def describe(self) -> str:
        """One line: the reward, its share of the attainable, and the bar."""
        if self.unfinished is not None:
            return f"the demonstration did not finish: {self.unfinished}"
        return (
            f"the demonstration earns {self.reward:.3f}, {self.share:.2f} of the attainable "
            f"{self.attainable:.3f} (admitted from {ADMIT_MIN_SHARE})"
        )

    def summary(self, state: StageState) -> dict[str, Any]:
        """What a build's journal keeps of it: the row, its scores, and any refusal."""
        short = [
            f"{i['stage']}.{i['item']} {i['status']}: {i['detail'][:160]}"
            for i in (self.verdict or {}).get("items", [])
            if i["status"] == "failed"
        ]
        return {
            "state_id": state.state_id,
            "focus": state.focus,
            "outcome": state.outcome,
            "reward": self.reward,
            "attainable": self.attainable,
            "refused": self.refusal,
            # What fell short, for `bank explain` (a refused row's verdict is kept nowhere else).
            "short": short[:3] if self.refusal else [],
        }


def demonstration_turns(
    bench: Benchmark,
    task: Any,
    row: StageState,
    trajectory: Sequence[RecordedTurn],
    protocol: str,
) -> list[list[RecordedTurn]]:
    """The demonstrators of ``row``, in the order they are tried: each one's actions.

    The benchmark's own demonstrator when it supplies one
    (:meth:`~bat_gym.benchmark.Benchmark.demonstration_turns`). Where the row is a
    repair exercise (:meth:`~bat_gym.benchmark.Benchmark.repair_turns`), first the
    success teacher's work on the row's stage as it plays from the row (the repair
    included). Else the teacher's own work on the row, from ``trajectory``, the turns
    the row was cut from (nothing is asked of the teacher again): for an E2E row the
    whole trajectory; for a stage row the turns of the row's stage, then ``finish``, as
    a stage episode asks ("do stage S3 only, then call finish"). Then, for a row cut
    from a trajectory that was not a success, the scripted ``success`` teacher's work
    on the row's stage: a row whose own trajectory goes on to make a mistake (a failure
    trajectory's Setup row, say) is still won by the careful engineer's work from the
    same state. Identical action sequences are listed once.

    A stage row is never demonstrated by later stages' work: a row that only pays a
    policy which also does the next stage (a Setup judged by the settings its pilot
    chooses, say) would teach it to ignore the stage it is asked for.
    """
    supplied = bench.demonstration_turns(task, row)
    if supplied is not None:
        return [_rendered(supplied, protocol)]
    scripts = [list(trajectory)]
    if row.focus != E2E and bench.repair_turns(task, row.focus, row.outcome):
        # A repair exercise: the teacher's repair of the earlier mistake comes first.
        scripts.insert(0, _rendered(bench.teacher_script_from(task, row), protocol))
    if row.outcome != "success" and "success" in bench.outcomes:
        scripts.append(_rendered(bench.teacher_script(task, "success"), protocol))
    out: list[list[RecordedTurn]] = []
    for script in scripts:
        turns = _stage_work(script, row.focus, protocol)
        if turns not in out:
            out.append(turns)
    return out


def _rendered(turns: Sequence[Any], protocol: str) -> list[RecordedTurn]:
    """Teacher turns as an assistant writes them in ``protocol``."""
    from bat_gym.core.protocol import get_protocol

    proto = get_protocol(protocol)
    return [RecordedTurn(t.stage, proto.render(t.content, list(t.calls))) for t in turns]


def _stage_work(turns: Sequence[RecordedTurn], focus: str, protocol: str) -> list[RecordedTurn]:
    """The turns of stage ``focus`` ending in ``finish`` (all of ``turns`` for E2E).

    A stage's turns end where the next stage's begin; unless the last of them already
    calls ``finish`` (the last stage's does), a ``finish`` turn is added.
    """
    from bat_gym.core.protocol import ToolCall, get_protocol

    if focus == E2E:
        return list(turns)
    proto = get_protocol(protocol)
    own = [t for t in turns if t.stage == focus]
    if own and any(c.name == "finish" for c in proto.parse(own[-1].text).calls):
        return own
    done = ToolCall(name="finish", arguments={"summary": f"Stage {focus} is done."})
    return [*own, RecordedTurn(focus, proto.render("Done.", [done]))]


def _demonstration(
    bench: Benchmark,
    row: StageState,
    turns: Sequence[RecordedTurn],
    episode: PlayedEpisode,
    backend: str,
) -> Demonstration:
    """The :class:`Demonstration` of a played episode (the attainable reward only if needed)."""
    reward = episode.reward or 0.0
    # A reward at the bar of the best possible row (1.0) needs no reference run.
    attainable = 1.0 if reward >= ADMIT_MIN_SHARE else attainable_reward(bench, row, backend)
    return Demonstration(
        turns=tuple(turns),
        reward=reward,
        attainable=attainable,
        verdict=episode.verdict,
        unfinished=episode.reason,
    )


class Demonstrator:
    """Plays demonstrations from rows whose blobs are in ``store``, in one env.

    One sandbox serves every row (each reset restores the row's whole workspace,
    service state and conversation), so a task's rows cost one sandbox start, not one
    each. What the episodes write goes to a scratch store over ``store``, which is only
    read. Close it (or use it as a context manager) to release the sandbox.

    Args:
        bench: the benchmark.
        store: the store holding the rows' snapshots.
        backend: the sandbox backend.
        protocol: the tool protocol the turns are written in.
    """

    def __init__(self, bench: Benchmark, store: BlobStore, *, backend: str, protocol: str) -> None:
        self.bench = bench
        self.backend = backend
        self.protocol = protocol
        self._tmp = tempfile.TemporaryDirectory(prefix="bat-gym-demo-")
        self._states = MemoryStates(ScratchStore(Path(self._tmp.name) / "store", store), [])
        self._env: Any = None

    def __enter__(self) -> Demonstrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def play(self, row: StageState, turns: Sequence[RecordedTurn]) -> Demonstration:
        """Play ``turns`` from ``row``'s start state and score them by ``row``'s contract."""
        from bat_gym.bank.replay import verdict_summary
        from bat_gym.core.completion import Completion
        from bat_gym.rollout import run_episode

        self._states.add(row)
        if self._env is None:
            from bat_gym.env import StageEnv
            from bat_gym.rubrics.verifier.reward import RubricReward

            self._env = RubricReward(
                StageEnv(
                    E2E,
                    benchmark=self.bench,
                    states=self._states,
                    backend=self.backend,
                    protocol=self.protocol,
                )
            )
        pending = iter(turns)

        def act(_: dict[str, Any]) -> Completion | None:
            turn = next(pending, None)
            return None if turn is None else Completion(turn.text, turn.num_tokens)

        # As a recorded trajectory is replayed: a restarted sandbox is played through.
        end = run_episode(self._env, act, state_id=row.state_id, on_restart="ignore")
        episode = PlayedEpisode(reason=None)
        if end.truncated:
            episode.reason = "ran out of budget"
        elif not end.terminated:
            episode.reason = "did not call finish"
        else:
            verdict = self._env.last_verdict
            episode.reward = float(verdict.reward or 0.0) if verdict is not None else 0.0
            episode.verdict = None if verdict is None else verdict_summary(verdict)
        return _demonstration(self.bench, row, turns, episode, self.backend)

    def close(self) -> None:
        """Release the sandbox and the scratch store."""
        if self._env is not None:
            self._env.close()
            self._env = None
        self._tmp.cleanup()


def play_demonstration(
    bench: Benchmark,
    row: StageState,
    turns: Sequence[RecordedTurn],
    store: BlobStore,
    *,
    backend: str,
    protocol: str,
) -> Demonstration:
    """Play ``turns`` from ``row``'s start state and score them by ``row``'s contract.

    One row's :meth:`Demonstrator.play`; ``store`` is only read.
    """
    with Demonstrator(bench, store, backend=backend, protocol=protocol) as demonstrator:
        return demonstrator.play(row, turns)


def scored_trajectory(
    bench: Benchmark,
    row: StageState,
    turns: Sequence[RecordedTurn],
    episode: PlayedEpisode,
    backend: str,
) -> Demonstration:
    """The demonstration of an E2E row that is its trajectory's own, already played and scored."""
    return _demonstration(bench, row, turns, episode, backend)


def store_demonstration(store: BlobStore, row: StageState, demo: Demonstration) -> StageState:
    """``row`` with its demonstration stored in ``store`` and named in its provenance.

    The blob holds ``{"turns": [[stage, text, num_tokens], ...], "reward",
    "attainable", "verdict"}``; ``provenance["demonstration"]`` names it and repeats
    the reward and attainable reward, so a bank can be summarised without reading it.
    """
    blob = json.dumps(
        {
            "turns": [list(t) for t in demo.turns],
            "reward": demo.reward,
            "attainable": demo.attainable,
            "verdict": demo.verdict,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    digest = store.put_bytes(blob)
    stored = {"blob": digest, "reward": demo.reward, "attainable": demo.attainable}
    return row.model_copy(update={"provenance": {**row.provenance, "demonstration": stored}})


def load_demonstration(store: BlobStore, row: StageState) -> list[RecordedTurn] | None:
    """The actions of ``row``'s stored demonstration, or None when it has none."""
    named = row.provenance.get("demonstration") or {}
    if not named.get("blob"):
        return None
    data = json.loads(store.read_blob(named["blob"]))
    return [RecordedTurn(*t) for t in data["turns"]]


def replay_demonstration(
    demonstrator: Demonstrator, row: StageState, store: BlobStore
) -> Demonstration | None:
    """Play ``row``'s demonstration stored in ``store`` again and score it (None: none stored)."""
    turns = load_demonstration(store, row)
    if turns is None:
        return None
    return demonstrator.play(row, turns)
