"""What a rubric check sees, and what it returns.

A check reads only a :class:`CheckContext`: the frozen workspace captured after the
episode, the frozen start workspace, the execution record, and (lazily) the task's
private answers and metric. The agent's messages are not in it, so prose can never
stand in for an artifact or a run. A check returns a :class:`CheckResult`: passed,
failed, or null (could not be scored because infrastructure failed), with pointers to
the evidence it used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bat_gym.core.errors import PluginError
from bat_gym.core.record import ExecutionRecord, ToolCallRecord
from bat_gym.core.spec import BenchmarkSpec
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = [
    "EvidenceKind",
    "Evidence",
    "CheckResult",
    "CheckFailed",
    "CheckUnscorable",
    "TaskOracle",
    "CheckContext",
]

EvidenceKind = Literal["artifact", "execution"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Evidence(BaseModel):
    """A pointer to what a decision rests on: a file of the frozen workspace or a tool call."""

    model_config = _STRICT

    kind: EvidenceKind = Field(
        description="artifact: a file (path and sha256); execution: a tool call (index)."
    )
    path: str | None = Field(None, description="Workspace-relative file path (artifact).")
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="The file's sha256 (artifact)."
    )
    call: int | None = Field(None, ge=0, description="Index of the tool call (execution).")

    @model_validator(mode="after")
    def _shape(self) -> Evidence:
        if self.kind == "artifact" and (
            self.path is None or self.sha256 is None or self.call is not None
        ):
            raise ValueError("artifact evidence needs path and sha256, and no call")
        if self.kind == "execution" and (self.call is None or self.path or self.sha256):
            raise ValueError("execution evidence needs call, and no path or sha256")
        return self

    @classmethod
    def artifact(cls, path: str, sha256: str) -> Evidence:
        """A file of the frozen workspace."""
        return cls(kind="artifact", path=path, sha256=sha256)

    @classmethod
    def execution(cls, call: int) -> Evidence:
        """A tool call of the execution record."""
        return cls(kind="execution", call=call)


class CheckResult(BaseModel):
    """One check's decision.

    ``passed`` is True or False, or None when the check could not be scored because
    infrastructure failed (a sandbox restart, a missing blob, no task oracle).
    """

    model_config = _STRICT

    passed: bool | None = Field(description="The decision; None: unscorable (infrastructure).")
    evidence: tuple[Evidence, ...] = Field((), description="What the decision rests on.")
    detail: str = Field("", description="Why, in one line; never a private answer.")

    @classmethod
    def ok(cls, detail: str, evidence: tuple[Evidence, ...] = ()) -> CheckResult:
        """A pass."""
        return cls(passed=True, evidence=evidence, detail=detail)

    @classmethod
    def fail(cls, detail: str, evidence: tuple[Evidence, ...] = ()) -> CheckResult:
        """A failure."""
        return cls(passed=False, evidence=evidence, detail=detail)

    @classmethod
    def null(cls, detail: str) -> CheckResult:
        """Not scorable because infrastructure failed."""
        return cls(passed=None, detail=detail)

    @property
    def kinds(self) -> frozenset[str]:
        """The evidence kinds present."""
        return frozenset(e.kind for e in self.evidence)


class CheckFailed(Exception):
    """Raised inside a check to fail it with ``detail`` (the registry turns it into a result)."""

    def __init__(self, detail: str, evidence: tuple[Evidence, ...] = ()) -> None:
        self.detail = detail
        self.evidence = evidence
        super().__init__(detail)


class CheckUnscorable(Exception):
    """Raised inside a check when infrastructure, not the agent, keeps it from deciding."""


def _unit_or_none(value: Any, what: str) -> float | None:
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0.0 <= value <= 1.0
    ):
        # The benchmark's own metric is at fault, not the agent's work.
        raise PluginError(f"{what} returned {value!r}; expected None or a number in [0, 1]")
    return None if value is None else float(value)


class TaskOracle:
    """What only the verifier may see about a task: answers, metric, reference outputs.

    Everything is computed on first use, so checks that need none of it cost nothing
    extra.

    Args:
        answers: returns the task's private answers.
        metric: the task metric of a frozen workspace, in [0, 1], or None if unscorable.
        pilot: the task metric on a pilot's case(s) only: ``(workspace, pilot_path)``
            to [0, 1], or None if unscorable. Default: none (pilot quality is null).
        reference: the workspace the benchmark's reference script leaves on the
            pristine task (:mod:`bat_gym.rubrics.verifier.reference`), or None if it has none.
            Default: none (reference checks are null).
        files_agree: ``(path, mine, reference) -> bool``, the benchmark's comparison
            of an output file with the reference's. Default: the same bytes.
        plan_facts: the task's :class:`~bat_gym.benchmark.PlanFact` tuple. Default: none.
        reproduce: ``(final workspace, outputs, from_reference) -> workspace``: the
            agent's shipped pipeline run again out of band, with the paths
            ``from_reference`` as the reference run left them
            (:func:`bat_gym.rubrics.verifier.reference.reproduce`), or None. Default: none (reproduction checks are null).
        judge: returns the benchmark's judge policy (:meth:`Benchmark.judge`), or None.
            Default: none (judged checks are null).
        tolerance: returns the benchmark's per-column numeric tolerance
            (:meth:`Benchmark.numeric_tolerance`). Default: none (the checks' own).
        pilot_reference: ``(reference, workspace, pilot_path)`` to the reference run's
            task metric on the case(s) the pilot names, in [0, 1], or None
            (:meth:`Benchmark.pilot_reference_score`). Default: none (a relative pilot
            bar rests on the reference's whole-task score).
        risky_cases: returns the cases where the task's planted pitfall shows, or
            None (:meth:`Benchmark.risky_cases`). Default: none (every case counts).
        pilot_figure: ``(workspace, pilot_path, case)`` to the
            :class:`~bat_gym.benchmark.PilotFigure` the task's own check computes on
            that case, or None (:meth:`Benchmark.pilot_figure`). Default: none (the
            ``pilot_checked`` items are null).
    """

    def __init__(
        self,
        answers: Callable[[], Mapping[str, Any]],
        metric: Callable[[FrozenWorkspace], float | None],
        pilot: Callable[[FrozenWorkspace, str], float | None] | None = None,
        reference: Callable[[], FrozenWorkspace | None] | None = None,
        files_agree: Callable[[str, bytes, bytes], bool] | None = None,
        reproduce: Callable[
            [FrozenWorkspace, tuple[str, ...], tuple[str, ...]], FrozenWorkspace | None
        ]
        | None = None,
        plan_facts: Callable[[], tuple[Any, ...]] | None = None,
        judge: Callable[[], Any] | None = None,
        pilot_reference: Callable[[FrozenWorkspace, FrozenWorkspace, str], float | None]
        | None = None,
        risky_cases: Callable[[], frozenset[str] | None] | None = None,
        pilot_figure: Callable[[FrozenWorkspace, str, str], Any] | None = None,
        tolerance: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._answers = answers
        self._metric = metric
        self._pilot = pilot
        self._reference = reference
        self.files_agree = files_agree or (lambda path, mine, ref: mine == ref)
        self._reproduce = reproduce
        self._plan_facts = plan_facts
        self._judge = judge
        self._pilot_reference = pilot_reference
        self._risky_cases = risky_cases
        self._pilot_figure = pilot_figure
        self._tolerance = tolerance
        self._scores: dict[str, float | None] = {}
        self._pilot_scores: dict[tuple[str, str], float | None] = {}
        self._pilot_reference_scores: dict[tuple[str, str], float | None] = {}

    @cached_property
    def judge(self) -> Any:
        """The judge policy, or None (made on first use)."""
        return None if self._judge is None else self._judge()

    @cached_property
    def answers(self) -> Mapping[str, Any]:
        """The private answers."""
        return self._answers()

    @cached_property
    def reference(self) -> FrozenWorkspace | None:
        """What the benchmark's reference script leaves on the pristine task, if anything."""
        return None if self._reference is None else self._reference()

    @cached_property
    def tolerance(self) -> Mapping[str, Any]:
        """The benchmark's numeric tolerance per CSV column (``Tolerance`` by name)."""
        return {} if self._tolerance is None else dict(self._tolerance())

    @cached_property
    def plan_facts(self) -> tuple[Any, ...]:
        """The facts a plan of this task must state (names and patterns)."""
        return () if self._plan_facts is None else tuple(self._plan_facts())

    @cached_property
    def risky_cases(self) -> frozenset[str] | None:
        """The cases where the task's planted pitfall shows; None: every case counts."""
        found = None if self._risky_cases is None else self._risky_cases()
        return None if found is None else frozenset(found)

    def pilot_figure(self, workspace: FrozenWorkspace, path: str, case: str) -> Any:
        """The figure the task's own check computes on ``case`` of the pilot at ``path``.

        A :class:`~bat_gym.benchmark.PilotFigure`, or None when the benchmark declares
        no check (or the oracle has no such hook).
        """
        return None if self._pilot_figure is None else self._pilot_figure(workspace, path, case)

    def reproduce(
        self,
        final: FrozenWorkspace,
        outputs: tuple[str, ...],
        from_reference: tuple[str, ...] = (),
    ) -> FrozenWorkspace | None:
        """The agent's pipeline run again on pristine inputs, or None if there is no way to.

        ``from_reference``: paths (files or folders) that start as the reference run
        left them, whatever ``final`` holds there (a later stage's configuration).
        """
        if self._reproduce is None:
            return None
        return self._reproduce(final, outputs, from_reference)

    def score(self, workspace: FrozenWorkspace) -> float | None:
        """The task metric of ``workspace`` (computed once per snapshot digest).

        Raises:
            ValueError: the metric returned something other than None or a number in [0, 1].
        """
        if workspace.digest not in self._scores:
            self._scores[workspace.digest] = _unit_or_none(self._metric(workspace), "task metric")
        return self._scores[workspace.digest]

    def pilot_score(self, workspace: FrozenWorkspace, path: str) -> float | None:
        """The task metric on the pilot at ``path`` only (computed once per snapshot and path).

        None when the oracle has no pilot metric or the benchmark cannot score the pilot.

        Raises:
            ValueError: the pilot metric returned something other than None or a number in [0, 1].
        """
        if self._pilot is None:
            return None
        key = (workspace.digest, path)
        if key not in self._pilot_scores:
            self._pilot_scores[key] = _unit_or_none(self._pilot(workspace, path), "pilot metric")
        return self._pilot_scores[key]

    def pilot_reference_score(self, workspace: FrozenWorkspace, path: str) -> float | None:
        """The reference run's task metric on the case(s) the pilot at ``path`` names.

        None without a reference run, without the benchmark's hook, or when the
        benchmark cannot score the reference on those cases. Computed once per
        snapshot and path.

        Raises:
            PluginError: the hook returned something other than None or a number in [0, 1].
        """
        if self._pilot_reference is None:
            return None
        key = (workspace.digest, path)
        if key not in self._pilot_reference_scores:
            reference = self.reference
            value = None if reference is None else self._pilot_reference(reference, workspace, path)
            self._pilot_reference_scores[key] = _unit_or_none(value, "pilot reference metric")
        return self._pilot_reference_scores[key]


@dataclass(frozen=True)
class CheckContext:
    """Everything a check may read.

    Attributes:
        workspace: the workspace captured after the episode.
        start: the workspace the episode started from.
        record: every tool call of the episode.
        task: private answers and task metric; None when the task is unknown.
        spec: the benchmark's spec (stage weights and task weight for E2E verdicts).
    """

    workspace: FrozenWorkspace
    start: FrozenWorkspace
    record: ExecutionRecord
    task: TaskOracle | None = None
    spec: BenchmarkSpec | None = None

    @cached_property
    def _productive_calls(self) -> list[ToolCallRecord]:
        return [c for c in self.record.calls if c.succeeded and c.changed_workspace]

    def changed(self, path: str) -> bool:
        """True if ``path`` is a file now that was absent or different at the start."""
        now = self.workspace.sha256(path)
        return now is not None and now != self.start.sha256(path)

    def writer(self, path: str) -> ToolCallRecord | None:
        """The tool call credited with writing ``path`` in this episode, if any.

        The last call that exited 0 and whose recorded writes include ``path``. For a
        record without per-call writes (older records), attribution is by mention: the
        last call that exited 0, changed the workspace and names the file (its path or
        file name) in its code; failing that, the last that exited 0 and changed the
        workspace. None when the file is unchanged since the start or no call qualifies.
        """
        if not self.changed(path):
            return None
        calls = self._productive_calls
        if calls and all(c.writes is not None for c in self.record.calls):
            # A call that wrote the path changed the workspace: exiting 0 is what is left.
            wrote = [c for c in self.record.writers(path) if c.succeeded]
            return wrote[-1] if wrote else None
        name = path.rsplit("/", 1)[-1]
        named = [c for c in calls if path in c.code or name in c.code]
        chosen = named or calls
        return chosen[-1] if chosen else None

    def artifact(self, path: str) -> tuple[Evidence, ...]:
        """Evidence for a file: its pointer, and the call that wrote it when there is one."""
        sha = self.workspace.sha256(path)
        if sha is None:
            return ()
        call = self.writer(path)
        pointer = Evidence.artifact(path, sha)
        return (pointer,) if call is None else (pointer, Evidence.execution(call.index))
