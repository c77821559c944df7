"""What a staged benchmark provides to bat_gym, as one abstract class.

A benchmark author subclasses :class:`Benchmark`, fills in its :class:`BenchmarkSpec`
and the four task methods, and registers it under the ``bat_gym.benchmarks`` entry
point (see :mod:`bat_gym.registry`). The core never imports a benchmark by name.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from bat_gym.errors import ConfigError
from bat_gym.protocol import ToolCall, ToolProtocol
from bat_gym.spec import E2E, BenchmarkSpec, ContractRef, StageState, Task

if TYPE_CHECKING:
    from bat_gym.rubrics.contract import ContractLibrary
    from bat_gym.rubrics.workspace import FrozenWorkspace
    from bat_gym.sandbox.requirements import SandboxRequirements
    from bat_gym.service import ServiceState
    from bat_gym.tools import Tool

__all__ = ["Benchmark", "PlanFact", "TeacherTurn"]

Split = Literal["train", "heldout"]


class TeacherTurn(NamedTuple):
    """One teacher action: the stage it belongs to, free text, and its tool calls."""

    stage: str
    content: str
    calls: tuple[ToolCall, ...]


class PlanFact(NamedTuple):
    """Something a plan can state only after reading the task and the model card.

    Attributes:
        name: what the fact is, in a few words ("the number of cases"); verdicts name
            a missing fact by it, never by its patterns.
        patterns: regular expressions, matched case-insensitively against the plan;
            the fact is stated when any of them matches.
    """

    name: str
    patterns: tuple[str, ...]


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
            from bat_gym.errors import BatGymError

            raise BatGymError(
                f"{self.name} has no teacher outcome {outcome!r}; it declares {self.outcomes}"
            )
        if tuple(self.outcomes) == ("success",):
            return list(self.teacher_turns(task))
        return list(self.teacher_turns(task, outcome=outcome))  # type: ignore[call-arg]

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
        :class:`~bat_gym.errors.SandboxUnavailable` instead of failing every episode.
        Default: numpy only (:data:`bat_gym.sandbox.requirements.DEFAULT_REQUIREMENTS`).
        """
        from bat_gym.sandbox.requirements import DEFAULT_REQUIREMENTS

        return DEFAULT_REQUIREMENTS

    # -- tools ------------------------------------------------------------------------

    def tools(self) -> tuple[Tool, ...]:
        """The benchmark's own tools, offered beside ``execute_code`` and ``finish``.

        Each is a :class:`bat_gym.tools.Tool`: typed arguments (a pydantic model), a
        handler run on the host (against :meth:`make_service`'s service) or a program
        run in the sandbox, under the same budgets, timeout and output cap as
        ``execute_code``; every call lands in the execution record (see
        :mod:`bat_gym.tools`). Default: none.
        """
        return ()

    def make_service(self) -> ServiceState | None:
        """A fresh service for one env, or None (the default: the benchmark has none).

        Its state is part of every start state (:mod:`bat_gym.service`): the env
        restores it on reset, a Stage Bank captures it at every stage boundary, and
        host tools reach it as :attr:`ToolContext.service <bat_gym.tools.ToolContext.service>`.
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
        files (out of band, cached per task: :mod:`bat_gym.rubrics.reference`), and the
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
        turns of ``state.focus`` then ``finish``, or else the script's whole
        continuation from that stage), and for a row not cut from a success, the
        ``success`` script's the same way. Return the episode's turns from ``state``,
        ending in ``finish``, to demonstrate otherwise: repairing in the open a
        mistake an earlier stage left in the row's workspace, say.
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
        content they judged (:mod:`bat_gym.rubrics.judge`).
        """
        return None

    input_paths: tuple[str, ...] = ("data/", "model/", "task.json", "TASK.md")
    """The task's inputs: what a reproduction puts back as it was (pristine)."""

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
        the decoded values exactly or within a documented tolerance.
        """
        return mine == reference

    # -- contracts --------------------------------------------------------------------

    def contract_library(self) -> ContractLibrary:
        """The rubric contracts this benchmark's episodes are scored against.

        Default: the contracts of the reference stages shipped in ``bat_gym.rubrics``,
        MedBench-Lite's five (S1 Plan .. S5 Submit, with their artifacts), which fit only
        a benchmark with those stages. Override to return a library of your own
        (``ContractLibrary.from_dir(...)``).
        """
        from bat_gym.rubrics.contract import ContractLibrary

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
