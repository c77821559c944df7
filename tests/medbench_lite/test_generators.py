import gzip
import io
import json

import nibabel as nib
import numpy as np
import pydicom
import pytest
from PIL import Image

from bat_gym.core.sandbox import WorkspaceIndex
from bat_gym.envs.medbench_lite.tracks import TRACKS, get_track

from .conftest import TRACKS as NAMES


def public_files(bench, task, tmp_path):
    dest = tmp_path / task.task_id
    dest.mkdir()
    bench.write_public_files(task, dest)
    return dest, {
        str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()
    }


def decode(path: str, data: bytes):
    """The pixel/voxel array of an image file, or None for other files."""
    if path.endswith(".nii.gz"):
        return nib.Nifti1Image.from_bytes(gzip.decompress(data)).get_fdata()
    if path.endswith(".dcm"):
        return pydicom.dcmread(io.BytesIO(data)).pixel_array
    if path.endswith(".png"):
        return np.asarray(Image.open(io.BytesIO(data)))
    return None


@pytest.mark.parametrize("track", NAMES)
def test_same_seed_same_bytes_and_another_seed_differs(bench, track, tmp_path):
    a = bench.make_task(track, 11, "train")
    _, files_a = public_files(bench, a, tmp_path)
    # A fresh generator (no cache) must give the same bytes.
    fresh = get_track(track).draw(11, "train")
    assert all(files_a[p] == b for p, b in fresh.files.items())
    b = bench.make_task(track, 12, "train")
    _, files_b = public_files(bench, b, tmp_path)
    assert files_a != files_b
    assert a.task_id != b.task_id and str(a.seed) not in a.task_id


@pytest.mark.parametrize("track", NAMES)
def test_public_files_open_with_their_readers_and_follow_the_schema(bench, track, tmp_path):
    task = bench.make_task(track, 3, "train")
    dest, files = public_files(bench, task, tmp_path)
    opened = [p for p, data in files.items() if decode(p, data) is not None]
    assert opened, "no image files"
    meta = json.loads(files["task.json"])
    sub = meta["submission"]
    assert (
        sub["columns"][0] == "id"
        and sub["case_ids"]
        and len(set(sub["case_ids"])) == len(sub["case_ids"])
    )
    assert meta["track"] == track and "output" in meta and "inputs" in meta
    assert meta["artifacts"]["S3"] == ["validation/pilot.csv", "validation/s3_validation.json"]
    for name in ("model/weights.npz", "model/MODEL_CARD.md", "model/infer_lib.py", "TASK.md"):
        assert name in files
    np.load(io.BytesIO(files["model/weights.npz"]))
    compile(files["model/infer_lib.py"], "infer_lib.py", "exec")
    # The first thing the teacher reads must fit one tool observation (2,048 characters).
    assert len(files["TASK.md"]) < 1900 and len(files["model/MODEL_CARD.md"]) < 1900
    assert task.params == bench.make_task(track, 3, "train").params
    assert WorkspaceIndex(dest).scan().digest == WorkspaceIndex(dest).scan().digest


def test_nifti_dicom_png_specifics(bench):
    seg = bench.draw("segmentation", 5, "train")
    codes = {
        "".join(nib.aff2axcodes(nib.Nifti1Image.from_bytes(gzip.decompress(b)).affine))
        for p, b in seg.files.items()
    }
    assert codes - {"RAS"}, "segmentation always has a non-RAS+ volume"
    cls = bench.draw("classification", 5, "train")
    dss = [pydicom.dcmread(io.BytesIO(b)) for b in cls.files.values()]
    assert {d.PhotometricInterpretation for d in dss} == {"MONOCHROME1", "MONOCHROME2"}
    assert len({(float(d.RescaleSlope), float(d.RescaleIntercept)) for d in dss}) > 1
    assert len({d.SOPInstanceUID for d in dss}) == len(dss)
    enh = bench.draw("enhancement", 5, "train")
    img = nib.Nifti1Image.from_bytes(gzip.decompress(next(iter(enh.files.values()))))
    assert img.get_data_dtype() == np.uint16 and img.dataobj.inter == -1024
    vqa = bench.draw("vqa", 5, "train")
    conv = {
        Image.open(io.BytesIO(b)).text["ViewConvention"]
        for p, b in vqa.files.items()
        if p.endswith(".png")
    }
    assert conv == {"radiological", "neurological"}


