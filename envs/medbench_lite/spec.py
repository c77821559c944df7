"""The MedBench-Lite :class:`~bat_gym.core.spec.BenchmarkSpec`: stages, skills, tracks, splits."""

from __future__ import annotations

from bat_gym.core.spec import BenchmarkSpec, Budgets, SeedRange, Splits, Track
from bat_gym.core.stages import reference_stages
from bat_gym.envs.medbench_lite.tracks import TRACKS
from bat_gym.envs.medbench_lite.tracks.base import STAGE_ARTIFACTS

__all__ = ["SKILLS", "SPEC", "TRAIN_SEEDS", "HELDOUT_SEEDS"]

TRAIN_SEEDS = SeedRange(start=0, stop=100_000)
HELDOUT_SEEDS = SeedRange(start=1_000_000, stop=1_000_100)

_RECEIPT = (
    'A receipt is JSON: {"schema_version": 1, "stage": "<id>", "artifact": "<path>", '
    '"sha256": "<the artifact\'s real sha256>", ...what was checked}.'
)

# Public stage skills: what a careful engineer does and what evidence the contract
# expects. They never name a task's answer or a track's trap.
SKILLS: dict[str, str] = {
    "S1": (
        "Read TASK.md, task.json and model/MODEL_CARD.md, and look at the inputs' headers "
        "(orientation, voxel spacing, intensity scaling, photometric interpretation, display "
        "conventions). Write plan/plan.md with three sections, '## Preprocess', '## Inference' and "
        "'## Postprocess': how inputs are read and brought into the model's documented input "
        "convention; how the model is called and how one case will be validated; how outputs are "
        "converted back (grid, coordinates, units) and written in task.json's schema. Name concrete "
        "files and checks."
    ),
    "S2": (
        "Record the environment in setup/environment.json (python and package versions). Open every "
        "input and record in setup/compatibility.json whether it is readable and which conventions it "
        "uses, next to what the model card requires. Pin the model in model/checkpoint.json (a receipt "
        "of model/weights.npz), load it and run it once on a tiny input (setup/model_load.json). Write "
        "pipeline/infer.py with run(ids, out_csv, out_dir): the model applied in its documented input "
        "convention, one output per case, and a CSV whose first column is id. " + _RECEIPT
    ),
    "S3": (
        "Run the pipeline on ONE real case into validation/pilot.csv. Pick the riskiest case (an unusual "
        "orientation or photometric interpretation, or one whose answer is known) and check the result "
        "with domain knowledge, not only shapes: anatomy on the expected side, plausible volumes and "
        "sizes, intensities in the expected range, boxes over the findings, answers that match worked "
        "examples. If the check fails, find the cause, fix the pipeline and rerun the pilot. Only then "
        "write validation/s3_validation.json, the receipt of pilot.csv with the case id and the checks "
        "with their values."
    ),
    "S4": (
        "Run the validated pipeline on every case id in task.json: outputs/predictions.csv (id first, "
        "one row per case) plus the per-case output files. Write validation/s4_completion.json, the "
        "receipt of predictions.csv with the counts of expected, completed and missing cases. Never drop "
        "a case: a missing case scores the task 0."
    ),
    "S5": (
        "Write outputs/submission.csv exactly in task.json's submission schema: the listed columns in "
        "order, id first, one row per listed case id, file paths relative to the workspace that open. "
        "Check the format first, then write validation/s5_submission.json, the receipt of "
        "submission.csv with the row count, the columns and whether the format is valid."
    ),
}

SPEC = BenchmarkSpec(
    name="medbench_lite",
    version="2.2",
    description=(
        "Seven synthetic medical-imaging tracks (NIfTI, DICOM, PNG) with five-stage workflows, "
        "a small numpy model per task, and a trap per track that only a real validation catches."
    ),
    stages=reference_stages(SKILLS, artifacts=STAGE_ARTIFACTS),
    tracks=tuple(Track(name=t.name, metric=t.metric, description=t.description) for t in TRACKS),
    budgets=Budgets(),
    splits=Splits(train=TRAIN_SEEDS, heldout=HELDOUT_SEEDS, heldout_repeats=10),
    default_priority=100,
)
