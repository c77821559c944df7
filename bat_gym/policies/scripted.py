"""Scripted policies: a benchmark's own teacher and naive baseline, turn by turn.

They read the privileged :class:`~bat_gym.policies.base.EpisodeContext` to regenerate
the episode's task, then replay the script from the current turn. They are the
reference points of every evaluation (the teacher is the ceiling a learned policy is
compared with, the naive baseline the floor) and the Stage Bank's default teacher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.errors import BatGymError, ConfigError, UnsupportedPolicy
from bat_gym.core.protocol import ToolCall, ToolProtocol, get_protocol
from bat_gym.policies.base import Policy, PolicyOutput, PolicyRequest

__all__ = ["ScriptedPolicy"]

Script = Literal["teacher", "naive"]


class ScriptedPolicy(Policy):
    """Replays ``benchmark.teacher_turns(task)`` (or ``naive_turns``) one turn per call.

    Args:
        script: ``"teacher"`` or ``"naive"``.
        outcome: the teacher outcome to play (``"success"``, or another the benchmark
            declares in ``Benchmark.outcomes``).
        protocol: the tool protocol the env reads (the env's ``protocol`` argument).

    A script covers a whole E2E episode; started from a later stage's state it resumes
    at that stage's first turn. Past its end it calls ``finish``.

    Started from a stage row whose start state carries an earlier stage's mistake (a
    row cut from a ``failure`` trajectory after the mistake, see
    docs/new-benchmark.md), the success teacher plays that stage as a repair exercise:
    the benchmark's :meth:`~bat_gym.benchmark.Benchmark.repair_turns` (detect the
    mistake from evidence, repair it in the open, re-run what depends on it, record
    the repair in the stage's receipt), then the success script's later stages
    (:meth:`~bat_gym.benchmark.Benchmark.teacher_script_from`).
    """

    def __init__(
        self, script: Script = "teacher", *, outcome: str = "success", protocol: str = "hermes"
    ) -> None:
        if script not in ("teacher", "naive"):
            raise ConfigError(f"script must be 'teacher' or 'naive', got {script!r}")
        self.script = script
        self.outcome = outcome
        self.protocol: ToolProtocol = get_protocol(protocol)
        self.name = script if outcome == "success" else f"{script}:{outcome}"

    def check_benchmark(self, benchmark: Any) -> None:
        """Refuse a benchmark without this script: no ``naive_turns``, or no such outcome.

        Raises:
            UnsupportedPolicy: naming what the benchmark lacks and what to use instead.
        """
        if self.script == "naive" and not callable(getattr(benchmark, "naive_turns", None)):
            raise UnsupportedPolicy(
                self.name,
                f"{benchmark.name} defines no naive baseline (Benchmark.naive_turns); "
                "evaluate the teacher or a model instead, or add naive_turns to the benchmark",
            )
        if self.script == "teacher" and self.outcome not in benchmark.outcomes:
            raise UnsupportedPolicy(
                self.name,
                f"{benchmark.name} has no teacher outcome {self.outcome!r}; it declares "
                f"{', '.join(benchmark.outcomes)}",
            )

    def identity(self) -> dict[str, Any]:  # noqa: D102
        return {"kind": "scripted", "script": self.script, "outcome": self.outcome}

    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:  # noqa: D102
        return [self._one(r) for r in requests]

    def _turns(self, request: PolicyRequest) -> list[TeacherTurn]:
        ctx = request.context
        if ctx is None:
            raise BatGymError(
                f"the {self.name} policy replays a script and needs the episode context; "
                "drive it through bat_gym.evaluation or pass PolicyRequest(context=...)"
            )
        bench, state = ctx.benchmark, ctx.state
        task = bench.task_of_state(state)
        if task is None:
            raise BatGymError(
                f"state {state.state_id}: its task cannot be regenerated from provenance, "
                "so there is no script to replay"
            )
        if self.script == "teacher" and self.outcome == "success":
            # Only the success teacher repairs an earlier stage's mistake: the other
            # outcomes replay their own trajectory (the naive baseline never validates).
            return bench.teacher_script_from(task, state)
        if self.script == "naive":
            self.check_benchmark(bench)
            turns = list(bench.naive_turns(task))  # type: ignore[attr-defined]
        else:
            turns = bench.teacher_script(task, self.outcome)
        if state.focus == "E2E":
            return turns
        # A stage state starts at its stage: skip the earlier stages' turns.
        first = next((i for i, t in enumerate(turns) if t.stage == state.focus), len(turns))
        return turns[first:]

    def _one(self, request: PolicyRequest) -> PolicyOutput:
        turns = self._turns(request)
        turn = request.context.turn if request.context else 0
        if turn < len(turns):
            t = turns[turn]
            return PolicyOutput(self.protocol.render(t.content, list(t.calls)))
        done = ToolCall(name="finish", arguments={"summary": "The script is complete."})
        return PolicyOutput(self.protocol.render("Done.", [done]))
