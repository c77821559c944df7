"""What a staged benchmark provides to bat_gym, as one abstract class.

A benchmark author subclasses :class:`Benchmark`, fills in its :class:`BenchmarkSpec`
and the four task methods, and registers it under the ``bat_gym.benchmarks`` entry
point (see :mod:`bat_gym.catalog`). The core never imports a benchmark by name.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import ToolCall, ToolProtocol
from bat_gym.core.spec import E2E, BenchmarkSpec, ContractRef, StageState, Task

if TYPE_CHECKING:
    from bat_gym.core.sandbox.requirements import SandboxRequirements
    from bat_gym.core.service import ServiceState
    from bat_gym.core.tools import Tool
    from bat_gym.rubrics.contract.model import ContractLibrary
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["Benchmark", "PilotFigure", "PlanFact", "TeacherTurn", "Tolerance"]

Split = Literal["train", "heldout"]


class TeacherTurn(NamedTuple):
    """One teacher action: the stage it belongs to, free text, and its tool calls."""

    stage: str
    content: str
    calls: tuple[ToolCall, ...]


class Tolerance(NamedTuple):
    """How far a number may be from the reference run's and still agree.

    A number ``a`` agrees with the reference's ``b`` when ``|a - b| <= atol + rtol * |b|``
    (the units are the column's own). Nothing widens it: a value printed more coarsely
    than the tolerance allows disagrees, and the verdict says so.

    Attributes:
        rtol: relative tolerance (>= 0).
        atol: absolute tolerance (>= 0), in the column's unit.
    """

    rtol: float = 0.0
    atol: float = 0.0


class PlanFact(NamedTuple):
    """Something a plan can state only after reading the task and the model card.

    A fact is *stated* when one of its ``patterns`` matches the plan, and *contradicted*
    when one of its ``rivals`` does: another count of the same thing, another unit,
    another value of the convention or flag. The ``plan_states_facts`` check credits a
    fact only when it is stated and not contradicted, so a plan that lists every
    candidate value (a blind enumeration) earns nothing for it. All patterns are
    regular expressions, matched case-insensitively (``(?-i:...)`` scopes a
    case-sensitive part).

    Facts of one ``kind`` may state each other's values: where a rival's match
    overlaps a match of another fact of the same kind, it is that fact's value, not a
    contradiction (a plan converting "mm to cm" states the input unit and the model's
    unit, both facts of kind ``unit``).

    Build facts with :meth:`count`, :meth:`choice` and :meth:`setting`, which derive
    the patterns and rivals from a value; use the fields directly for anything else.

    Attributes:
        name: what the fact is, in a few words ("the number of cases"); verdicts name
            a missing or contradicted fact by it, never by its patterns or value.
        patterns: how the plan may state the fact's value; any match states it.
        rivals: how a plan states a value that contradicts it; any match (not excused
            by a fact of the same kind) withholds the fact's credit. Default: none.
        kind: what sort of value the fact is (``count``, ``unit``, ``convention``,
            ``flag``, ...); facts of one kind excuse each other's values. Default: ""
            (a kind of its own).
        value: the fact's value as a plan states it ("12 cases", "--unit mm"), for
            teachers, tests and docs: a plan made of the values of a task's facts
            states them all. Default: "".

    >>> PlanFact.count("the number of cases", 12).value
    '12 cases'
    """

    name: str
    patterns: tuple[str, ...]
    rivals: tuple[str, ...] = ()
    kind: str = ""
    value: str = ""

    @classmethod
    def count(cls, name: str, n: int, noun: str = "cases") -> PlanFact:
        """``n`` of something, stated as ``"<n> <noun>"``; any other ``"<m> <noun>"`` rivals it.

        Args:
            name: the fact's name.
            n: the count (>= 0).
            noun: the plural noun the count is stated with ("cases", "patients"). A
                singular ("1 case") is neither a statement nor a rival.
        """
        if n < 0:
            raise ConfigError(f"a count is at least 0, got {n}")
        noun = re.escape(noun)
        return cls(
            name,
            (rf"(?<![\w.,]){n}\s+{noun}\b",),
            (rf"(?<![\w.,])(?!{n}\s)\d+\s+{noun}\b",),
            kind=f"count of {noun}",
            value=f"{n} {noun}",
        )

    @classmethod
    def choice(
        cls,
        name: str,
        value: str,
        among: tuple[str, ...],
        *,
        kind: str,
        also: tuple[str, ...] = (),
    ) -> PlanFact:
        """One of the values ``among`` (a unit, a convention); the others rival it.

        Each value matches as a whole word, case-insensitively.

        Args:
            name: the fact's name.
            value: the right value; one of ``among``.
            among: every value of its kind a task may call for.
            kind: what the values are (``unit``, ``orientation``, ...).
            also: more patterns that state the value (a function that applies it).

        Raises:
            ConfigError: ``value`` is not one of ``among``.
        """
        if value not in among:
            raise ConfigError(f"{value!r} is not one of {among}")
        return cls(
            name,
            (_word(value), *also),
            tuple(_word(v) for v in among if v != value),
            kind=kind,
            value=value,
        )

    @classmethod
    def setting(cls, name: str, flag: str, value: str) -> PlanFact:
        """A command-line setting ``"<flag> <value>"``; the flag with any other value rivals it.

        Args:
            name: the fact's name.
            flag: the option (``--unit``).
            value: its right value (``mm``).
        """
        f, v = re.escape(flag), re.escape(value)
        return cls(
            name,
            (rf"{f}[ =]{v}{_END}",),
            (rf"{f}[ =](?!{v}{_END})[\w.-]*\w",),
            kind=f"setting {flag}",
            value=f"{flag} {value}",
        )


# A value ends where no word, path, contraction or file suffix goes on ("mm." ends a
# sentence; "mm.csv" and "mm/" go on).
_END = r"(?![\w/'’-]|\.\w)"


def _word(value: str) -> str:
    """``value`` as a whole word: not inside a longer word, path, number or contraction."""
    return rf"(?<![\w/.+'’-]){re.escape(value)}{_END}"


class PilotFigure(NamedTuple):
    """What the task's own S3 check computes on one piloted case, as the verifier recomputes it.

    The agent states the same figure in its S3 receipt (``"check": {"case", "name",
    "value", "passed"}``, see ``docs/benchmark-authors.md``); the ``pilot_checked``
    rubric check compares the two.

    Attributes:
        name: the figure's name, as the receipt must state it (``"value_cm"``).
        value: the figure: a number (compared within ``tolerance``) or a string
            (compared exactly, spaces around it left out); None when the check cannot
            be computed on that case (no stated figure then matches).
        passed: whether the pilot passes the task's check by this figure.
        tolerance: how far a stated number may be from ``value`` (absolute, in the
            figure's unit): room for the rounding a receipt prints with.
    """

    name: str
    value: float | str | None
    passed: bool
    tolerance: float = 0.0


class Benchmark(ABC):
    """A staged benchmark: spec, task generator, private answers and a teacher.

    Subclasses set :attr:`spec` and implement the abstract methods. Generators must be
    deterministic: the same ``(track, seed, split)`` gives the same bytes.

    A benchmark may also define ``naive_turns(task) -> list[TeacherTurn]``, a naive
    baseline's script (as :meth:`teacher_turns`): ``bat-gym eval --policy naive`` plays
    it, and ``bat-gym audit-reward`` holds every exploit to it. Without one, both refuse
    the naive policy in one line. ``bat-gym new-benchmark NAME`` writes a working
    benchmark to start from.
    """

    spec: BenchmarkSpec

    #: The teacher outcomes :meth:`teacher_turns` can produce. A benchmark that declares
    #: more than ``success`` takes them as ``teacher_turns(task, outcome=...)``.
    outcomes: tuple[str, ...] = ("success",)

    @property
    def name(self) -> str:
        """The benchmark's registered name."""
        return self.spec.name

    # -- tasks ------------------------------------------------------------------------

    @abstractmethod
    def make_task(self, track: str, seed: int, split: Split) -> Task:
        """Describe one task (public card and parameters only)."""

    @abstractmethod
    def write_public_files(self, task: Task, dest: Path) -> None:
        """Write the files the agent starts with into the empty directory ``dest``."""

    @abstractmethod
    def private_answers(self, task: Task) -> dict[str, Any]:
        """What the task metric needs and the agent must never see."""

    @abstractmethod
    def teacher_turns(self, task: Task) -> list[TeacherTurn]:
        """A careful engineer's full workflow for ``task``, stage by stage, ending in finish."""

    def teacher_script(self, task: Task, outcome: str = "success") -> list[TeacherTurn]:
        """The teacher's turns for ``outcome``: one of :attr:`outcomes`.

        A benchmark that declares only ``success`` is asked plainly
        (``teacher_turns(task)``); others get ``outcome=``.

        Raises:
            BatGymError: the benchmark declares no such outcome.
        """
        if outcome not in self.outcomes:
            from bat_gym.core.errors import BatGymError

            raise BatGymError(
                f"{self.name} has no teacher outcome {outcome!r}; it declares {self.outcomes}"
            )
        if tuple(self.outcomes) == ("success",):
            return list(self.teacher_turns(task))
        return list(self.teacher_turns(task, outcome=outcome))  # type: ignore[call-arg]

    def teacher_stages(self, track: str, outcome: str) -> tuple[str, ...] | None:
        """The stages the teacher's ``outcome`` script labels its turns with, in order.

        What a default-states plan needs of a task before it is generated: the focuses
        its trajectory yields. Override it where the stages do not depend on the task's
        data, so planning the default states generates no task (a benchmark whose
        generators are costly pays for it on the first reset of a fresh install). It
        must equal the stages of :meth:`teacher_script` for every task of the track.
        Default: None, and the plan generates the task to read its script.
        """
        return None

    def repair_turns(self, task: Task, focus: str, outcome: str) -> list[TeacherTurn]:
        """The success teacher's turns for stage ``focus`` of a row cut from ``outcome``.

        Only for a row whose start state carries an earlier stage's mistake (a row cut
        from a ``failure`` trajectory after the mistake was made): a repair exercise
        that detects the mistake from evidence, repairs it in the open, re-runs what
        depends on it and records the repair in the stage's receipt (the ``repairs``
        record, see docs/evidence.md). Played in place of the stage's own turns, before
        the success script's later stages (:meth:`teacher_script_from`). Default:
        ``[]`` (every row is a clean exercise).
        """
        return []

    def teacher_script_from(self, task: Task, state: StageState) -> list[TeacherTurn]:
        """The success teacher's turns as it plays them from ``state``, ending as its script does.

        For an E2E row the whole script. For a stage row the script from the stage's
        first turn, with the stage's turns replaced by :meth:`repair_turns` where the
        row is a repair exercise. The scripted teacher plays these
        (:class:`~bat_gym.policies.ScriptedPolicy`), and a Stage Bank admits a row by
        them (:mod:`bat_gym.bank.demonstrate`).
        """
        turns = self.teacher_script(task, "success")
        if state.focus == "E2E":
            return turns
        repair = list(self.repair_turns(task, state.focus, state.outcome))
        if repair:
            last = max((i for i, t in enumerate(turns) if t.stage == state.focus), default=-1)
            return [*repair, *turns[last + 1 :]]
        first = next((i for i, t in enumerate(turns) if t.stage == state.focus), len(turns))
        return turns[first:]

    def reduce_task(self, task: Task, *, max_cases: int) -> Task | None:
        """A reduced form of ``task`` for E2E surrogate rows, or None if there is none.

        A reduced task keeps the seed, generator, stage order, semantics and output
        schema, but has only its first ``max_cases`` cases; its files, answers and
        score must agree on them. Implementations record the reduction in
        ``task.params["reduction"]`` (``{"max_cases": k}``), so that
        :meth:`task_of` can regenerate it, and give it a task id of its own.
        Default: None (the benchmark has no reduced form).

        Args:
            task: a task from :meth:`make_task`.
            max_cases: how many cases to keep (at least 1).
        """
        return None

    def reduced_task(self, task: Task, max_cases: int, params: dict[str, Any]) -> Task:
        """``task`` as its reduced form, for implementations of :meth:`reduce_task`.

        Gives the reduced task its own stable id, tier 1, and ``params`` with the
        reduction recorded (``params["reduction"] = {"max_cases": max_cases}``).

        Args:
            task: the full task.
            max_cases: the cases kept.
            params: the reduced task's parameters (without the reduction).

        Raises:
            ValueError: ``max_cases`` is below 1, or ``task`` is already reduced.
        """
        self.check_reducible(task, max_cases)
        raw = f"{task.task_id}/reduced/{max_cases}"
        return task.model_copy(
            update={
                "task_id": f"{task.track}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}",
                "tier": 1,
                "params": {**params, "reduction": {"max_cases": max_cases}},
            }
        )

    @staticmethod
    def check_reducible(task: Task, max_cases: int) -> None:
        """Refuse a reduction of an already reduced task, or to fewer than one case.

        Raises:
            ValueError: naming which.
        """
        if task.params.get("reduction"):
            raise ConfigError(f"task {task.task_id} is already reduced")
        if max_cases < 1:
            raise ConfigError(f"max_cases must be at least 1, got {max_cases}")

    def task_of(
        self, track: str, seed: int, split: Split, reduction: dict[str, Any] | None = None
    ) -> Task | None:
        """Regenerate a task, reduced as recorded in a row's provenance.

        Args:
            track: the track.
            seed: the generator seed.
            split: the split.
            reduction: ``{"max_cases": k}`` for a reduced task, or None.

        Returns:
            The task, or None when a reduction is asked for and there is no reduced form.
        """
        task = self.make_task(track, seed, split)
        if not reduction:
            return task
        return self.reduce_task(task, max_cases=int(reduction["max_cases"]))

    def task_of_state(self, state: StageState) -> Task | None:
        """The task a bank row was built from, regenerated from its provenance.

        None when the provenance names no seed, or the regenerated task's id differs
        from the row's, so a row is never paired with another task's answers.
        """
        seed, split = state.provenance.get("seed"), state.provenance.get("split", "train")
        if not isinstance(seed, int) or split not in ("train", "heldout"):
            return None
        task = self.task_of(state.track, seed, split, state.provenance.get("reduction"))
        return task if task is not None and task.task_id == state.task_id else None

    def task_id(self, track: str, seed: int, split: Split) -> str:
        """An opaque, stable id that reveals neither seed nor split."""
        raw = f"{self.spec.name}/{self.spec.version}/{track}/{split}/{seed}"
        return f"{track}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}"

    def new_task(self, track: str, seed: int, split: Split, **fields: Any) -> Task:
        """A task of this benchmark, named by :meth:`task_id`; ``fields`` are the rest (card, params)."""
        return Task(
            task_id=self.task_id(track, seed, split),
            benchmark=self.spec.name,
            track=track,
            seed=seed,
            split=split,
            **fields,
        )

    def seeds(self, split: Split) -> range:
        """The generator seeds of a split."""
        r = self.spec.splits.train if split == "train" else self.spec.splits.heldout
        return range(r.start, r.stop)

    def evaluated_seeds(self) -> list[int]:
        """The held-out seeds an evaluation plays, per track: the first ``splits.heldout_repeats``.

        The one definition the evaluation harness and the leakage checks (the bank's
        admission gate and ``bat-gym bank audit``) share: what is evaluated is exactly
        what a bank is audited against.
        """
        return list(self.seeds("heldout"))[: self.spec.splits.heldout_repeats]

    # -- sandbox ----------------------------------------------------------------------

    def sandbox_requirements(self) -> SandboxRequirements:
        """The python modules code inside this benchmark's sandbox imports.

        Declare what the pipelines your teacher writes, the scripts and model files among
        your public files, and your skills' suggestions import, with the packages that
        provide them: ``pip`` names (for the ``local`` backend, which runs this
        interpreter), Debian bookworm packages and pure-Python distributions to copy from
        this interpreter (for the ``docker`` image, built with them). An env whose backend cannot provide them refuses to start with
        :class:`~bat_gym.core.errors.SandboxUnavailable` instead of failing every episode.
        Default: numpy only (:data:`bat_gym.core.sandbox.requirements.DEFAULT_REQUIREMENTS`).
        """
        from bat_gym.core.sandbox.requirements import DEFAULT_REQUIREMENTS

        return DEFAULT_REQUIREMENTS

    # -- tools ------------------------------------------------------------------------

    def tools(self) -> tuple[Tool, ...]:
        """The benchmark's own tools, offered beside ``execute_code`` and ``finish``.

        Each is a :class:`bat_gym.core.tools.Tool`: typed arguments (a pydantic model), a
        handler run on the host (against :meth:`make_service`'s service) or a program
        run in the sandbox, under the same budgets, timeout and output cap as
        ``execute_code``; every call lands in the execution record (see
        :mod:`bat_gym.core.tools`). Default: none.
        """
        return ()

    def make_service(self) -> ServiceState | None:
        """A fresh service for one env, or None (the default: the benchmark has none).

        Its state is part of every start state (:mod:`bat_gym.core.service`): the env
        restores it on reset, a Stage Bank captures it at every stage boundary, and
        host tools reach it as :attr:`ToolContext.service <bat_gym.core.tools.ToolContext.service>`.
        A benchmark with a service also defines :meth:`service_blobs`.
        """
        return None

    def service_blobs(self, task: Task) -> dict[str, bytes] | None:
        """The service's state at the start of ``task`` (named blobs), or None without a service.

        Must be deterministic, like the public files. Default: None.
        """
        return None

    # -- reference outputs ------------------------------------------------------------

    def reference_script(self, task: Task) -> list[TeacherTurn] | None:
        """The workflow whose outputs are the truth an agent's artifacts must agree with.

        The verifier plays its tool calls in a fresh sandbox on the task's pristine
        files (out of band, cached per task: :mod:`bat_gym.rubrics.verifier.reference`), and the
        ``matches_reference`` checks compare the agent's artifacts with what it left:
        predictions must be the provided model's outputs, a pilot's rows the model's
        rows for its cases, recorded environment facts the real ones. Default: the
        teacher's ``success`` workflow. Return None to declare no reference; those
        checks are then null (excluded), and a stage rests on its other items.
        """
        return self.teacher_script(task, "success")

    def demonstration_turns(self, task: Task, state: StageState) -> list[TeacherTurn] | None:
        """Who shows that a Stage Bank row can be won: turns played from ``state``, or None.

        A bank admits a row only when a demonstration of the behaviour it teaches,
        played from the row's own start state and scored by the row's own contract,
        earns at least 0.9 of what the row can pay
        (:mod:`bat_gym.bank.demonstrate`). Default None: the teacher's own work on the
        row, from :meth:`teacher_script` for ``state.outcome`` (for a stage row, the
        turns of ``state.focus`` then ``finish``: never a later stage's work), and for a
        row not cut from a success, the ``success`` script's the same way. Return the
        episode's turns from ``state``, ending in ``finish``, to demonstrate otherwise:
        repairing in the open a mistake an earlier stage left in the row's workspace,
        say.
        """
        return None

    def plan_facts(self, task: Task) -> tuple[PlanFact, ...]:
        """Task-specific facts a plan must state (the ``plan_states_facts`` guard).

        Credit a plan for what only reading this task reveals: the card's input
        convention, the number of cases, the pitfall the task plants. A plan of
        generic headings states none of them. Default: none (the guard is null).
        """
        return ()

    def judge(self) -> Any:
        """A :class:`~bat_gym.policies.base.Policy` that judges free text (the ``judged`` check), or None.

        (Typed ``Any``: policies know benchmarks, so this module does not import them.)

        Off by default, and no shipped contract asks for it: a benchmark that wants an
        LLM's reading of its plans returns one here (say
        ``make_policy("openai:http://127.0.0.1:8000/v1#judge", temperature=0)``) and
        adds a ``judged`` item to its own contract. Its verdicts are cached by the
        content they judged (:mod:`bat_gym.rubrics.verifier.judge`).
        """
        return None

    input_paths: tuple[str, ...] = ("data/", "model/", "task.json", "TASK.md")
    """The task's inputs: what a reproduction puts back as it was (pristine)."""

    reproduction_omits: tuple[str, ...] = ()
    """Paths (``"validation/"``: a folder and all under it) a reproduction starts without.

    Besides the outputs, which it always starts without. Name what the pipeline must
    not depend on, such as the episode's validation notes: a stage that only adds
    files there then costs no new reproduction, its pipeline's run is the earlier
    stage's (runs are remembered by the files they start from).
    """

    def reproduction_command(self, task: Task) -> str | None:
        """Bash that runs the agent's shipped pipeline on every case, or None.

        The verifier runs it out of band in a fresh sandbox holding the agent's final
        workspace with :attr:`input_paths` put back as they were, and the
        ``pipeline_reproduces`` check asks that what it writes (the predictions) is
        what the reference run wrote: the pipeline in the workspace gets the credit,
        not whatever ran during the episode. Default: None (that check is null).
        """
        return None

    def files_agree(self, task: Task, path: str, mine: bytes, reference: bytes) -> bool:
        """Whether an output file the agent made equals the reference run's one.

        ``path`` is the agent's file. Default: the same bytes, right for outputs of a
        deterministic model written by the task's own pipeline. Override it where the
        same result has several encodings (a NIfTI header, JSON key order), comparing
        the decoded values exactly or within a tolerance you declare and document
        beside it, as :meth:`numeric_tolerance` does for CSV cells. Never widen it by
        how coarsely a value happens to be printed: that pays a submission rounded
        past what the task asks for.
        """
        return mine == reference

    def numeric_tolerance(self, task: Task) -> Mapping[str, Tolerance]:
        """Per CSV column, how far a number may be from the reference run's.

        The ``matches_reference`` and ``pipeline_reproduces`` checks compare the
        numeric cells of an agent's CSV with the reference run's by the
        :class:`Tolerance` of their column (``"*"``: every column not named), and
        by the contract's ``rtol``/``atol`` (exact up to float printing by default)
        for columns with none. The tolerance is never widened to the printing: a
        value written with fewer decimals than the tolerance needs fails. Declare
        the tolerance the task's own metric grants (scores written with four decimals
        and compared within 1e-4: ``{"score": Tolerance(atol=1e-4)}``). Default: none.
        """
        return {}

    # -- contracts --------------------------------------------------------------------

    def contract_library(self) -> ContractLibrary:
        """The rubric contracts this benchmark's episodes are scored against.

        Default: the contracts of the reference stages shipped in ``bat_gym.rubrics``,
        MedBench-Lite's five (S1 Plan .. S5 Submit, with their artifacts), which fit only
        a benchmark with those stages. Override to return a library of your own
        (``ContractLibrary.from_dir(...)``).
        """
        from bat_gym.rubrics.contract.model import ContractLibrary

        return ContractLibrary.reference()

    def contract_ref(self, focus: str) -> ContractRef | None:
        """The rubric contract an episode of ``focus`` is scored against, if any.

        Default: the ref (id, version, sha256) of the library's contract for ``focus``.
        """
        contract = self.contract_library().for_focus(focus)
        return None if contract is None else contract.ref

    def task_score(self, task: Task, workspace: FrozenWorkspace) -> float | None:
        """The task metric of a finished workspace, in [0, 1]; None when unscorable.

        Called by the verifier outside the sandbox, with the frozen workspace captured
        after the episode. Read artifacts through ``workspace`` (never a live
        directory) and the truth through :meth:`private_answers`. Return 0 for what
        the agent got wrong (a missing or garbled submission), None only when the
        metric cannot be computed at all. Default: no task metric (None).
        """
        return None

    def pilot_score(self, task: Task, workspace: FrozenWorkspace, pilot_path: str) -> float | None:
        """The task metric on the validation pilot's case(s) only, in [0, 1]; None when unscorable.

        S3's quality check (the ``pilot_quality`` rubric check) calls it with the frozen
        workspace and the pilot file's workspace-relative path (``validation/pilot.csv``
        in the reference contracts), and passes when the score reaches the contract's
        threshold. Score the pilot's rows with the task metric against the truth of
        the cases they name, which may include worked examples whose answers are
        public. Return 0 for a missing, garbled or off-task pilot, None only when there
        is no such metric. Default: None, so the quality check is null and left out of
        the S3 score.
        """
        return None

    def pilot_reference_score(
        self,
        task: Task,
        reference: FrozenWorkspace,
        workspace: FrozenWorkspace,
        pilot_path: str,
    ) -> float | None:
        """The reference run's task metric on the case(s) the agent's pilot names, in [0, 1].

        S3's quality check with ``relative`` holds the pilot to what a correct run
        scores on the same case(s), since a single case may score well below the
        task's mean even for a correct pipeline (an imperfect model on a hard case).
        ``reference`` is what the reference script left on the pristine task
        (:meth:`reference_script`); ``workspace`` and ``pilot_path`` are the agent's
        frozen workspace and pilot file, read only for the case ids the pilot names.
        Score the reference run's own outputs for those ids with the metric
        :meth:`pilot_score` uses. Return None when the reference has no output for
        one of them (the pilot names a case the reference did not run) or the pilot
        names none: the check then falls back to the reference's whole-task score.
        The check floors this score itself, so a pilot cannot lower its bar by
        choosing the case the reference does worst on. Default: None (the whole-task
        bar, as without this hook).
        """
        return None

    def risky_cases(self, task: Task) -> frozenset[str] | None:
        """The cases on which the task's planted pitfall shows, for S3's check to count.

        A case is risky when a pipeline that makes the task's planted mistake (the
        wrong unit, the unnormalized code, the transposed box) gives another output on
        it than the right pipeline: only a pilot checked there tells the two apart, so
        only a check on one of these cases earns S3's upper levels (the
        ``pilot_checked`` rubric check with ``where: risky``). Where the draw plants
        no mistake that shows (a unit that needs no conversion), return every case.
        Worked examples a pilot may name (a calibration phantom, a training pair)
        belong here when the pitfall shows on them. Default: None, every case counts.
        """
        return None

    def pilot_figure(
        self, task: Task, workspace: FrozenWorkspace, pilot_path: str, case: str
    ) -> PilotFigure | None:
        """The figure the task's own S3 check computes on the pilot's ``case``, or None.

        S3 pays for validation, not for a lucky pilot: the agent states, in its S3
        receipt, the case it checked, the figure's name and value, and whether the
        pilot passed; the verifier recomputes the figure here from the frozen
        ``workspace`` (the pilot file at ``pilot_path``, the files its rows name, the
        task's inputs) and the ``pilot_checked`` rubric check confirms the statement.
        Choose a figure that takes doing the check to know: one computed from the
        inputs or the pilot's output files (a measurement in the model's unit, the
        liver's side in mm), not a constant such as 1.0 that a policy could state
        blindly. Return a :class:`PilotFigure` for every case of the task, with
        ``value`` None where the check cannot be computed. Default: None (the
        benchmark declares no check): the ``pilot_checked`` items are null, and S3's
        levels rest on the pilot's shape, run, receipt and quality as before.
        """
        return None

    # -- prompts ----------------------------------------------------------------------

    def system_prompt(self, focus: str, protocol: ToolProtocol) -> str:
        """System text: the role, the tool and how to call it, and the stage skill(s)."""
        if focus == E2E:
            skills = "\n\n".join(f"## {s.id} {s.name}\n{s.skill.strip()}" for s in self.spec.stages)
            work = "Work through every stage in order, then call finish."
        else:
            s = self.spec.stage(focus)
            skills = f"## {s.id} {s.name}\n{s.skill.strip()}"
            work = f"Do stage {s.id} ({s.name}) only, then call finish."
        return (
            f"You are an engineer working in a sandbox on a {self.spec.name} task. "
            "Your files are in /workspace. Use the execute_code tool to run python or bash; "
            "every call is a fresh process, files persist, there is no network. "
            f"{work}\n\nCall a tool like this:\n{protocol.example}\n\n"
            f"{self.tools_prompt()}# Stage skills\n{skills}"
        )

    def tools_prompt(self) -> str:
        """The prompt section on :meth:`tools`: each one's description and JSON Schema.

        Empty for a benchmark without tools of its own (so its prompts are as before).
        """
        tools = self.tools()
        if not tools:
            return ""
        import json

        lines = ["# More tools", "Besides execute_code and finish you may call:"]
        for t in tools:
            params = json.dumps(t.schema()["function"]["parameters"], sort_keys=True)
            lines.append(f"- {t.name}: {t.description.strip()} Arguments (JSON Schema): {params}")
        return "\n".join(lines) + "\n\n"

    def user_prompt(self, task: Task, focus: str) -> str:
        """User text: the task card and which part of the workflow is asked for."""
        if focus == E2E:
            return task.card
        s = self.spec.stage(focus)
        done = [f"{p.id} {p.name}" for p in self.spec.stages[: self.spec.stages.index(s)]]
        before = (
            f"Stages {', '.join(done)} are done; their files are in /workspace. " if done else ""
        )
        return f"{task.card}\n\n{before}Now do stage {s.id} ({s.name}) and call finish when it is complete."
