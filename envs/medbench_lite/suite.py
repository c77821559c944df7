"""MedBenchLite: the :class:`~bat_gym.benchmark.Benchmark` over the seven tracks."""

from __future__ import annotations

import json
from collections import OrderedDict
from itertools import permutations, product
from pathlib import Path
from typing import Any

from bat_gym.benchmark import Benchmark, PilotFigure, PlanFact, Split, TeacherTurn
from bat_gym.core.sandbox.requirements import SandboxRequirements
from bat_gym.core.spec import Task
from bat_gym.envs.medbench_lite import agreement, pilot_checks, teacher
from bat_gym.envs.medbench_lite.formats import npz_bytes
from bat_gym.envs.medbench_lite.models import model_source
from bat_gym.envs.medbench_lite.spec import SPEC
from bat_gym.envs.medbench_lite.tracks import get_track
from bat_gym.envs.medbench_lite.tracks.base import STAGE_ARTIFACTS, Draw, read_rows
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

__all__ = ["MedBenchLite", "SANDBOX_REQUIREMENTS"]

_CACHE_SIZE = 16

SANDBOX_REQUIREMENTS = SandboxRequirements(
    # What the teacher's pipelines, the task cards and the skills use; the model files
    # (model/infer_lib.py) are numpy only. For docker, numpy and Pillow come from Debian
    # bookworm. nibabel and pydicom are pure Python and come from this interpreter, at
    # the versions local runs: bookworm's pydicom is 2.3, without pydicom.pixels (new in
    # 3), and its python3-nibabel depends on scipy, which pulls in gcc and boost (an
    # image of about 1 GB instead of 300 MB).
    modules=("numpy", "nibabel", "pydicom", "pydicom.pixels", "PIL"),
    pip=("numpy", "nibabel>=5", "pydicom>=3.0", "Pillow>=10"),
    debian=("python3-numpy", "python3-pil"),
    from_host=("nibabel", "packaging", "importlib_resources", "typing_extensions", "pydicom"),
)


# Every orientation code (one letter of each axis pair, in any order) but the model's
# RAS; upper-case only, so that words such as "air" or "lip" are no codes.
_OTHER_ORIENTATIONS = tuple(
    code
    for axes in permutations(("LR", "AP", "SI"))
    for code in ("".join(letters) for letters in product(*axes))
    if code != "RAS"
)

# The convention each track's model card plants, as a plan that read the card states it,
# and where the convention has other values, those values as its rivals.
_PLAN_FACTS: dict[str, tuple[PlanFact, ...]] = {
    "segmentation": (
        PlanFact(
            "the orientation the model wants",
            (r"(?-i:\bRAS\b)\+?", r"as_closest_canonical"),
            (rf"(?-i:\b(?:{'|'.join(_OTHER_ORIENTATIONS)})\b)",),
            kind="orientation",
            value="RAS+",
        ),
    ),
    "classification": (
        PlanFact("the MONOCHROME1 inversion", (r"MONOCHROME1", r"invert")),
        PlanFact("the modality rescale", (r"rescale", r"modality[_ ]lut")),
    ),
    "detection": (
        PlanFact(
            "the model's (row, col) box order",
            (r"\(row, ?col\)", r"row[- ]col\b", r"x ?= ?col"),
            (r"\((?:x, ?y|col, ?row|column, ?row)\)", r"col(?:umn)?[- ]row\b"),
            kind="box order",
            value="(row, col)",
        ),
    ),
    "enhancement": (PlanFact("the HU window the model wants", (r"-1000", r"\bwindow\b")),),
    "synthesis": (
        PlanFact(
            "the per-scan normalization",
            (r"\b95(?:th)? ?percentile",),
            (r"\b(?!95\D)\d+(?:\.\d+)?(?:st|nd|rd|th)? ?percentile", r"min[- ]max", r"z-?score"),
            kind="normalization",
            value="95th percentile",
        ),
    ),
    "vqa": (PlanFact("the display convention", (r"radiological", r"neurological", r"convention")),),
    "report": (PlanFact("the voxel spacing", (r"spacing", r"zooms", r"anisotrop")),),
}


