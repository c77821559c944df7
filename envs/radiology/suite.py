"""The radiology benchmark: lesion growth across a patient's current and prior studies.

Two tracks. ``lesion_growth``: each task is two or three synthetic patients
(:mod:`.studies`), each with a current and a prior study of the same kind (CT chest or
MR brain). ``nodule_dx``: two or three patients, each with a current and a prior chest
radiograph (DX), measured in 2-D. The studies sit on the env's
own Orthanc server (:mod:`.service`), reached through typed DICOM tools
(:mod:`.tools`), and are also exported under ``data/dicom/<patient>/<date>/<series>/``
for the pipeline. The provided measurement model (``model/measure.py``) turns a
lesion mask into an equivalent-sphere diameter (``measure_2d``: an equivalent-circle
diameter for a radiograph); the submission is, per patient, the current and prior
diameters (mm, one decimal) and the change.

Traps a validated pipeline catches and a naive one does not: CT stored values are not
Hounsfield units until the header's rescale is applied, and on MR the lesion is
measured on T2, which the echo time says; in a mislabelled study the series
descriptions are swapped. On a radiograph the header's spacing is the detector's and
must be divided by the magnification, and a ``MONOCHROME1`` image (every current
radiograph in the hard tier) stores the lesion dark: it is inverted before the
threshold.

What the agent stores on the server through the tools is scored by :mod:`.checks`.
The provided model is a real file (``models/measure.py``, :mod:`.models`) that tasks ship
and the verifier imports; the code the teacher and the naive baseline run in the
sandbox is in real files too (``scripts/``, read by :mod:`.sandbox_code`); the turns
that run it are in :mod:`.teacher`, and how a submission is compared with the model's
measurements is in :mod:`.agreement`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bat_gym.benchmark import Benchmark, PilotFigure, PlanFact, Split, TeacherTurn, Tolerance
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.spec import BenchmarkSpec, Budgets, SeedRange, Splits, Stage, Task, Track
from bat_gym.envs.radiology import teacher
from bat_gym.envs.radiology.agreement import (
    AGREEMENT_MM,
    COLUMNS,
    agreement,
    read_rows,
    row_agrees,
)
from bat_gym.envs.radiology.models import measure_source
from bat_gym.envs.radiology.studies import (
    PatientSpec,
    StudySpec,
    _uid,
    make_patient,
    render_patient,
    render_series,
)

if TYPE_CHECKING:
    from bat_gym.core.tools import Tool
    from bat_gym.envs.radiology.service import OrthancService
    from bat_gym.rubrics.contract.model import ContractLibrary
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["Radiology", "MEASURE_PY", "SUBMISSION"]

SUBMISSION = "outputs/submission.csv"
CHANGE_MM = 2.0  # a diameter difference within this is "stable"

CONTRACTS = Path(__file__).with_name("contracts")
"""Radiology's own contracts: S5 and the E2E that pins it (see ``contract_library``)."""

# The provided model's source, as written to model/measure.py; the verifier imports the
# same file (models/measure.py).
MEASURE_PY = measure_source()

MODEL = {
    "CT": {"threshold": 60.0, "units": "HU"},
    "MR": {"sequence": "T2", "threshold": 800.0},
    "DX": {"threshold": 2200.0, "units": "displayed (MONOCHROME2) values", "measure": "measure_2d"},
}

MODEL_CARD = """# Model card: lesion diameter

`model/measure.py` gives a lesion's equivalent-sphere diameter (mm) from a volume in
modality units. Thresholds are in `model/model.json`:

* CT: the threshold is in Hounsfield units. Stored pixel values become HU through the
  header's rescale: `HU = stored * RescaleSlope + RescaleIntercept`.
* MR: measure on the T2-weighted series only (long echo time, TE > 60 ms). Series
  descriptions are typed by hand and are not always right; the acquisition
  parameters are.

Stack a series' slices in InstanceNumber order; the spacing is
(SliceThickness, PixelSpacing row, PixelSpacing column).

* DX (chest radiographs, one frame): measure with `measure_2d` on displayed values. A
  `MONOCHROME1` image stores bright anatomy as low values: use
  `2 ** BitsStored - 1 - stored` first. The header's `ImagerPixelSpacing` is the
  spacing at the detector; at the patient it is divided by
  `EstimatedRadiographicMagnificationFactor`.
"""

