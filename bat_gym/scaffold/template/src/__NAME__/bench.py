"""__NAME__: score every case of a CSV with a small linear model, stage by stage.

Each task ships ``data/cases.csv`` (id, value), a model in ``model/model.json``
(``score = slope * value_in_cm + offset``, four decimals) and ``task.json``, which names
the unit the values are recorded in. The trap: that unit is never the model's (cm), so a
pipeline that skips the conversion gets every case wrong. The task metric is the share
of cases whose submitted score agrees with the model's within 1e-4: continuous scores,
which a guess or a constant does not match.

Each stage's name is the env id that serves it: ``gym.make("bat/<Name>-v0",
benchmark="__NAME__")``, plus ``bat/E2E-v0`` for whole episodes. The rubric contracts in
``contracts/`` score each stage; their ``focus`` is the stage's id (S1, S2, ...).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bat_gym.benchmark import (
    Benchmark,
    # [stage Validate]
    PilotFigure,
    # [end]
    # [stage Plan]
    PlanFact,
    # [end]
    Split,
    TeacherTurn,
    Tolerance,
)
from bat_gym.core.protocol import ToolCall
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.spec import BenchmarkSpec, SeedRange, Splits, Task, Track
from bat_gym.core.stages import reference_stage
from bat_gym.rubrics.contract.model import ContractLibrary

if TYPE_CHECKING:
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["SPEC", "__CLASS__", "agreement"]

NAME = "__NAME__"
# The artifacts, named once: the skills, the teacher and the metric use these, and the
# contracts in contracts/ name the same paths.
PIPELINE = "pipeline/score.py"
# [stage Plan]
PLAN = "plan/plan.md"
# [end]
# [stage Validate]
PILOT = "validation/pilot.csv"
PILOT_RECEIPT = "validation/s3_validation.json"
# [end]
# [stage Infer]
PREDICTIONS = "outputs/predictions.csv"
# [end]
SUBMISSION = "outputs/submission.csv"

UNITS = {"mm": 0.1, "m": 100.0}  # to centimetres; never cm itself, so the trap always bites
AGREEMENT = 1e-4  # a score agrees with the model's within this distance
PIPELINE_SOURCE = Path(__file__).with_name("pipeline.py").read_text(encoding="utf-8")
NAIVE_PIPELINE = PIPELINE_SOURCE.replace(" * TO_CM[unit]", "")
assert NAIVE_PIPELINE != PIPELINE_SOURCE, "the naive pipeline must differ from the teacher's"

SPEC = BenchmarkSpec(
    name=NAME,
    version="0.1",
    description="Score CSV cases with a linear model whose unit differs from the data's.",
    # The reference stages (bat_gym.core.stages): names and agentic weights, with this
    # package's skills and artifacts. Weights are relative: an E2E reward renormalizes
    # them over the stages it scores.
    stages=(
        # [stage Plan]
        reference_stage(
            "Plan",
            id="__S_Plan__",
            skill=f"Read TASK.md, task.json, data/cases.csv and model/MODEL_CARD.md. Write {PLAN}: "
            "how many cases there are, the unit the values are recorded in, and how the "
            "pipeline converts them to the model's unit.",
            artifacts=(PLAN,),
        ),
        # [end]
        reference_stage(
            "Setup",
            id="__S_Setup__",
            skill=f"Write {PIPELINE}: `python {PIPELINE} OUT [ID ...]` reads data/cases.csv, "
            "model/model.json and task.json, converts the values to the model's unit and "
            "writes OUT with columns id,score (the model's score, four decimals) for the ids "
            "given (every case when none).",
            artifacts=(PIPELINE,),
        ),
        # [stage Validate]
        reference_stage(
            "Validate",
            id="__S_Validate__",
            skill=f"Run the pipeline on ONE case (`python {PIPELINE} {PILOT} ID`) and check its "
            "score against the model card; fix the pipeline if it is wrong. Write the check to "
            f'{PILOT_RECEIPT}: {{"check": {{"case": ID, "name": "value_cm", "value": the '
            "case's value in cm, \"passed\": whether the pilot's score is the card's}}.",
            artifacts=(PILOT,),
        ),
        # [end]
        # [stage Infer]
        reference_stage(
            "Infer",
            id="__S_Infer__",
            skill=f"Run the pipeline on every case: `python {PIPELINE} {PREDICTIONS}`.",
            artifacts=(PREDICTIONS,),
        ),
        # [end]
        reference_stage(
            "Submit",
            id="__S_Submit__",
            skill=f"Run the pipeline on every case into {SUBMISSION} (columns id,score, one "
            "row per case id that task.json lists).",
            artifacts=(SUBMISSION,),
        ),
    ),
    tracks=(
        Track(name="units", metric="agreement", description="Values in mm or m; model in cm."),
    ),
    # Seeds 0.. feed the Stage Bank; held-out seeds are for evaluation only. `bat-gym eval`
    # plays heldout_repeats held-out tasks per track.
    splits=Splits(
        train=SeedRange(start=0, stop=10_000),
        heldout=SeedRange(start=1_000_000, stop=1_000_100),
        heldout_repeats=5,
    ),
)

# [stage Validate]
# The teacher's check of its pilot, by hand from the card, written to the receipt.
CHECK_PILOT = f"""import csv, hashlib, json
unit = json.load(open("task.json"))["value_unit"]
model = json.load(open("model/model.json"))
pilot = next(csv.DictReader(open("{PILOT}")))
value = float(next(r for r in csv.DictReader(open("data/cases.csv")) if r["id"] == pilot["id"])["value"])
value_cm = value * {UNITS!r}[unit]
passed = abs(float(pilot["score"]) - round(model["slope"] * value_cm + model["offset"], 4)) <= 1e-4
check = {{"case": pilot["id"], "name": "value_cm", "value": round(value_cm, 6), "passed": passed}}
digest = hashlib.sha256(open("{PILOT}", "rb").read()).hexdigest()
receipt = {{"stage": "Validate", "artifact": "{PILOT}", "sha256": digest, "check": check}}
json.dump(receipt, open("{PILOT_RECEIPT}", "w"), indent=2)
print("CHECK", "OK" if passed else "FAILED", check)
"""
# [end]

MODEL_CARD = """# Model card