class MedBenchLite(Benchmark):
    """MedBench-Lite: synthetic imaging tasks generated on the spot from a seed.

    Draws are cached (the last few tasks) because one episode asks for the same task's
    files, answers and score several times; a draw is a pure function of its key.
    """

    spec = SPEC
    outcomes = ("success", "recovery", "failure")
    # The reproduction command deletes validation/ before it runs (agreement.py): its
    # notes cannot change what the pipeline computes, so a stage that only adds notes
    # reuses the previous stage's reproduction.
    reproduction_omits = ("validation/",)

    def __init__(self) -> None:
        self._draws: OrderedDict[tuple[str, int, str, int | None], Draw] = OrderedDict()

    def draw(self, track: str, seed: int, split: Split, max_cases: int | None = None) -> Draw:
        """The generated task (files and answers) for ``(track, seed, split)``.

        Args:
            track: the track name.
            seed: the generator seed.
            split: ``train`` or ``heldout``.
            max_cases: keep only the first this many cases (an E2E surrogate); None:
                the full task.
        """
        key = (track, seed, split, max_cases)
        if key in self._draws:
            self._draws.move_to_end(key)
            return self._draws[key]
        if max_cases is None:
            d = get_track(track).draw(seed, split)
        else:
            d = get_track(track).reduce(self.draw(track, seed, split), max_cases)
        self._draws[key] = d
        while len(self._draws) > _CACHE_SIZE:
            self._draws.popitem(last=False)
        return d

    def _task_draw(self, task: Task) -> Draw:
        reduction = task.params.get("reduction") or {}
        return self.draw(task.track, task.seed, task.split, reduction.get("max_cases"))

    # -- Benchmark API ----------------------------------------------------------------

    def make_task(self, track: str, seed: int, split: Split) -> Task:  # noqa: D102
        self.spec.track(track)
        rng = self.spec.splits.train if split == "train" else self.spec.splits.heldout
        if seed not in rng:
            raise ValueError(f"seed {seed} is not in the {split} range {rng.start}..{rng.stop - 1}")
        d = self.draw(track, seed, split)
        return self.new_task(
            track,
            seed,
            split,
            tier=0 if split == "train" else 1,
            card=get_track(track).card(),
            params=dict(d.params),
        )

    def reduce_task(self, task: Task, *, max_cases: int) -> Task | None:
        """``task`` with only its first ``max_cases`` cases: an E2E surrogate.

        Same seed and generator; the public files, ``task.json`` case ids, private
        answers and score all see the same cases. The reduction is recorded in
        ``params["reduction"]``, the tier is 1 and the task id differs from the full
        task's.

        Input size is not reduced. A track draws its input geometry (the image side
        ``image_px``, the volume shape or voxel spacing) from the task's random stream
        before it draws the cases, and in the 2D tracks the side is one of the
        parameters whose train and held-out ranges are disjoint. A capped size would
        change every later draw, so the surrogate's cases would no longer be the full
        task's first cases, and the pixel spacing, lesion sizes and checks tied to the
        drawn geometry would have to follow in each of the seven generators. Training
        inputs are already small (60 to 100 px images, volumes of about 40 x 50 x 20
        voxels); fewer cases is what shortens a surrogate episode.
        The other surrogate limit, validation passes, is a limit on the trajectory,
        not on the task; the Stage Bank records and checks it.

        Raises:
            ValueError: ``max_cases`` is below 1, or ``task`` is already reduced.
        """
        self.check_reducible(task, max_cases)
        d = self.draw(task.track, task.seed, task.split, max_cases)
        return self.reduced_task(task, max_cases, d.params)

    def write_public_files(self, task: Task, dest: Path) -> None:  # noqa: D102
        dest = Path(dest)
        d = self._task_draw(task)
        tr = get_track(task.track)
        for rel, data in sorted(d.files.items()):
            p = dest / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        (dest / "model").mkdir(exist_ok=True)
        (dest / "model" / "weights.npz").write_bytes(npz_bytes(d.weights))
        (dest / "model" / "infer_lib.py").write_text(model_source(task.track), encoding="utf-8")
        (dest / "model" / "MODEL_CARD.md").write_text(d.model_card, encoding="utf-8")
        meta = {
            "benchmark": self.spec.name,
            "version": self.spec.version,
            "task_id": task.task_id,
            "track": task.track,
            "metric": tr.metric,
            **{k: v for k, v in d.task_json.items() if k != "submission"},
            "model": {
                "weights": "model/weights.npz",
                "card": "model/MODEL_CARD.md",
                "entry_point": "model/infer_lib.py",
            },
            "artifacts": {s: list(a) for s, a in STAGE_ARTIFACTS.items()},
            "receipt": {
                "schema_version": 1,
                "fields": ["schema_version", "stage", "artifact", "sha256"],
            },
            "submission": {"file": "outputs/submission.csv", **d.task_json["submission"]},
        }
        (dest / "task.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (dest / "TASK.md").write_text(_task_md(task, d), encoding="utf-8")

    def private_answers(self, task: Task) -> dict[str, Any]:  # noqa: D102
        return dict(self._task_draw(task).answers)

    def sandbox_requirements(self) -> SandboxRequirements:
        """numpy, nibabel, pydicom (3, for ``pydicom.pixels``) and Pillow."""
        return SANDBOX_REQUIREMENTS

    def teacher_turns(self, task: Task, outcome: str = "success") -> list[TeacherTurn]:
        """The scripted careful engineer for ``task``.

        Args:
            task: the task.
            outcome: ``success``; ``recovery`` (the track's realistic mistake is made,
                caught by the S3 quality check and fixed); ``failure`` (the mistake
                is made and a shape-only check lets it through).
        """
        return teacher.teacher_turns(get_track(task.track).recipe(), outcome)

    def teacher_stages(self, track: str, outcome: str) -> tuple[str, ...]:
        """The stages of :meth:`teacher_turns`: they follow the track's recipe, not the data."""
        return tuple(t.stage for t in teacher.teacher_turns(get_track(track).recipe(), outcome))

    def repair_turns(self, task: Task, focus: str, outcome: str) -> list[TeacherTurn]:
        """The teacher's repair exercise from a row that starts with the buggy pipeline.

        ``[]`` for other rows; see :func:`~bat_gym.envs.medbench_lite.teacher.repair_turns`.
        """
        return teacher.repair_turns(get_track(task.track).recipe(), focus, outcome)

    # -- reference outputs ------------------------------------------------------------

    def plan_facts(self, task: Task) -> tuple[PlanFact, ...]:
        """The number of cases, and the convention the track's model card plants.

        Each stated once and right: another count of cases, or another value of the
        convention where it has others (an orientation code, a box order, a
        normalization), contradicts the plan.
        """
        cases = len(self._task_draw(task).case_ids)
        return (PlanFact.count("the number of cases", cases), *_PLAN_FACTS.get(task.track, ()))

    def reproduction_command(self, task: Task) -> str:
        """The shipped ``pipeline/infer.py`` on every case, as the teacher's S4 runs it.

        ``infer.run(ids, "outputs/predictions.csv", out_dir)`` (the calling convention
        the S2 skill asks for) with the task's case ids and the track's per-case
        output directory (``outputs/masks``, ``outputs/detections``, ...; ``outputs``
        for the tracks without per-case files), after removing the episode's
        ``outputs/`` and ``validation/``: see
        :func:`~bat_gym.envs.medbench_lite.agreement.reproduction_command`.
        """
        return agreement.reproduction_command(
            self._task_draw(task).case_ids, get_track(task.track).recipe().out_dir
        )

    def files_agree(self, task: Task, path: str, mine: bytes, reference: bytes) -> bool:
        """Decoded values, not bytes: NIfTI by shape, affine and voxels; JSON by value.

        Label masks must be voxel for voxel equal, float volumes within ``1e-6``
        (relative to the voxel and to the volume's largest magnitude), JSON numbers
        within ``1e-9`` relative; text reports byte for byte. An unreadable file
        disagrees. See :mod:`bat_gym.envs.medbench_lite.agreement`.
        """
        kind = self._task_draw(task).task_json.get("output", {}).get("kind")
        return agreement.files_agree(kind, mine, reference)

    def naive_turns(self, task: Task) -> list[TeacherTurn]:
        """A naive baseline: no validation, the model's output in its default convention."""
        return teacher.naive_turns(get_track(task.track).recipe())

    def task_score(self, task: Task, workspace: FrozenWorkspace) -> float | None:
        """The track metric of the frozen submission, in ``[0, 1]``.

        The track readers need real files (NIfTI, DICOM, PNG), so the frozen snapshot is
        written to a private directory first. A missing or malformed submission, or one
        missing a case, scores 0.0.
        """
        with workspace.as_directory() as directory:
            return self.score_directory(task, directory)

    def score_directory(self, task: Task, workspace_dir: Path) -> float | None:
        """The track metric of the submission in a plain directory, in ``[0, 1]``."""
        return get_track(task.track).score(self._task_draw(task), Path(workspace_dir))

    def pilot_score(self, task: Task, workspace: FrozenWorkspace, pilot_path: str) -> float | None:
        """The track metric on the pilot's case(s) only, in ``[0, 1]``.

        The pilot CSV is read like a submission and its rows are scored with the task
        metric against the truth of the cases it names, which may be a test case or a
        worked example with a known answer (a training pair, a dev question). A pilot
        that is missing, malformed or names anything else scores 0.0.
        """
        with workspace.as_directory() as directory:
            return get_track(task.track).pilot_score(self._task_draw(task), directory, pilot_path)

    def pilot_reference_score(
        self,
        task: Task,
        reference: FrozenWorkspace,
        workspace: FrozenWorkspace,
        pilot_path: str,
    ) -> float | None:
        """The reference run's track metric on the case(s) the agent's pilot names.

        Its submission's rows (or, for a worked example, its own pilot's) for those
        ids, scored like a pilot; None when the pilot is unusable or names a case the
        reference has no row for. See
        :meth:`TrackBase.pilot_reference_score <bat_gym.envs.medbench_lite.tracks.base.TrackBase.pilot_reference_score>`.
        """
        with reference.as_directory() as ref_dir, workspace.as_directory() as directory:
            return get_track(task.track).pilot_reference_score(
                self._task_draw(task), ref_dir, directory, pilot_path
            )

    def risky_cases(self, task: Task) -> frozenset[str] | None:
        """The cases where the track's planted mistake shows (see :mod:`.pilot_checks`)."""
        return pilot_checks.risky_cases(task.track, self._task_draw(task))

    def pilot_figure(
        self, task: Task, workspace: FrozenWorkspace, pilot_path: str, case: str
    ) -> PilotFigure | None:
        """The figure the track's S3 check measures on the pilot's ``case`` (see :mod:`.pilot_checks`).

        None for a track that declares no check.
        """
        d = self._task_draw(task)
        if pilot_checks.pilot_figure(task.track, d, Path("."), None, case) is None:
            return None
        with workspace.as_directory() as directory:
            rows = read_rows(Path(directory) / pilot_path, d.task_json["submission"]["columns"])
            return pilot_checks.pilot_figure(task.track, d, Path(directory), rows, case)


def _task_md(task: Task, d: Draw) -> str:
    stages = "\n".join(
        f"- {s.id} {s.name}: " + ", ".join(f"`{a}`" for a in s.artifacts) for s in SPEC.stages
    )
    return (
        f"# MedBench-Lite: {task.track}\n\n{d.task_md.strip()}\n\n"
        "## Stages and artifacts\n"
        f"{stages}\n\n"
        "`plan/plan.md` has the sections `## Preprocess`, `## Inference`, `## Postprocess`. "
        'Each receipt is JSON: `{"schema_version": 1, "stage": "S3", "artifact": "<path>", '
        '"sha256": "<real sha256 of the artifact>", ...}`.\n'
    )