SKILLS = {
    "S1": (
        "Read task.json, TASK.md and the model card. Look at the studies on the DICOM server "
        "(find_studies, list_series, series_metadata) and in data/dicom. Write plan/plan.md with "
        "'## Preprocess', '## Inference', '## Postprocess': which series you will measure for each "
        "patient and how you will check it."
    ),
    "S2": (
        "Record the environment in setup/environment.json (python, numpy and pydicom versions). "
        "Write pipeline/infer.py: it reads data/dicom and model/, and writes a CSV with columns "
        "id,diameter_mm,prior_mm,change for the patient ids given after the output path (all "
        "patients when none)."
    ),
    "S3": (
        "Run pipeline/infer.py on ONE patient and check the result against the images (the header "
        "rescale, the series the card asks for, a radiograph's photometry and spacing; measure_roi "
        "and get_slice help); pilot a patient whose current study holds one of these traps. Fix "
        "the pipeline if the pilot is wrong. Save validation/pilot.csv and the receipt "
        'validation/s3_validation.json {"stage": "S3", "artifact": "validation/pilot.csv", '
        '"sha256": <its sha256>, "check": {"case": <the patient>, "name": "volume_mm3" (on a '
        'radiograph "area_mm2"), "value": <the lesion\'s size on the current study as the card '
        'reads it, mm^3 or mm^2 at the patient>, "passed": <whether the pilot\'s row is the '
        "card's>}}."
    ),
    "S4": (
        "Run the validated pipeline on every patient into outputs/predictions.csv. Write the receipt "
        "validation/s4_completion.json with its sha256 and the number of patients."
    ),
    "S5": (
        "Write outputs/submission.csv in the schema of task.json and its receipt "
        "validation/s5_submission.json. On the server, for each patient's current study: mark "
        "the lesion on the series you measured (store_annotation: its slice, a centre voxel on "
        "the lesion, the diameter) and submit the finding (submit_finding: that series, the "
        "submitted diameter and change). The server keeps every record: store only right ones."
    ),
}

# id, name, agentic weight, and the artifacts the stage's contract reads.
_STAGES = (
    ("S1", "Plan", 0.25, ("plan/plan.md",)),
    ("S2", "Setup", 0.15, ("setup/environment.json", "pipeline/infer.py")),
    ("S3", "Validate", 0.35, ("validation/pilot.csv", "validation/s3_validation.json")),
    ("S4", "Infer", 0.15, ("outputs/predictions.csv", "validation/s4_completion.json")),
    ("S5", "Submit", 0.10, ("outputs/submission.csv", "validation/s5_submission.json")),
)

SPEC = BenchmarkSpec(
    name="radiology",
    version="0.3",
    description="Lesion growth across current and prior CT/MR studies on a live Orthanc server.",
    stages=tuple(
        Stage(id=sid, name=name, weight=weight, skill=SKILLS[sid], artifacts=artifacts)
        for sid, name, weight, artifacts in _STAGES
    ),
    tracks=(
        Track(
            name="lesion_growth",
            metric="diameter_agreement",
            description="Current and prior lesion diameters and the change, per patient.",
        ),
        Track(
            name="nodule_dx",
            metric="diameter_agreement",
            description=(
                "Current and prior nodule diameters on chest radiographs (magnification, "
                "MONOCHROME1), and the change, per patient."
            ),
        ),
    ),
    budgets=Budgets(max_turns=32, max_tool_calls=40),
    splits=Splits(
        train=SeedRange(start=0, stop=10_000), heldout=SeedRange(start=2_000_000, stop=2_000_100)
    ),
    default_priority=-10,
)


def _measure_fns() -> tuple[Any, Any]:
    """``measure`` and ``measure_2d`` of the provided model (the file the task ships)."""
    from bat_gym.envs.radiology.models.measure import measure, measure_2d

    return measure, measure_2d


