"""MedBench-Lite's reference hooks: ``files_agree`` and ``reproduction_command``.

The rubric compares an agent's output files with the reference run's through
``Benchmark.files_agree``: the same values in another encoding agree, anything else
(another value, another grid, an unreadable file) does not, and nothing raises. The
reproduction command runs the shipped pipeline again on every case and must give the
teacher's predictions back, without crediting outputs the episode left.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import time
import zlib

import numpy as np
import pytest

from bat_gym.bank import task_states
from bat_gym.bank.tasks import success_threshold
from bat_gym.core.protocol import get_protocol
from bat_gym.core.sandbox import BlobStore, WorkspaceIndex
from bat_gym.env import StageEnv
from bat_gym.envs.medbench_lite import agreement
from bat_gym.envs.medbench_lite.formats import nifti_bytes
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reference import reference_workspace, reproduce
from bat_gym.rubrics.verifier.reward import RubricReward
from bat_gym.rubrics.verifier.scoring import overall_score

HERMES = get_protocol("hermes")
PRED = "outputs/predictions.csv"

# An affine like the tasks' inputs: a non-RAS+ voxel order, anisotropic voxels and an
# origin offset, with float32-representable entries (NIfTI stores them as float32).
AFFINE = np.array(
    [
        [-5.25, 0.0, 0.0, 112.375],
        [0.0, 0.0, 5.5, -80.125],
        [0.0, -4.75, 0.0, 60.5],
        [0.0, 0.0, 0.0, 1.0],
    ]
)


def _nifti(data, affine=AFFINE, *, gz=True, cls=None, qform_only=False, level=6):
    import nibabel as nib

    cls = cls or nib.Nifti1Image
    img = cls(data, affine)
    if qform_only:
        img.set_sform(None, code=0)
        img.set_qform(affine, code=1)
    else:
        img.set_sform(affine, code=1)
        img.set_qform(affine, code=1)
    raw = img.to_bytes()
    return gzip.compress(raw, compresslevel=level, mtime=0) if gz else raw


def _written_like_the_teacher(data):
    """What the teacher's pipelines write: nib.save of a Nifti1Image to .nii.gz."""
    return _nifti(data, gz=True)


@pytest.fixture(scope="module")
def labels():
    rng = np.random.default_rng(0)
    lab = np.zeros((12, 10, 8), dtype=np.uint8)
    lab[3:9, 2:8, 1:6] = 1
    lab[5:7, 4:6, 2:4] = 2
    lab[rng.random(lab.shape) < 0.02] = 1
    return lab


@pytest.fixture(scope="module")
def hu64():
    """Float64 output of a model, in HU (values on both sides of zero)."""
    rng = np.random.default_rng(1)
    return rng.normal(0.0, 300.0, size=(16, 16, 3)) + np.linspace(-1000, 1000, 16)[:, None, None]


# -- files_agree: label masks ------------------------------------------------------------


def test_label_masks_agree_in_any_encoding(labels):
    import nibabel as nib

    ref = _written_like_the_teacher(labels)
    same = {
        "uncompressed .nii": _nifti(labels, gz=False),
        "another gzip level": _nifti(labels, level=1),
        "two gzip members": gzip.compress(_nifti(labels, gz=False)[:200], mtime=0)
        + gzip.compress(_nifti(labels, gz=False)[200:], mtime=0),
        "int16 on disk": _nifti(labels.astype(np.int16)),
        "float32 on disk": _nifti(labels.astype(np.float32)),
        "big-endian": _nifti(labels.astype(">i2")),
        "NIfTI-2": _nifti(labels, cls=nib.Nifti2Image),
        "qform only": _nifti(labels, qform_only=True),
        "scaled: stored 2x, slope 0.5": nifti_bytes(
            (labels * 2).astype(np.uint8), AFFINE, slope=0.5
        ),
    }
    for name, mine in same.items():
        assert mine != ref, name
        assert agreement.files_agree("nifti_label_mask", mine, ref), name