score = slope * value + offset, with the value in centimetres (cm), rounded to four
decimals. slope and offset are in model/model.json.
"""


def agreement(
    workspace: FrozenWorkspace, path: str, truth: dict[str, float], *, complete: bool
) -> float:
    """Share of the CSV's scored cases whose ``score`` is within AGREEMENT of the truth.

    Scored cases: every case of ``truth`` when ``complete`` (a submission), else the
    file's own rows (a pilot). 0 for a missing or garbled file, an id given twice, a
    case missing from a submission, or a row naming a case the task does not have.
    """
    try:
        rows = list(csv.DictReader(io.StringIO(workspace.read_text(path))))
        scores: dict[str, float] = {}
        for row in rows:
            if row["id"] in scores:
                return 0.0
            scores[row["id"]] = float(row["score"])
    except (OSError, ValueError, KeyError, TypeError, csv.Error):
        return 0.0
    scored = list(truth) if complete else list(scores)
    if not scored or not set(scored) <= set(truth) or not set(scored) <= set(scores):
        return 0.0
    return sum(abs(scores[c] - truth[c]) <= AGREEMENT for c in scored) / len(scored)


class __CLASS__(Benchmark):
    """__NAME__: the task generator, the private answers, the teacher and the metric."""

    spec = SPEC

    # -- tasks: seeded, public files for the sandbox, private answers for the verifier --

    def _draw(self, track: str, seed: int) -> dict[str, Any]:
        """Everything about one task, public and private, from one seeded generator."""
        tracks = [t.name for t in self.spec.tracks]
        rng = np.random.default_rng([seed, tracks.index(track)])
        ids = sorted(f"case{int(i):03d}" for i in rng.choice(1000, int(rng.integers(4, 9)), False))
        unit = str(rng.choice(sorted(UNITS)))
        slope = round(float(rng.uniform(0.5, 2.0)), 3)
        offset = round(float(rng.uniform(-1.0, 1.0)), 3)
        values = [round(float(v) / UNITS[unit], 4) for v in rng.uniform(0.5, 10.0, len(ids))]
        # The truth is the model on the values as published, in the pipeline's order.
        scores = {
            i: round(slope * v * UNITS[unit] + offset, 4) for i, v in zip(ids, values, strict=True)
        }
        model = {"slope": slope, "offset": offset, "unit": "cm"}
        return {"ids": ids, "unit": unit, "model": model, "values": values, "scores": scores}

    def make_task(self, track: str, seed: int, split: Split) -> Task:  # noqa: D102
        self.spec.track(track)  # an unknown track raises TrackNotFound
        d = self._draw(track, seed)
        return Task(
            task_id=self.task_id(track, seed, split),
            benchmark=NAME,
            track=track,
            seed=seed,
            split=split,
            card=f"Score every case of data/cases.csv with the model in model/model.json and "
            f"submit {SUBMISSION}. Read TASK.md, task.json and the model card first.",
            params={"cases": len(d["ids"])},
        )

    def write_public_files(self, task: Task, dest: Path) -> None:  # noqa: D102
        d = self._draw(task.track, task.seed)
        rows = "".join(f"{i},{v}\n" for i, v in zip(d["ids"], d["values"], strict=True))
        schema = {"columns": ["id", "score"], "case_ids": d["ids"]}
        files = {
            "data/cases.csv": "id,value\n" + rows,
            "model/model.json": json.dumps(d["model"], indent=2),
            "model/MODEL_CARD.md": MODEL_CARD,
            "task.json": json.dumps({"value_unit": d["unit"], "submission": schema}, indent=2),
            "TASK.md": f"# {NAME} task\n\n{task.card}\n",
        }
        for rel, text in files.items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text, encoding="utf-8")

    def private_answers(self, task: Task) -> dict[str, Any]:
        """The model's score of every case: the truth the metric compares with."""
        return {"scores": self._draw(task.track, task.seed)["scores"]}

    def sandbox_requirements(self) -> SandboxRequirements:
        """Nothing beyond python3: the pipeline uses the standard library only."""
        return SandboxRequirements()

    # -- what the verifier computes: the metric, the reproduction, the plan's facts -----

    def task_score(self, task: Task, workspace: FrozenWorkspace) -> float:
        """Share of the task's cases whose submitted score agrees with the model's."""
        truth = self.private_answers(task)["scores"]
        return agreement(workspace, SUBMISSION, truth, complete=True)

    # [stage Validate]
    def pilot_score(self, task: Task, workspace: FrozenWorkspace, pilot_path: str) -> float:
        """Share of the pilot's rows whose score agrees with the model's (``pilot_quality``)."""
        truth = self.private_answers(task)["scores"]
        return agreement(workspace, pilot_path, truth, complete=False)

    def risky_cases(self, task: Task) -> frozenset[str]:
        """Where the unit trap shows (``pilot_checked``): every case, as the unit is never cm."""
        return frozenset(self._draw(task.track, task.seed)["ids"])

    def pilot_figure(
        self, task: Task, workspace: FrozenWorkspace, pilot_path: str, case: str
    ) -> PilotFigure:
        """The Validate check's figure (``pilot_checked``): the case's value in cm, within 1e-4.

        It passes when the pilot's score for the case is the model's; ``value`` is None
        for a case the task does not have.
        """
        d = self._draw(task.track, task.seed)
        if case not in d["ids"]:
            return PilotFigure("value_cm", None, False)
        value_cm = d["values"][d["ids"].index(case)] * UNITS[d["unit"]]
        right = agreement(workspace, pilot_path, {case: d["scores"][case]}, complete=True)
        return PilotFigure("value_cm", value_cm, right == 1.0, tolerance=1e-4)

    # [end]
    def numeric_tolerance(self, task: Task) -> dict[str, Tolerance]:
        """Scores agree with the reference run's within AGREEMENT (the task metric's)."""
        return {"score": Tolerance(atol=AGREEMENT)}

    def reproduction_command(self, task: Task) -> str:
        """How the verifier runs the agent's pipeline again (``pipeline_reproduces``)."""
        return f"mkdir -p outputs && python {PIPELINE} {SUBMISSION}"

    # [stage Plan]
    def plan_facts(self, task: Task) -> tuple[PlanFact, ...]:
        """What only reading the task reveals (``plan_states_facts``): cases and unit.

        Each fact declares its rivals (another count of cases, the other unit), so a
        plan that lists every candidate value earns nothing for it.
        """
        d = self._draw(task.track, task.seed)
        return (
            PlanFact.count("the number of cases", len(d["ids"])),
            PlanFact.choice(
                "the unit the values are recorded in", d["unit"], tuple(UNITS), kind="unit"
            ),
        )

    # [end]
    def contract_library(self) -> ContractLibrary:
        """This package's contracts (contracts/*.yaml), not bat_gym's five-stage ones."""
        return _contracts()

    # -- scripts: the teacher (the Stage Bank's source) and the naive baseline ---------

    def teacher_turns(self, task: Task) -> list[TeacherTurn]:
        """A careful engineer's whole episode, one turn per stage, then finish."""
        d = self._draw(task.track, task.seed)
        return [
            # [stage Plan]
            TeacherTurn(
                "__S_Plan__",
                "Reading the task, then writing the plan.",
                (
                    bash(
                        f"cat task.json model/MODEL_CARD.md\n"
                        f"mkdir -p plan && cat > {PLAN} <<'EOF'\n"
                        f"# Plan\n\nThere are {len(d['ids'])} cases. The values are in "
                        f"{d['unit']}; the model expects cm, so the pipeline multiplies each "
                        f"value by {UNITS[d['unit']]} before scoring.\nEOF"
                    ),
                ),
            ),
            # [end]
            TeacherTurn(
                "__S_Setup__",
                "Writing the pipeline, with the unit conversion.",
                (write_pipeline(PIPELINE_SOURCE),),
            ),
            # [stage Validate]
            TeacherTurn(
                "__S_Validate__",
                "A pilot on one case.",
                (
                    bash(
                        f"mkdir -p validation && python {PIPELINE} {PILOT} {d['ids'][0]}\n"
                        f"cat {PILOT}\npython3 - <<'EOF'\n{CHECK_PILOT}EOF"
                    ),
                ),
            ),
            # [end]
            # [stage Infer]
            TeacherTurn(
                "__S_Infer__",
                "Every case.",
                (bash(f"mkdir -p outputs && python {PIPELINE} {PREDICTIONS}"),),
            ),
            # [end]
            TeacherTurn(
                "__S_Submit__",
                f"The submission, all {len(d['ids'])} cases.",
                (bash(f"mkdir -p outputs && python {PIPELINE} {SUBMISSION}"),),
            ),
            TeacherTurn(
                "__S_Submit__", "All stages are done.", (finish(f"Submitted {SUBMISSION}."),)
            ),
        ]

    def naive_turns(self, task: Task) -> list[TeacherTurn]:
        """The naive baseline: no plan or pilot, and a pipeline without the unit conversion.

        ``eval --policy naive`` plays it, and ``audit-reward`` holds every exploit to it.
        """
        return [
            TeacherTurn("__S_Setup__", "Writing the pipeline.", (write_pipeline(NAIVE_PIPELINE),)),
            TeacherTurn(
                "__S_Submit__",
                "Submitting.",
                (bash(f"mkdir -p outputs && python {PIPELINE} {SUBMISSION}"),),
            ),
            TeacherTurn("__S_Submit__", "Done.", (finish("Submitted."),)),
        ]


@functools.cache
def _contracts() -> ContractLibrary:
    # Loaded once per process: every episode's verdict asks for the library.
    return ContractLibrary.from_dir(Path(__file__).with_name("contracts"))


def bash(code: str) -> ToolCall:
    """An ``execute_code`` call running bash."""
    return ToolCall(name="execute_code", arguments={"language": "bash", "code": code + "\n"})


def write_pipeline(source: str) -> ToolCall:
    """A bash call that writes ``source`` to the pipeline's path."""
    return bash(f"mkdir -p pipeline && cat > {PIPELINE} <<'EOF'\n{source}EOF")


def finish(summary: str) -> ToolCall:
    """The ``finish`` call that ends the episode."""
    return ToolCall(name="finish", arguments={"summary": summary})