def _trapped(study: StudySpec) -> bool:
    """Whether a careless reading measures ``study`` wrong (see ``Radiology.risky_cases``)."""
    return (
        study.kind == "ct_chest"
        or study.mislabelled
        or study.inverted
        or study.magnification != 1.0
    )


def _change(current: float, prior: float) -> str:
    if current - prior > CHANGE_MM:
        return "larger"
    if prior - current > CHANGE_MM:
        return "smaller"
    return "stable"


def _volume(files: list[bytes]) -> tuple[np.ndarray, tuple[float, float, float], Any]:
    """A series as the model card reads it: (slices, rows, cols) values, spacing, header.

    A radiograph is one slice of displayed values (``MONOCHROME1`` inverted) at the
    patient's spacing (the detector's over the magnification); its slice spacing is 0.
    """
    import pydicom

    dss = sorted(
        (pydicom.dcmread(io.BytesIO(f)) for f in files), key=lambda d: int(d.InstanceNumber)
    )
    if dss[0].Modality == "DX":
        ds = dss[0]
        image = ds.pixel_array.astype(np.float64)
        if ds.PhotometricInterpretation == "MONOCHROME1":
            image = (2 ** int(ds.BitsStored) - 1) - image
        magnification = float(ds.get("EstimatedRadiographicMagnificationFactor", 1))
        dy, dx = (float(v) / magnification for v in ds.ImagerPixelSpacing)
        return image[None], (0.0, dy, dx), ds
    vol = np.stack(
        [
            d.pixel_array * float(d.get("RescaleSlope", 1)) + float(d.get("RescaleIntercept", 0))
            for d in dss
        ]
    )
    first = dss[0]
    spacing = (float(first.get("SliceThickness", 1)), *(float(v) for v in first.PixelSpacing))
    return vol, spacing, first  # type: ignore[return-value]


def _lesion_size(vol: np.ndarray, spacing: tuple[float, float, float], threshold: float) -> float:
    """The lesion's volume (mm^3) on a series, or its area (mm^2) on a radiograph.

    The voxels above ``threshold`` (modality units) times a voxel's size; a
    radiograph's slice spacing is 0, so its pixels count by their area at the patient.
    """
    dz, dy, dx = spacing
    return float((vol > threshold).sum()) * (dz or 1.0) * dy * dx