def test_label_masks_disagree_when_anything_but_the_encoding_differs(labels):
    ref = _written_like_the_teacher(labels)
    one_voxel = labels.copy()
    one_voxel[0, 0, 0] = 2
    shifted = AFFINE.copy()
    shifted[0, 3] += 1e-3
    rotated = AFFINE.copy()
    rotated[:3, :3] = rotated[:3, :3] * (1 + 1e-5)
    plain = _nifti(labels, gz=False)
    bomb = gzip.compress(plain + b"\x00" * (64 << 20), mtime=0)  # 64 MiB of padding
    different = {
        "one voxel relabelled": _nifti(one_voxel),
        "a label off by 0.001 (float storage)": _nifti(labels.astype(np.float32) + 1e-3),
        "origin 1 micron off": _nifti(labels, shifted),
        "voxel size 1e-5 off": _nifti(labels, rotated),
        "transposed": _nifti(np.ascontiguousarray(labels.transpose(1, 0, 2))),
        "with a 4th axis": _nifti(labels[..., None]),
        "the reference's other cases (empty)": _nifti(np.zeros_like(labels)),
        "truncated gzip": ref[: len(ref) // 2],
        "truncated data": plain[: len(plain) - 10],
        "gzip bomb": bomb,
        "not NIfTI": b"not a volume",
        "empty": b"",
        "a PNG": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,
        "complex voxels": _nifti(labels.astype(np.complex64)),
    }
    for name, mine in different.items():
        start = time.perf_counter()
        assert not agreement.files_agree("nifti_label_mask", mine, ref), name
        assert time.perf_counter() - start < 5, name


# -- files_agree: float volumes ----------------------------------------------------------


def test_float_volumes_agree_in_any_encoding_of_the_same_numbers(hu64):
    import nibabel as nib

    ref32 = hu64.astype(np.float32)
    ref = _written_like_the_teacher(ref32)
    same = {
        "float64 storage of the float32 values": _nifti(ref32.astype(np.float64)),
        "the float64 values before the cast": _nifti(hu64),
        "uncompressed": _nifti(ref32, gz=False),
        "big-endian float32": _nifti(ref32.astype(">f4")),
        "NIfTI-2": _nifti(ref32, cls=nib.Nifti2Image),
    }
    for name, mine in same.items():
        assert agreement.files_agree("nifti_image", mine, ref), name
    # The label rule does not apply to float outputs, and exact copies always agree.
    assert agreement.files_agree("nifti_image", ref, ref)


def test_float_volumes_disagree_beyond_the_tolerance(hu64):
    ref32 = hu64.astype(np.float32)
    ref = _written_like_the_teacher(ref32)
    scale = float(np.abs(ref32).max())
    one = ref32.copy()
    one[3, 4, 1] += 0.01  # 1e-2 HU: ten times the absolute allowance (about 1e-3 HU)
    nan = ref32.copy()
    nan[0, 0, 0] = np.nan
    quantized = np.rint(hu64).astype(np.int16)  # int16 HU: a lossy encoding
    different = {
        "one voxel 0.01 HU off": _nifti(one),
        "every voxel 1e-5 relative off": _nifti(ref32 * (1 + 1e-5)),
        "a constant 2e-6 x max|ref| offset": _nifti(ref32 + 2e-6 * scale),
        "a NaN": _nifti(nan),
        "quantized to int16 HU": _nifti(quantized),
        "the input, undenoised": _nifti((hu64 + 50).astype(np.float32)),
    }
    for name, mine in different.items():
        assert not agreement.files_agree("nifti_image", mine, ref), name


def test_the_float_tolerance_is_what_the_module_documents(hu64):
    ref32 = hu64.astype(np.float32)
    ref = _written_like_the_teacher(ref32)
    scale = float(np.abs(ref32.astype(np.float64)).max())
    inside = ref32.astype(np.float64) + 0.9e-6 * scale  # within the max|ref| allowance
    assert agreement.FLOAT_RTOL == 1e-6
    assert agreement.files_agree("nifti_image", _nifti(inside), ref)


def test_a_reference_stored_as_unscaled_integers_is_compared_exactly(labels):
    ref = _nifti(labels.astype(np.int16))
    assert agreement.files_agree("nifti_image", _nifti(labels.astype(np.float32)), ref)
    nudged = labels.astype(np.float64) + 1e-9
    assert not agreement.files_agree("nifti_image", _nifti(nudged), ref)
    # Scaled integers are float values: the tolerance applies.
    scaled = nifti_bytes(labels.astype(np.int16) + 1000, AFFINE, slope=0.25, inter=-250.0)
    values = (labels.astype(np.float64) + 1000) * 0.25 - 250.0
    assert agreement.files_agree("nifti_image", _nifti(values * (1 + 1e-7)), scaled)


# -- files_agree: JSON detections --------------------------------------------------------

DETECTIONS = {"id": "img_0042", "boxes": [[12, 30, 20, 41, 0.8731], [40, 5, 47, 13, 0.51]]}


def _teacher_json(obj):
    return json.dumps(obj).encode()  # the pipeline's json.dump(..., f)


def test_detections_agree_in_any_json_formatting():
    ref = _teacher_json(DETECTIONS)
    floats = {
        "id": DETECTIONS["id"],
        "boxes": [[float(v) for v in b] for b in DETECTIONS["boxes"]],
    }
    same = {
        "indented": json.dumps(DETECTIONS, indent=2).encode(),
        "keys sorted the other way": json.dumps(
            {"boxes": DETECTIONS["boxes"], "id": DETECTIONS["id"]}
        ).encode(),
        "coordinates as floats": json.dumps(floats).encode(),
        "exponent notation": ref.replace(b"0.51", b"5.1e-1"),
        "a BOM and a trailing newline": b"\xef\xbb\xbf" + ref + b"\n",
        "unicode-escaped id": ref.replace(b"img_0042", b"img\\u005f0042"),
    }
    for name, mine in same.items():
        assert mine != ref, name
        assert agreement.files_agree("json_boxes", mine, ref), name


def test_detections_disagree_when_a_value_differs():
    ref = _teacher_json(DETECTIONS)

    def variant(**change):
        return json.dumps({**DETECTIONS, **change}).encode()

    b = DETECTIONS["boxes"]
    deep = b"[" * 100_000 + b"]" * 100_000
    different = {
        "a coordinate off by one": variant(boxes=[[13, 30, 20, 41, 0.8731], b[1]]),
        "a score 1e-6 off": variant(boxes=[[12, 30, 20, 41, 0.8731 + 1e-6], b[1]]),
        "(row, col) order": variant(boxes=[[30, 12, 41, 20, 0.8731], [5, 40, 13, 47, 0.51]]),
        "boxes reordered": variant(boxes=[b[1], b[0]]),
        "a box dropped": variant(boxes=[b[0]]),
        "another id": variant(id="img_0043"),
        "an extra key": variant(source="model"),
        "a coordinate as a string": variant(boxes=[["12", 30, 20, 41, 0.8731], b[1]]),
        "true for 1": variant(boxes=[[12, 30, 20, 41, 0.8731], [40, 5, 47, 13, True]]),
        "a duplicate key": ref[:-1] + b', "id": "img_0042"}',
        "not JSON": b"{id: img_0042}",
        "not UTF-8": b'{"id": "\xff", "boxes": []}',
        "nested 100k deep": deep,
        "empty": b"",
    }
    for name, mine in different.items():
        assert not agreement.files_agree("json_boxes", mine, ref), name


# -- files_agree: text reports and through the benchmark ---------------------------------


def test_reports_are_compared_byte_for_byte():
    ref = b"CASE: chest_0007\nFINDINGS:\n- Nodule: right upper lobe, 12.4 mm.\n"
    assert agreement.files_agree("text_report", ref, ref)
    assert not agreement.files_agree("text_report", ref.replace(b"12.4", b"12.5"), ref)
    assert not agreement.files_agree("text_report", ref + b"\n", ref)


def test_the_benchmark_dispatches_on_the_tracks_output_kind(bench, labels):
    seg = bench.make_task("segmentation", 0, "train")
    det = bench.make_task("detection", 0, "train")
    ref = _written_like_the_teacher(labels)
    plain = _nifti(labels, gz=False)
    assert bench.files_agree(seg, "outputs/masks/x.nii", plain, ref)
    assert not bench.files_agree(det, "outputs/detections/x.nii", plain, ref)  # bytes there
    js = _teacher_json(DETECTIONS)
    assert bench.files_agree(
        det, "outputs/detections/x.json", json.dumps(DETECTIONS, indent=1).encode(), js
    )
    assert not bench.files_agree(
        seg, "outputs/masks/x.json", json.dumps(DETECTIONS, indent=1).encode(), js
    )
    # A reference that does not decode as its kind is compared as bytes, never raising.
    assert not agreement.files_agree("nifti_label_mask", b"a", b"b")
    assert not agreement.files_agree("json_boxes", b"[1]", b"not json")


def test_the_reproduction_command_names_the_tasks_cases_and_the_tracks_output_dir(bench):
    for track, out_dir in (
        ("segmentation", "outputs/masks"),
        ("classification", "outputs"),
        ("detection", "outputs/detections"),
        ("enhancement", "outputs/denoised"),
        ("synthesis", "outputs/synth"),
        ("vqa", "outputs"),
        ("report", "outputs/reports"),
    ):
        task = bench.make_task(track, 0, "train")
        cmd = bench.reproduction_command(task)
        draw = bench.draw(track, 0, "train")
        ids = draw.case_ids
        # Where the task tells the agent to put per-case files, if it has any.
        assert draw.task_json["output"].get("dir", "outputs") == out_dir, track
        assert json.dumps(list(ids)) in cmd, track
        assert f'"outputs/predictions.csv", "{out_dir}")' in cmd, track
        assert "rm -rf outputs validation" in cmd and "task.json" not in cmd.split("<<")[1]
    with pytest.raises(ValueError):
        agreement.reproduction_command(["a"], "outputs; rm -rf /")


# -- reproduction, on the teacher's own workspace ----------------------------------------


def _rows(ws: FrozenWorkspace, path: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(ws.read_bytes(path).decode())))


