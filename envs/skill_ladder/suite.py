"""SkillLadder: the :class:`~bat_gym.benchmark.Benchmark` over the three tracks."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bat_gym.benchmark import Benchmark, PilotFigure, PlanFact, Split, TeacherTurn
from bat_gym.core.protocol import ToolProtocol
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.spec import Task
from bat_gym.envs.skill_ladder import teacher
from bat_gym.envs.skill_ladder.spec import SPEC
from bat_gym.envs.skill_ladder.tasks import (
    PHANTOM_CM,
    Draw,
    draw,
    label_accuracy,
    public_files,
    reduce_draw,
)

if TYPE_CHECKING:
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["SkillLadder", "SUBMISSION", "PILOT"]

SUBMISSION = "outputs/submission.csv"
PILOT = "validation/pilot.csv"
_TOOL = Path(__file__).with_name("pipe.py")
_TO_CM = {"mm": 0.1, "cm": 1.0}


@cache
def _tool_source() -> str:
    return _TOOL.read_text(encoding="utf-8")


class SkillLadder(Benchmark):
    """skill_ladder: five one-command stages and one flag per task, for tiny policies.

    Prompts are kept short on purpose (the E2E start prompt is about 1,100 characters
    before tool schemas): the system text names each stage's command, the user text is
    the two-sentence task card.
    """

    spec = SPEC
    outcomes = teacher.OUTCOMES

    # -- tasks ------------------------------------------------------------------------

    def _draw(self, task: Task) -> Draw:
        d = draw(task.track, task.seed)
        reduction = task.params.get("reduction")
        return reduce_draw(d, int(reduction["max_cases"])) if reduction else d

    def make_task(self, track: str, seed: int, split: Split) -> Task:  # noqa: D102
        self.spec.track(track)
        seeds = self.spec.splits.train if split == "train" else self.spec.splits.heldout
        if seed not in seeds:
            raise ValueError(
                f"seed {seed} is not in the {split} range {seeds.start}..{seeds.stop - 1}"
            )
        d = draw(track, seed)
        return self.new_task(track, seed, split, card=d.card, params={"cases": len(d.case_ids)})

    def reduce_task(self, task: Task, *, max_cases: int) -> Task | None:
        """``task`` with only its first ``max_cases`` cases: an E2E surrogate.

        The card, flag and pilot case are unchanged (the first case is kept, and so is
        the phantom of ``cases``); files, answers and score see the same cases.

        Raises:
            ValueError: ``max_cases`` is below 1, or ``task`` is already reduced.
        """
        self.check_reducible(task, max_cases)
        kept = min(max_cases, len(draw(task.track, task.seed).case_ids))
        return self.reduced_task(task, max_cases, {"cases": kept})

    def write_public_files(self, task: Task, dest: Path) -> None:  # noqa: D102
        for rel, text in public_files(self._draw(task), _tool_source()).items():
            path = Path(dest) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    def private_answers(self, task: Task) -> dict[str, Any]:
        """``labels`` of the submission cases, and ``examples``: labels a pilot may also name."""
        d = self._draw(task)
        return {"labels": dict(d.labels), "examples": dict(d.examples)}

    def reproduction_command(self, task: Task) -> str:
        """The shipped pipeline on every case, as the S4 instructions run it."""
        return "mkdir -p outputs && python pipeline/infer.py outputs/predictions.csv"

    def sandbox_requirements(self) -> SandboxRequirements:
        """Nothing beyond python3: ``tool/pipe.py``, all that runs inside, is standard library."""
        return SandboxRequirements()

    # -- teacher ----------------------------------------------------------------------

    def teacher_turns(self, task: Task, outcome: str = "success") -> list[TeacherTurn]:
        """The scripted careful engineer (see :mod:`~bat_gym.envs.skill_ladder.teacher`).

        Args:
            task: the task.
            outcome: ``success``, ``recovery`` (a mistaken pilot, caught by its check and
                redone) or ``failure`` (the mistaken pilot kept).
        """
        return teacher.teacher_turns(self._draw(task), outcome)

    def repair_turns(self, task: Task, focus: str, outcome: str) -> list[TeacherTurn]:
        """The teacher's repair exercise from a failure row's S4 or S5 state, else ``[]``.

        See :func:`~bat_gym.envs.skill_ladder.teacher.repair_turns`.
        """
        return teacher.repair_turns(self._draw(task), focus, outcome)

    def plan_facts(self, task: Task) -> tuple[PlanFact, ...]:
        """What the plan must state: the number of cases and the flag the task needs.

        ``tool/pipe.py plan`` works both out from the task's files; a plan written from
        the prompt alone knows neither (the codes fix is in no text the task shows).
        Another count of cases, or the flag with another value, contradicts the plan.
        """
        d = self._draw(task)
        flag, value = teacher.right_flag(d).split(" ", 1)
        return (
            PlanFact.count("the number of cases", len(d.case_ids)),
            PlanFact.setting("the flag the task needs", flag, value),
        )

    def naive_turns(self, task: Task) -> list[TeacherTurn]:
        """A naive baseline: no plan, no pilot, the pipeline's default flags."""
        return teacher.naive_turns(self._draw(task))

    # -- metrics ----------------------------------------------------------------------

    def task_score(self, task: Task, workspace: FrozenWorkspace) -> float:
        """Accuracy of ``outputs/submission.csv`` over every case of the task.

        0 when the file is missing or garbled, when its header is not exactly
        ``id,label`` (the task.json schema), and when any case is missing.
        """
        truth = self._draw(task).labels
        return label_accuracy(
            workspace, SUBMISSION, truth, scored=list(truth), columns=["id", "label"]
        )

    def pilot_score(self, task: Task, workspace: FrozenWorkspace, pilot_path: str) -> float:
        """Accuracy of the pilot's rows, which must include the task's pilot case.

        Rows may name submission cases and the phantom (a worked example). In ``cases``
        the pilot is the calibration run, so a pilot that does not name the phantom with
        its right label is off-task and scores 0; in the other tracks any submission case
        will do. 0 for a missing or garbled pilot (see :func:`label_accuracy`).
        """
        d = self._draw(task)
        truth = {**d.labels, **d.examples}
        score = label_accuracy(workspace, pilot_path, truth, scored=None)
        if d.track != "cases":
            return score
        # The calibration run: off-task unless it names the phantom, rightly labelled.
        named = label_accuracy(workspace, pilot_path, truth, scored=[d.pilot_case])
        return score if named == 1.0 else 0.0

    def risky_cases(self, task: Task) -> frozenset[str]:
        """The cases whose pilot label the track's mistake changes.

        ``units``: the cases the other unit labels otherwise; ``cases``: the phantom,
        the only case a calibration can be checked on; ``codes``: the cases labelled
        1, which an unknown code (any reading but the right fix) labels 0.
        """
        d = self._draw(task)
        if d.track == "cases":
            return frozenset({d.choice})
        if d.track == "codes":
            return frozenset(c for c, y in d.labels.items() if y == 1)
        other = "cm" if d.choice == "mm" else "mm"
        threshold = d.model["threshold_cm"]
        values = {r["id"]: float(r["value"]) for r in d.rows}
        return frozenset(
            c for c, y in d.labels.items() if int(values[c] * _TO_CM[other] >= threshold) != y
        )

    def pilot_figure(
        self, task: Task, workspace: FrozenWorkspace, pilot_path: str, case: str
    ) -> PilotFigure:
        """What ``python pipeline/infer.py validation/pilot.csv`` checks, with the right flag.

        ``units``: ``size_cm``, the case's size in cm (within 1e-3), passing inside
        the model's range; ``cases``: ``scale``, the case's reading over the phantom's
        0.2 cm (within 1e-5), passing when the case is the phantom; ``codes``:
        ``model_code``, the case's code under the right fix, passing when the table
        holds it. ``value`` is None for a case the task's data lacks.
        """
        d = self._draw(task)
        name = {"units": "size_cm", "cases": "scale", "codes": "model_code"}[d.track]
        row = next((r for r in d.rows if r["id"] == case), None)
        if row is None:
            return PilotFigure(name, None, False)
        if d.track == "codes":
            code = (
                row["code"].lower() if d.choice == "lower" else d.model["legacy"].get(row["code"])
            )
            return PilotFigure(name, code, code in d.model["table"])
        if d.track == "cases":
            return PilotFigure(name, float(row["value"]) / PHANTOM_CM, case == d.choice, 1e-5)
        low, high = d.model["range_cm"]
        size = float(row["value"]) * _TO_CM[d.choice]
        return PilotFigure(name, size, low <= size <= high, 1e-3)

    # -- prompts ----------------------------------------------------------------------

    def system_prompt(self, focus: str, protocol: ToolProtocol) -> str:
        """A short system text, the same for every focus: the tool call, every stage's command.

        A stage row resumes an E2E episode where its stage begins (the teacher's turns
        so far are its history); its rubric contract, not its prompt, decides what is
        rewarded. A tiny policy keys on its whole context, so a skill trained on a stage
        row carries over to E2E episodes only if the row looks like the E2E episode at
        that point: with a prompt naming the stage alone, GRPO raised the S3 rows'
        reward 0.2 -> 0.45 and the E2E S3 score not at all.
        """
        lines = "\n".join(f"{s.id} {s.name}: {s.skill}" for s in self.spec.stages)
        return (
            "You work on a skill_ladder task in /workspace. Run bash with execute_code:\n"
            f"{protocol.example}\n"
            "Do the stages in order, one command per turn, then call finish.\n"
            f"{lines}"
        )

    def user_prompt(self, task: Task, focus: str) -> str:
        """The task card, for every focus (see :meth:`system_prompt`)."""
        return task.card