def test_splits_are_disjoint_in_seeds_and_in_parameters(bench):
    spec = bench.spec
    assert not spec.splits.train.overlaps(spec.splits.heldout)
    assert spec.splits.heldout_repeats == 10
    for tr in TRACKS:
        train, held = tr.ranges["train"], tr.ranges["heldout"]
        assert set(train) == set(held) and train
        for name in train:
            (a, b), (c, d) = train[name], held[name]
            assert b < c or d < a, (
                f"{tr.name}.{name}: train {train[name]} overlaps held-out {held[name]}"
            )
        for split, seeds in (("train", range(0, 4)), ("heldout", bench.seeds("heldout")[:4])):
            for seed in seeds:
                params = bench.draw(tr.name, seed, split).params
                for name, (lo, hi) in tr.ranges[split].items():
                    assert lo <= params[name] <= hi, (tr.name, split, seed, name, params[name])
    with pytest.raises(ValueError, match="not in the train range"):
        bench.make_task("vqa", spec.splits.heldout.start, "train")
    assert bench.make_task("vqa", spec.splits.heldout.start, "heldout").tier == 1


def _arrays(files):
    return [a for p, b in files.items() if (a := decode(p, b)) is not None]


@pytest.mark.parametrize("track", NAMES)
def test_private_answers_never_appear_in_public_files(bench, track, tmp_path):
    task = bench.make_task(track, 7, "train")
    _, files = public_files(bench, task, tmp_path)
    ans = bench.private_answers(task)
    text = "\n".join(
        b.decode("utf-8", "replace")
        for p, b in files.items()
        if not p.endswith((".gz", ".dcm", ".png", ".npz"))
    )
    assert all(
        k not in p.lower() for p in files for k in ("answer", "label", "truth", "gt_", "mask")
    )
    arrays = _arrays(files)
    if track == "segmentation":
        for lab in ans["labels"].values():
            assert not any(a.shape == lab.shape and np.array_equal(a, lab) for a in arrays)
    elif track == "classification":
        for cid, lab in ans["labels"].items():
            assert f"{cid},{lab}" not in text and f'"{cid}": {lab}' not in text
        for b in files.values():
            if b[128:132] == b"DICM":
                ds = pydicom.dcmread(io.BytesIO(b))
                assert not any(
                    "opac" in str(el.value).lower() for el in ds if el.keyword != "PixelData"
                )
    elif track == "detection":
        for boxes in ans["boxes"].values():
            for box in boxes:
                assert json.dumps(box) not in text
        assert all(
            not Image.open(io.BytesIO(b)).text for p, b in files.items() if p.endswith(".png")
        )
    elif track == "enhancement":
        for clean in ans["clean"].values():
            # The public stack is the noisy one: far from the clean reference everywhere.
            assert not any(a.shape == clean.shape and np.abs(a - clean).mean() < 5 for a in arrays)
    elif track == "synthesis":
        assert not any(p.startswith("data/test/") and "_B" in p for p in files)
        for b in ans["b"].values():
            for a in arrays:
                if a.shape == b.shape:
                    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] < 0.99
    elif track == "vqa":
        for line in files["data/questions.jsonl"].decode().splitlines():
            assert "answer" not in json.loads(line)
    elif track == "report":
        for findings in ans["findings"].values():
            for lobe, size in findings:
                assert f"{lobe}, {size}" not in text
        meta = files["data/metadata.json"].decode()
        assert "lobe" not in meta and "mm" not in meta