def _stub_workspace(ws: FrozenWorkspace, pipeline: str, store: BlobStore) -> FrozenWorkspace:
    """``ws`` with its pipeline/infer.py replaced by ``pipeline``, in ``store``."""
    with ws.as_directory() as d:
        (d / "pipeline" / "infer.py").write_text(pipeline)
        snap = WorkspaceIndex(d).capture(store)
    return FrozenWorkspace(snap, store)


@pytest.mark.slow
@pytest.mark.parametrize("track", ["segmentation", "detection"])
def test_the_reproduction_regenerates_the_teachers_predictions(bench, track, tmp_path):
    task = bench.make_task(track, 1, "train")
    teacher = reference_workspace(bench, task)  # the teacher's success workflow, played
    assert teacher is not None
    again = reproduce(bench, task, teacher, (PRED,))
    assert again is not None and again.sha256(PRED) is not None
    mine, theirs = _rows(again, PRED), _rows(teacher, PRED)
    assert [r["id"] for r in mine] == list(bench.draw(track, 1, "train").case_ids)
    file_col = {"segmentation": "mask_file", "detection": "detections_file"}[track]
    for m, t in zip(mine, theirs, strict=True):
        assert {k: v for k, v in m.items() if k != file_col} == {
            k: v for k, v in t.items() if k != file_col
        }
        assert bench.files_agree(
            task, m[file_col], again.read_bytes(m[file_col]), teacher.read_bytes(t[file_col])
        )

    # A shipped pipeline that only points at the episode's outputs gets no credit: the
    # reproduction removes them before it runs.
    stub = (
        "import csv, shutil\n"
        "def run(ids, out_csv, out_dir):\n"
        "    shutil.copy('validation/pilot.csv', out_csv)\n"
    )
    store = BlobStore(tmp_path / "store")
    cheat = _stub_workspace(teacher, stub, store)
    assert reproduce(bench, task, cheat, (PRED,)).sha256(PRED) is None
    stale = (
        "import csv, os\n"
        f"ROWS = {theirs!r}\n"
        "def run(ids, out_csv, out_dir):\n"
        "    with open(out_csv, 'w', newline='') as f:\n"
        "        w = csv.DictWriter(f, fieldnames=list(ROWS[0]), lineterminator='\\n')\n"
        "        w.writeheader(); w.writerows(ROWS)\n"
    )
    again = reproduce(bench, task, _stub_workspace(teacher, stale, store), (PRED,))
    assert again.sha256(PRED) is not None  # the CSV is there, the files it names are not
    assert all(again.sha256(r[file_col]) is None for r in _rows(again, PRED))