class Radiology(Benchmark):
    """The radiology benchmark (see the module docs)."""

    spec = SPEC
    outcomes = teacher.OUTCOMES

    def __init__(self) -> None:
        super().__init__()
        # (track, task seed) -> _truth: the scorer, the oracle and the teacher all ask.
        self._truth_cache: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}

    # -- generation ---------------------------------------------------------------------

    def _patients(self, track: str, task_seed: int) -> list[tuple[int, PatientSpec]]:
        if track == "nodule_dx":
            rng = np.random.default_rng([task_seed, 8])
            # Odd task seeds are the hard tier: every current radiograph is MONOCHROME1.
            return [
                (seed, make_patient(seed, "dx_chest", prior=True, inverted=task_seed % 2 == 1))
                for seed in (task_seed * 10 + 5 + i for i in range(int(rng.integers(2, 4))))
            ]
        rng = np.random.default_rng([task_seed, 7])
        n = int(rng.integers(2, 4))
        first = int(rng.integers(0, 2))
        out = []
        for i in range(n):
            seed = task_seed * 10 + i
            # Both kinds in every task, so each task holds both traps' kinds of study.
            kind = ("mr_brain", "ct_chest")[(first + i) % 2]
            # Odd task seeds are the hard tier: every MR study there is mislabelled.
            out.append((seed, make_patient(seed, kind, prior=True, mislabelled=task_seed % 2 == 1)))
        return out

    def _files(self, track: str, task_seed: int) -> dict[str, dict[str, dict[int, list[bytes]]]]:
        """Patient id -> study date -> series number -> instance bytes."""
        files: dict[str, dict[str, dict[int, list[bytes]]]] = {}
        for seed, patient in self._patients(track, task_seed):
            for study in patient.studies:
                for series in study.series:
                    files.setdefault(patient.patient_id, {}).setdefault(study.date, {})[
                        series.number
                    ] = render_series(patient, study, series, seed)
        return files

    def _truth(self, track: str, task_seed: int) -> dict[str, dict[str, Any]]:
        """Per patient: the model's diameters and change, and where it measured.

        ``study_uid`` and ``series_uid`` name the current study and the series the
        model card measures there (the CT, the MR series whose echo time says T2, or
        the radiograph);
        ``current_series`` every series of the current study; ``lesion_voxels`` lists
        the measured series' lesion voxels as the model sees them
        (modality values above the threshold), ``[slice, row, col]`` with the slice
        1-based in instance order, as the tools count it; ``lesion_size`` is their
        volume (mm^3), or a radiograph's area at the patient (mm^2): S3's check figure.
        """
        cached = self._truth_cache.get((track, task_seed))
        if cached is not None:
            return cached
        measure, measure_2d = _measure_fns()
        files = self._files(track, task_seed)
        truth = {}
        for _seed, patient in self._patients(track, task_seed):
            pid = patient.patient_id
            measured = []  # (study, series number, volume, spacing, threshold), oldest first
            for study in patient.studies:
                for series in study.series:
                    vol, spacing, first = _volume(files[pid][study.date][series.number])
                    if first.Modality in ("CT", "DX"):
                        threshold = MODEL[first.Modality]["threshold"]
                    elif float(first.EchoTime) > 60:
                        threshold = MODEL["MR"]["threshold"]
                    else:
                        continue
                    measured.append((study, series.number, vol, spacing, threshold))
            (_, _, p_vol, p_spacing, p_thr), (study, number, vol, spacing, thr) = measured
            if len(study.series) == 1 and study.series[0].modality == "DX":
                current = measure_2d(vol[0], spacing[1:], thr)
                prior = measure_2d(p_vol[0], p_spacing[1:], p_thr)
            else:
                current, prior = measure(vol, spacing, thr), measure(p_vol, p_spacing, p_thr)
            truth[pid] = {
                "diameter_mm": current,
                "prior_mm": prior,
                "change": _change(current, prior),
                "study_uid": study.uid,
                "series_uid": _uid("series", study.uid, number),
                "current_series": [_uid("series", study.uid, s.number) for s in study.series],
                "lesion_voxels": [
                    [int(k) + 1, int(r), int(c)] for k, r, c in np.argwhere(vol > thr)
                ],
                "lesion_size": _lesion_size(vol, spacing, thr),
            }
        if len(self._truth_cache) >= 64:
            self._truth_cache.clear()
        self._truth_cache[(track, task_seed)] = truth
        return truth

    def make_task(self, track: str, seed: int, split: Split) -> Task:  # noqa: D102
        self.spec.track(track)
        n = len(self._patients(track, seed))
        card = (
            f"Task ({track}): for each of the {n} patients in task.json, measure the lesion on the "
            "current and the prior study with the provided model and submit outputs/submission.csv. "
            "The studies are on the DICOM server and in data/dicom. Read TASK.md and task.json first."
        )
        return self.new_task(
            track, seed, split, tier=2 if seed % 2 else 1, card=card, params={"cases": n}
        )

    def write_public_files(self, task: Task, dest: Path) -> None:  # noqa: D102
        files = self._files(task.track, task.seed)
        for pid, studies in files.items():
            for date, series in studies.items():
                for number, instances in series.items():
                    d = dest / "data" / "dicom" / pid / date / str(number)
                    d.mkdir(parents=True)
                    for k, data in enumerate(instances, 1):
                        (d / f"{k:04d}.dcm").write_bytes(data)
        (dest / "model").mkdir()
        (dest / "model" / "measure.py").write_text(MEASURE_PY)
        (dest / "model" / "model.json").write_text(json.dumps(MODEL, indent=2))
        (dest / "model" / "MODEL_CARD.md").write_text(MODEL_CARD)
        ids = sorted(files)
        meta = {
            "track": task.track,
            "patients": ids,
            "layout": "data/dicom/<patient>/<study date>/<series number>/<instance>.dcm",
            "submission": {"columns": COLUMNS, "case_ids": ids, "decimals": 1},
            "change": f"larger or smaller when the diameters differ by more than {CHANGE_MM} mm, else stable",
        }
        (dest / "task.json").write_text(json.dumps(meta, indent=2))
        (dest / "TASK.md").write_text(
            f"# {task.track} task\n\n{task.card}\n\nRequired artifacts per stage are listed in the stage skills.\n"
        )

    def private_answers(self, task: Task) -> dict[str, Any]:  # noqa: D102
        return {"patients": self._truth(task.track, task.seed)}

    # -- service and tools ----------------------------------------------------------------

    def make_service(self) -> OrthancService:
        """A private Orthanc (started on the env's first reset)."""
        from bat_gym.envs.radiology.service import OrthancService

        return OrthancService()

    def service_blobs(self, task: Task) -> dict[str, bytes]:
        """Every study of the task's patients, as the server stores them."""
        blobs: dict[str, bytes] = {}
        for seed, patient in self._patients(task.track, task.seed):
            blobs.update(render_patient(patient, seed))
        return blobs

    def tools(self) -> tuple[Tool, ...]:
        """The typed DICOM tools (:mod:`bat_gym.envs.radiology.tools`)."""
        from bat_gym.envs.radiology.tools import dicom_tools

        return dicom_tools()

    def sandbox_requirements(self) -> SandboxRequirements:
        """Numpy and pydicom: the pipeline reads DICOM."""
        return SandboxRequirements(
            modules=("numpy", "pydicom"),
            pip=("numpy", "pydicom"),
            debian=("python3-numpy", "python3-pydicom"),
        )

    # -- scoring --------------------------------------------------------------------------

    def reproduction_command(self, task: Task) -> str:
        """The shipped pipeline on every patient, as S4 runs it."""
        return "mkdir -p outputs && python pipeline/infer.py outputs/predictions.csv"

    def task_score(self, task: Task, workspace: FrozenWorkspace) -> float:
        """Share of patients whose row agrees with the model on both studies and the change."""
        return agreement(workspace, SUBMISSION, self._truth(task.track, task.seed), complete=True)

    def pilot_score(self, task: Task, workspace: FrozenWorkspace, pilot_path: str) -> float:
        """The same agreement over the pilot's rows."""
        return agreement(workspace, pilot_path, self._truth(task.track, task.seed), complete=False)

    def numeric_tolerance(self, task: Task) -> dict[str, Tolerance]:
        """Diameters agree within :data:`AGREEMENT_MM` (mm), as the task metric grants."""
        return {col: Tolerance(atol=AGREEMENT_MM) for col in ("diameter_mm", "prior_mm")}

    def risky_cases(self, task: Task) -> frozenset[str]:
        """The patients whose current study holds a trap that changes the measurement.

        A CT (stored values are not HU until the rescale; every CT has one), a
        mislabelled MR study (the description names the wrong series), a radiograph
        (its spacing is the detector's, magnified; a ``MONOCHROME1`` one stores the
        lesion dark). A prior study carries the same traps or fewer (mislabelling and
        ``MONOCHROME1`` are the current study's), so the current study decides. An MR
        study labelled right is not risky: a pipeline that trusts the description
        measures it right. Every patient where none is.
        """
        risky = [
            patient.patient_id
            for _seed, patient in self._patients(task.track, task.seed)
            if _trapped(patient.studies[-1])
        ]
        return frozenset(risky or (p.patient_id for _s, p in self._patients(task.track, task.seed)))

    def pilot_figure(
        self, task: Task, workspace: FrozenWorkspace, pilot_path: str, case: str
    ) -> PilotFigure:
        """S3's check figure on patient ``case``: the lesion's size as the model card reads it.

        ``volume_mm3`` (lesion_growth): the lesion's volume on the current study's
        measured series, the voxels above the model's threshold (in HU for CT, on the
        T2 series for MR) times the voxel volume, in mm^3. ``area_mm2`` (nodule_dx):
        the lesion's area on the current radiograph (inverted when ``MONOCHROME1``) at
        the patient (the detector spacing over the magnification), in mm^2. Either
        takes reading the study right to know, and a careless reading gets it wrong;
        within 0.01 (the receipt's rounding). The check passes when the pilot's row
        for ``case`` agrees with the model's (both diameters and the change). ``value``
        is None for a patient the task does not have.
        """
        name = "area_mm2" if task.track == "nodule_dx" else "volume_mm3"
        want = self._truth(task.track, task.seed).get(case)
        if want is None:
            return PilotFigure(name, None, False)
        row = (read_rows(workspace, pilot_path) or {}).get(case)
        passed = row is not None and row_agrees(row, want)
        return PilotFigure(name, want["lesion_size"], passed, tolerance=0.01)

    def plan_facts(self, task: Task) -> tuple[PlanFact, ...]:
        """The number of patients, and what each kind of study needs.

        Another count of patients contradicts the plan.
        """
        n = len(self._patients(task.track, task.seed))
        count = PlanFact.count("the number of patients", n, "patients")
        if task.track == "nodule_dx":
            return (
                count,
                PlanFact("inverting MONOCHROME1 radiographs", (r"MONOCHROME1",)),
                PlanFact("the spacing at the patient", (r"magnification",)),
            )
        return (
            count,
            PlanFact("the CT rescale to HU", (r"rescale", r"\bHU\b", r"hounsfield")),
            PlanFact("measuring MR on T2 by echo time", (r"echo time", r"\bTE\b")),
        )

    def contract_library(self) -> ContractLibrary:
        """The reference contracts, with S5 (and the E2E that pins it) radiology's own.

        S1 to S4 are the reference contracts themselves, not copies, so every change
        to them reaches radiology as it reaches the other suites; radiology's
        ``contracts/`` holds only what differs: S5, which also asks for the findings
        and marks on the server, and the E2E contract that composes it. A reference
        stage re-versioned without radiology's E2E pin following fails here, loudly.
        """
        from bat_gym.envs.radiology import checks  # noqa: F401 - registers the S5 checks
        from bat_gym.rubrics.contract.model import ContractLibrary, load_contract

        own = [load_contract(p) for p in sorted(CONTRACTS.glob("*.yaml"))]
        mine = {c.id for c in own}
        return ContractLibrary(
            [*(c for c in ContractLibrary.reference() if c.id not in mine), *own]
        )

    # -- teacher --------------------------------------------------------------------------

    def teacher_turns(self, task: Task, outcome: str = "success") -> list[TeacherTurn]:
        """The scripted careful engineer (see :mod:`~bat_gym.envs.radiology.teacher`).

        Args:
            task: the task.
            outcome: ``success``, ``recovery`` (the naive pipeline, caught by the S3
                check and fixed) or ``failure`` (that pipeline, kept and submitted).
        """
        return teacher.teacher_turns(
            task.track,
            self._patients(task.track, task.seed),
            self._truth(task.track, task.seed),
            outcome,
            trap_shows=self._trap_shows(task),
        )

    def repair_turns(self, task: Task, focus: str, outcome: str) -> list[TeacherTurn]:
        """The teacher's repair exercise from a row that starts with the naive pipeline.

        See :func:`~bat_gym.envs.radiology.teacher.repair_turns`.
        """
        return teacher.repair_turns(
            task.track,
            self._patients(task.track, task.seed),
            self._truth(task.track, task.seed),
            focus,
            outcome,
            trap_shows=self._trap_shows(task),
        )

    def _trap_shows(self, task: Task) -> bool:
        """Whether some patient's current study holds a trap (see :meth:`risky_cases`)."""
        return any(_trapped(p.studies[-1]) for _s, p in self._patients(task.track, task.seed))

    def naive_turns(self, task: Task) -> list[TeacherTurn]:
        """No plan and no pilot; a pipeline that trusts descriptions and stored values."""
        return teacher.naive_turns()
