"""The toy_pipeline benchmark: generator, private answers and scripted teacher.

Each task is a small CSV of cases and a model that gives every case a continuous score
(four decimals). The submission is ``id,score``, and the task metric is the share of
cases whose score agrees with the model's own (:func:`score_agreement`). A continuous
output is what keeps the metric honest on tasks of four to eight cases: a constant or a
guessed value agrees with almost no case, where a binary label would be right about half
the time by chance (version 1.0 scored ``id,label`` by accuracy, and a constant earned
more than the naive pipeline on imbalanced tasks). Each track plants one trap that
changes the score of most cases: values in another unit than the model's (threshold)
and category codes in another case or with padding (lookup).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bat_gym.benchmark import Benchmark, PilotFigure, PlanFact, Split, TeacherTurn, Tolerance
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.spec import BenchmarkSpec, Budgets, SeedRange, Splits, Task, Track
from bat_gym.core.stages import reference_stages
from bat_gym.envs.toy_pipeline import teacher

if TYPE_CHECKING:
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["ToyPipeline", "score_agreement"]

SUBMISSION = "outputs/submission.csv"
_UNITS = {"mm": 0.1, "cm": 1.0, "m": 100.0}  # to centimetres
_CODES = ("alpha", "beta", "gamma", "delta", "omega")
# A submitted score agrees with the model's when within this distance: half a unit of
# the fourth decimal the scores are written with, plus room for a conversion done in
# another order (``v / 10`` against ``v * 0.1``). The scores of a trap-missing pipeline
# differ by far more (see ``tests/toy_pipeline``), and a guessed value agrees by chance
# with about 1 case in 5,000.
AGREEMENT = 1e-4

SKILLS = {
    "S1": (
        "Read task.json and TASK.md, look at the data and the model card. Write plan/plan.md with "
        "three sections: '## Preprocess', '## Inference', '## Postprocess', each naming the files "
        "and checks involved."
    ),
    "S2": (
        "Record the environment in setup/environment.json (python and numpy versions). Write "
        "pipeline/infer.py: it reads data/cases.csv and model/model.json and writes a CSV with "
        "columns id,score (the model's score, four decimals) for the case ids given on the "
        "command line (all cases when none)."
    ),
    "S3": (
        "Run pipeline/infer.py on ONE case and check the result against what the data and model "
        "card say (units, codes, value ranges). Fix the pipeline if the pilot is wrong. Save the "
        "pilot output as validation/pilot.csv and a receipt validation/s3_validation.json with "
        '{"stage": "S3", "artifact": "validation/pilot.csv", "sha256": <its sha256>}.'
    ),
    "S4": (
        "Run the validated pipeline on every case into outputs/predictions.csv. Write the receipt "
        "validation/s4_completion.json with the artifact's sha256 and the number of cases."
    ),
    "S5": (
        "Write outputs/submission.csv exactly in the schema of task.json (header id,score, one row "
        "per case id, scores with four decimals). Write the receipt validation/s5_submission.json."
    ),
}

SPEC = BenchmarkSpec(
    name="toy_pipeline",
    version="2.0",
    description="Five-stage CSV scoring pipelines with a unit trap and a code-normalization trap.",
    stages=reference_stages(SKILLS),
    tracks=(
        Track(
            name="threshold",
            metric="score_agreement",
            description="Score a measurement given in some unit with a logistic model in cm.",
        ),
        Track(
            name="lookup",
            metric="score_agreement",
            description="Score noisy category codes with a lookup table.",
        ),
    ),
    budgets=Budgets(),
    splits=Splits(
        train=SeedRange(start=0, stop=10_000), heldout=SeedRange(start=1_000_000, stop=1_000_100)
    ),
    default_priority=10,
)


def logistic_score(value_cm: float, threshold_cm: float, width_cm: float) -> float:
    """The threshold track's model: ``1 / (1 + exp(-(value_cm - threshold_cm) / width_cm))``.

    Rounded to four decimals, as the model card says; all arguments in centimetres.
    """
    return round(1.0 / (1.0 + math.exp(-(value_cm - threshold_cm) / width_cm)), 4)


def score_agreement(
    workspace: FrozenWorkspace, path: str, truth: dict[str, float], *, complete: bool
) -> float:
    """Share of scored cases whose ``score`` in the ``id,score`` CSV at ``path`` agrees.

    ``agreement = (1 / |R|) * sum_{r in R} [|score_r - truth_r| <= AGREEMENT]`` over the
    scored rows ``R``: every case of ``truth`` when ``complete`` (the submission), else
    the file's own rows (a pilot). 0 when the file is missing or garbled (not UTF-8 CSV
    with ``id`` and ``score`` columns, an id given twice, no rows), when a submission
    misses a case and when a pilot names one that is not the task's. A score that is
    not a finite number disagrees.
    """
    try:
        reader = csv.DictReader(io.StringIO(workspace.read_text(path)))
        if not {"id", "score"} <= set(reader.fieldnames or ()):
            return 0.0
        rows = list(reader)
    except (OSError, ValueError, csv.Error):
        return 0.0
    predicted: dict[str, float] = {}
    for row in rows:
        case = (row["id"] or "").strip()
        if case in predicted:
            return 0.0
        try:
            predicted[case] = float((row["score"] or "").strip())
        except ValueError:
            predicted[case] = math.nan
    scored = list(truth) if complete else list(predicted)
    if not scored or not set(scored) <= set(truth) or not set(scored) <= set(predicted):
        return 0.0
    # A NaN or an infinity fails the comparison, so it disagrees.
    right = sum(abs(predicted[case] - truth[case]) <= AGREEMENT for case in scored)
    return right / len(scored)


def _pilot_scores(workspace: FrozenWorkspace, path: str) -> dict[str, float]:
    """The ``id -> score`` of the CSV at ``path``; empty when it is unreadable.

    A score that is not a number reads as NaN, which agrees with nothing.
    """
    try:
        rows = list(csv.DictReader(io.StringIO(workspace.read_text(path))))
    except (OSError, ValueError, csv.Error):
        return {}
    scores: dict[str, float] = {}
    for row in rows:
        try:
            scores[(row.get("id") or "").strip()] = float((row.get("score") or "").strip())
        except ValueError:
            scores[(row.get("id") or "").strip()] = math.nan
    return scores


def _csv(rows: list[dict[str, Any]], fields: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


class ToyPipeline(Benchmark):
    """The toy_pipeline benchmark."""

    spec = SPEC
    outcomes = teacher.OUTCOMES

    def _draw(self, track: str, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng([seed, 0 if track == "threshold" else 1])
        n = int(rng.integers(4, 9))
        ids = [f"case{int(i):03d}" for i in rng.choice(1000, size=n, replace=False)]
        if track == "threshold":
            unit = str(rng.choice(list(_UNITS)))
            threshold_cm = float(np.round(rng.uniform(1.0, 5.0), 2))
            width_cm = float(np.round(rng.uniform(0.5, 1.5), 2))
            values_cm = np.round(rng.uniform(0.2, 8.0, size=n), 3)
            values = [float(np.round(v / _UNITS[unit], 4)) for v in values_cm]
            # The truth is the model on the values as published, converted to cm.
            scores = [logistic_score(v * _UNITS[unit], threshold_cm, width_cm) for v in values]
            return {
                "ids": ids,
                "unit": unit,
                "threshold_cm": threshold_cm,
                "width_cm": width_cm,
                "values": values,
                "scores": scores,
            }
        table = {c: float(np.round(rng.uniform(0.05, 0.95), 4)) for c in _CODES}
        codes = [str(rng.choice(_CODES)) for _ in ids]
        # Most codes carry the trap (upper case, padding): a pipeline that skips the
        # card's normalization misses most cases, not a lucky few.
        noisy = [
            (" " * int(rng.integers(0, 2))) + (c.upper() if rng.random() < 0.5 else c)
            for c in codes
        ]
        return {"ids": ids, "table": table, "codes": noisy, "scores": [table[c] for c in codes]}

    def make_task(self, track: str, seed: int, split: Split) -> Task:  # noqa: D102
        self.spec.track(track)
        d = self._draw(track, seed)
        card = (
            f"Task ({track}): score every case in data/cases.csv with the model in model/model.json "
            "and submit outputs/submission.csv. Read TASK.md and task.json first."
        )
        return self.new_task(track, seed, split, card=card, params={"cases": len(d["ids"])})

    def write_public_files(self, task: Task, dest: Path) -> None:  # noqa: D102
        d = self._draw(task.track, task.seed)
        (dest / "data").mkdir()
        (dest / "model").mkdir()
        schema = {"columns": ["id", "score"], "score_decimals": 4, "case_ids": d["ids"]}
        if task.track == "threshold":
            rows = [{"id": i, "value": v} for i, v in zip(d["ids"], d["values"], strict=True)]
            (dest / "data" / "cases.csv").write_text(_csv(rows, ["id", "value"]))
            model = {
                "kind": "logistic",
                "threshold": d["threshold_cm"],
                "width": d["width_cm"],
                "unit": "cm",
            }
            meta = {"track": "threshold", "value_unit": d["unit"], "submission": schema}
            card = (
                "The model scores a case as 1 / (1 + exp(-(value - threshold) / width)), with the "
                "measurement, the threshold and the width all in centimetres, rounded to four "
                "decimals."
            )
        else:
            rows = [{"id": i, "code": c} for i, c in zip(d["ids"], d["codes"], strict=True)]
            (dest / "data" / "cases.csv").write_text(_csv(rows, ["id", "code"]))
            model = {"kind": "lookup", "table": d["table"]}
            meta = {"track": "lookup", "submission": schema}
            card = (
                "The model maps lower-case category codes, without surrounding spaces, to "
                "scores (four decimals)."
            )
        (dest / "model" / "model.json").write_text(json.dumps(model, indent=2))
        (dest / "model" / "MODEL_CARD.md").write_text(f"# Model card\n\n{card}\n")
        (dest / "task.json").write_text(json.dumps(meta, indent=2))
        (dest / "TASK.md").write_text(
            f"# {task.track} task\n\n{task.card}\n\nRequired artifacts per stage are listed in the stage skills.\n"
        )

    def private_answers(self, task: Task) -> dict[str, Any]:  # noqa: D102
        d = self._draw(task.track, task.seed)
        return {"scores": dict(zip(d["ids"], d["scores"], strict=True))}

    def reproduction_command(self, task: Task) -> str:
        """The shipped pipeline on every case, as the S4 instructions run it."""
        return "mkdir -p outputs && python pipeline/infer.py outputs/predictions.csv"

    def sandbox_requirements(self) -> SandboxRequirements:
        """numpy: the teacher's setup records its version."""
        return SandboxRequirements(modules=("numpy",), pip=("numpy",), debian=("python3-numpy",))

    def teacher_turns(self, task: Task, outcome: str = "success") -> list[TeacherTurn]:
        """The scripted careful engineer (see :mod:`~bat_gym.envs.toy_pipeline.teacher`).

        Args:
            task: the task.
            outcome: ``success``, ``recovery`` (the pipeline that misses the trap, caught
                by the S3 check and fixed) or ``failure`` (that pipeline, kept).
        """
        d = self._draw(task.track, task.seed)
        return teacher.teacher_turns(
            task.track,
            cases=len(d["ids"]),
            unit=d.get("unit", ""),
            outcome=outcome,
            trap_shows=self._trap_shows(task),
        )

    def repair_turns(self, task: Task, focus: str, outcome: str) -> list[TeacherTurn]:
        """The teacher's repair exercise from a row that starts with the mistaken pipeline.

        See :func:`~bat_gym.envs.toy_pipeline.teacher.repair_turns`.
        """
        return teacher.repair_turns(task.track, focus, outcome, trap_shows=self._trap_shows(task))

    def naive_turns(self, task: Task) -> list[TeacherTurn]:
        """A naive baseline: no plan and no pilot, and a pipeline that misses the trap.

        It takes the values as centimetres (the threshold track) or the codes as written
        (the lookup track), runs it on every case and submits: what an engineer who
        never validated would ship.
        """
        return teacher.naive_turns(task.track)

    def plan_facts(self, task: Task) -> tuple[PlanFact, ...]:
        """What only reading the task reveals: how many cases, and the track's pitfall.

        Each stated once and right: another count of cases, a unit the task does not
        use, or upper-case codes contradict the plan.
        """
        d = self._draw(task.track, task.seed)
        facts = [PlanFact.count("the number of cases", len(d["ids"]))]
        if task.track == "threshold":
            units = tuple(_UNITS)
            facts.append(
                PlanFact.choice("the unit the values are given in", d["unit"], units, kind="unit")
            )
            facts.append(
                PlanFact.choice("the model's unit", "cm", units, kind="unit", also=(r"\bcentimet",))
            )
        else:
            facts.append(
                PlanFact(
                    "that codes must be lower-cased",
                    (r"lower[- ]?case", r"\.lower\(\)"),
                    (r"upper[- ]?case", r"\.upper\(\)"),
                    kind="letter case",
                    value="lower-case",
                )
            )
        return tuple(facts)

    def numeric_tolerance(self, task: Task) -> dict[str, Tolerance]:
        """Scores agree within :data:`AGREEMENT`, as the task metric grants."""
        return {"score": Tolerance(atol=AGREEMENT)}

    def task_score(self, task: Task, workspace: FrozenWorkspace) -> float:
        """Share of cases whose submitted score agrees with the model's.

        Over every case id of the task; 0 when the file is missing or garbled and
        when any case is missing (see :func:`score_agreement`).
        """
        truth = self.private_answers(task)["scores"]
        return score_agreement(workspace, SUBMISSION, truth, complete=True)

    def pilot_score(self, task: Task, workspace: FrozenWorkspace, pilot_path: str) -> float:
        """Share of the pilot's rows whose score agrees with the model's for that case."""
        truth = self.private_answers(task)["scores"]
        return score_agreement(workspace, pilot_path, truth, complete=False)

    def _trap_cases(self, task: Task) -> list[str]:
        """The cases whose score the track's trap changes (possibly none)."""
        d = self._draw(task.track, task.seed)
        if task.track == "threshold":
            return [
                case
                for case, value, score in zip(d["ids"], d["values"], d["scores"], strict=True)
                if abs(logistic_score(value, d["threshold_cm"], d["width_cm"]) - score) > AGREEMENT
            ]
        return [
            case
            for case, code in zip(d["ids"], d["codes"], strict=True)
            if code != code.strip().lower()
        ]

    def _trap_shows(self, task: Task) -> bool:
        return bool(self._trap_cases(task))

    def risky_cases(self, task: Task) -> frozenset[str]:
        """The cases whose score the track's trap changes, or every case where it changes none.

        Threshold: a value read as centimetres whatever its unit scores otherwise
        (beyond :data:`AGREEMENT`); none does when the unit is cm, or where the
        logistic saturates. Lookup: a code written other than lower-case without
        spaces, which the table lacks as written.
        """
        risky = self._trap_cases(task)
        return frozenset(risky or self._draw(task.track, task.seed)["ids"])

    def pilot_figure(
        self, task: Task, workspace: FrozenWorkspace, pilot_path: str, case: str
    ) -> PilotFigure:
        """The S3 check's figure on ``case``: the input as the model reads it.

        Threshold: ``value_cm``, the case's value in centimetres (within 1e-4 cm).
        Lookup: ``model_code``, the case's code normalized as the card says. Either
        way the check passes when the pilot's score for the case is the card's score
        of that figure (within :data:`AGREEMENT`). ``value`` is None for a case the
        task does not have.
        """
        d = self._draw(task.track, task.seed)
        name = "value_cm" if task.track == "threshold" else "model_code"
        if case not in d["ids"]:
            return PilotFigure(name, None, False)
        k = d["ids"].index(case)
        value: float | str = (
            d["values"][k] * _UNITS[d["unit"]]
            if task.track == "threshold"
            else d["codes"][k].strip().lower()
        )
        got = _pilot_scores(workspace, pilot_path).get(case)
        passed = got is not None and abs(got - d["scores"][k]) <= AGREEMENT
        return PilotFigure(name, value, passed, tolerance=1e-4)