def test_a_module_at_the_workspace_root_is_not_on_the_reproductions_import_path(bench, tmp_path):
    """Only what the pipeline declares is importable: a json.py beside the frozen
    pipeline's folder, at the root, would otherwise stand in for the standard library's
    (the import-path shadow) in the verifier's own run."""
    task = bench.make_task("classification", 1, "train")
    teacher = reference_workspace(bench, task)
    assert teacher is not None
    store = BlobStore(tmp_path / "store")
    with teacher.as_directory() as d:
        (d / "json.py").write_text("raise SystemExit('the shadow was imported')\n")
        shadowed = FrozenWorkspace(WorkspaceIndex(d).capture(store), store)
    again = reproduce(bench, task, shadowed, (PRED,))
    assert again is not None and "json.py" not in again.read
    assert again.read_bytes(PRED) == teacher.read_bytes(PRED)


# -- a teacher E2E episode still earns full credit ---------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "track",
    ["segmentation", "enhancement", "detection", "report"],
)
def test_a_heldout_teacher_e2e_episode_passes_every_reference_guard(bench, track, tmp_path):
    seed = bench.seeds("heldout")[0]
    source = task_states(bench, [(track, seed)], "heldout", BlobStore(tmp_path / "store"))
    env = RubricReward(StageEnv("E2E", benchmark=bench, states=source))
    try:
        env.reset(options={"state_id": source.select(track=track)[0]})
        task = bench.make_task(track, seed, "heldout")
        for turn in bench.teacher_turns(task):
            _, _, terminated, truncated, info = env.step(
                HERMES.render(turn.content, list(turn.calls))
            )
            if terminated or truncated:
                break
        verdict = info["verdict"]
    finally:
        env.close()
    items = {(s.stage, i.id): i for s in verdict.stages for i in s.items}
    for key in (
        ("S3", "pilot_is_model_output"),
        ("S3", "pipeline_reproduces"),
        ("S4", "predictions_are_model_outputs"),
        ("S4", "pipeline_reproduces"),
        ("S5", "submission_is_model_output"),
    ):
        assert items[key].passed is True, (key, items[key].detail)
    overall = overall_score(verdict.task_score, verdict.stage_score, bench.spec)
    failed = [(k, i.detail) for k, i in items.items() if i.passed is False]
    # Admitted as a success: at least 0.95 of what a correct run earns on this task.
    assert verdict.stage_score == 1.0, failed
    assert overall >= success_threshold(bench, task), failed


def test_unreadable_inputs_never_raise():
    for kind in ("nifti_label_mask", "nifti_image", "json_boxes", "text_report", None):
        for mine in (b"", b"\x1f\x8b", zlib.compress(b"x"), b"\x00" * 348):
            assert agreement.files_agree(kind, mine, b"\x1f\x8b garbage") is False
