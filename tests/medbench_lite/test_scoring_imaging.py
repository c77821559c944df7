"""Scoring of the imaging and report tracks: no free credit, and never an exception.

Empty outputs earn nothing they did not earn (an empty mask on a lesion-free case, an
empty report on a normal study), and a non-finite or absurd value in a submission
gives a score in [0, 1] rather than an exception.
"""

import csv

import nibabel as nib
import numpy as np
import pytest

SEED = 4  # a training seed (easy tier)

OUTPUT = {
    "segmentation": ("mask_file", "outputs/masks", "data/images/{id}.nii.gz"),
    "enhancement": ("output_file", "outputs/denoised", "data/images/{id}.nii.gz"),
    "synthesis": ("output_file", "outputs/synth", "data/test/{id}_A.nii.gz"),
}


def _submit(ws, draw, rows):
    columns = draw.task_json["submission"]["columns"]
    (ws / "outputs").mkdir(exist_ok=True)
    with open(ws / "outputs" / "submission.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for cid in draw.case_ids:
            w.writerow({"id": cid, **rows.get(cid, {})})


def _volumes(bench, task, ws, fill):
    """One output per case on the input's grid, its voxels from ``fill(input)``."""
    draw = bench.draw(task.track, task.seed, task.split)
    bench.write_public_files(task, ws)
    col, out_dir, pattern = OUTPUT[task.track]
    rows = {}
    for cid in draw.case_ids:
        img = nib.load(str(ws / pattern.format(id=cid)))
        data = np.asarray(fill(img.get_fdata()), dtype=np.float64)
        out = nib.Nifti1Image(data, img.affine)
        (ws / out_dir).mkdir(parents=True, exist_ok=True)
        nib.save(out, str(ws / out_dir / f"{cid}.nii.gz"))
        rows[cid] = {col: f"{out_dir}/{cid}.nii.gz"}
    _submit(ws, draw, rows)
    return draw


FILLS = {
    "nan": lambda a: np.full(a.shape, np.nan),
    "inf": lambda a: np.full(a.shape, np.inf),
    "-inf": lambda a: np.full(a.shape, -np.inf),
    "1e300": lambda a: np.full(a.shape, 1e300),
    "-1e300": lambda a: np.full(a.shape, -1e300),
    "zeros": lambda a: np.zeros(a.shape),
    "one nan voxel": lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan, a),
    "huge outlier": lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, 1e308, a),
}


@pytest.mark.parametrize("track", sorted(OUTPUT))
@pytest.mark.parametrize("fill", sorted(FILLS))
def test_absurd_output_volumes_score_without_raising(bench, track, fill, tmp_path):
    task = bench.make_task(track, SEED, "train")
    _volumes(bench, task, tmp_path, FILLS[fill])
    score = bench.score_directory(task, tmp_path)
    assert score is not None and 0.0 <= score <= 1.0 and np.isfinite(score), (track, fill, score)
    if fill in ("nan", "inf", "-inf", "-1e300"):
        assert score == 0.0, (track, fill, score)
    if fill == "1e300":  # a finite constant: at most what any flat image earns
        assert score <= 0.1, (track, fill, score)


def test_an_empty_mask_earns_nothing_even_on_lesion_free_cases(bench, tmp_path):
    task = bench.make_task("segmentation", SEED, "train")
    _volumes(bench, task, tmp_path, lambda a: np.zeros(a.shape))
    assert bench.score_directory(task, tmp_path) == 0.0


def test_a_lesion_free_pilot_is_scored_on_the_liver_alone(bench, tmp_path):
    from bat_gym.envs.medbench_lite.tracks import get_track

    track = get_track("segmentation")
    for seed in range(40):
        draw = track.draw(seed, "train")
        free = [c for c in draw.case_ids if not (draw.answers["labels"][c] == 2).any()]
        if free:
            break
    cid = free[0]
    truth = draw.answers["labels"][cid]
    (tmp_path / "m").mkdir()
    nib.save(
        nib.Nifti1Image(truth.astype(np.uint8), draw.answers["affines"][cid]),
        str(tmp_path / "m/x.nii.gz"),
    )
    rows = {cid: {"mask_file": "m/x.nii.gz"}}
    assert track.score_cases(draw, tmp_path, rows, [cid]) == 1.0  # right, and earned
    spurious = truth.copy()
    spurious[tuple(np.argwhere(truth == 1)[0])] = 2  # one lesion voxel where there is none
    nib.save(nib.Nifti1Image(spurious, draw.answers["affines"][cid]), str(tmp_path / "m/x.nii.gz"))
    assert track.score_cases(draw, tmp_path, rows, [cid]) < 0.6
    nib.save(
        nib.Nifti1Image(np.zeros_like(truth), draw.answers["affines"][cid]),
        str(tmp_path / "m/x.nii.gz"),
    )
    assert track.score_cases(draw, tmp_path, rows, [cid]) == 0.0


def _reports(bench, task, ws, text):
    draw = bench.draw(task.track, task.seed, task.split)
    bench.write_public_files(task, ws)
    (ws / "outputs" / "reports").mkdir(parents=True, exist_ok=True)
    rows = {}
    for cid in draw.case_ids:
        (ws / "outputs" / "reports" / f"{cid}.txt").write_text(text(cid, draw))
        rows[cid] = {"report_file": f"outputs/reports/{cid}.txt", "n_findings": "0"}
    _submit(ws, draw, rows)
    return draw


@pytest.mark.parametrize(
    "text",
    ["", "garbage\x00\xff", "FINDINGS:\n", "FINDINGS:\nNothing to report.\n", "IMPRESSION: normal"],
)
def test_an_empty_or_unparseable_report_scores_zero_on_every_case(bench, text, tmp_path):
    task = bench.make_task("report", SEED, "train")
    _reports(bench, task, tmp_path, lambda cid, draw: text)
    assert bench.score_directory(task, tmp_path) == 0.0


def test_a_normal_study_needs_the_explicit_negative_finding(bench, tmp_path):
    from bat_gym.envs.medbench_lite.tracks import get_track

    track = get_track("report")
    for seed in range(40):
        draw = track.draw(seed, "train")
        normal = [c for c in draw.case_ids if not draw.answers["findings"][c]]
        if normal:
            break
    cid = normal[0]
    path = tmp_path / "r.txt"
    rows = {cid: {"report_file": "r.txt"}}
    path.write_text("FINDINGS:\n- No pulmonary nodules.\n")
    assert track.score_cases(draw, tmp_path, rows, [cid]) == 1.0
    path.write_text("FINDINGS:\n")
    assert track.score_cases(draw, tmp_path, rows, [cid]) == 0.0


@pytest.mark.parametrize(
    "size", ["1e400", "99999999999999999999999999999999999999999", "0", "0.0000001"]
)
def test_absurd_report_sizes_score_without_raising(bench, size, tmp_path):
    task = bench.make_task("report", SEED, "train")
    _reports(
        bench,
        task,
        tmp_path,
        lambda cid, draw: f"FINDINGS:\n- Nodule: right upper lobe, {size} mm.\n",
    )
    score = bench.score_directory(task, tmp_path)
    assert score is not None and 0.0 <= score <= 1.0
