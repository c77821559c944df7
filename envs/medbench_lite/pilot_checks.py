"""The S3 check each MedBench-Lite track's teacher states, recomputed by the verifier.

Each track's pilot (``scripts/<track>/s3_pilot.py``) measures one domain figure on the
piloted case and states it in the S3 receipt (``"check": {"case", "name", "value",
"passed"}``); :func:`pilot_figure` computes the same figure on the frozen workspace,
outside the sandbox, from the task's inputs and the pilot's output files, and
:func:`risky_cases` names the cases where the track's planted mistake shows. A track
without an entry here declares no check (the ``pilot_checked`` items are null).

=============== ===================== ==================================================
track           figure (name)         risky cases
=============== ===================== ==================================================
segmentation    ``liver_side_mm``     volumes not stored in RAS+ order
enhancement     ``noise_reduction``   every stack (the trap returns any input unchanged)
synthesis       ``pearson_r``         the training pairs (their contrast B is known)
vqa             ``answer``            dev side questions on radiological images
detection       ``box_contrast``      images with a finding
=============== ===================== ==================================================
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from bat_gym.benchmark import PilotFigure
from bat_gym.envs.medbench_lite.tracks.base import Draw, read_output_volume, resolve_output

__all__ = ["pilot_figure", "risky_cases"]

Rows = Mapping[str, Mapping[str, str]]
FigureFn = Callable[[Draw, Path, Rows, str], PilotFigure]


def _nifti(data: bytes):  # noqa: ANN202 - nibabel is imported lazily
    import nibabel as nib

    return nib.Nifti1Image.from_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


# -- segmentation: the liver on the patient's right ------------------------------------


def _segmentation(draw: Draw, ws: Path, rows: Rows, case: str) -> PilotFigure:
    """World x of the liver's centre minus the body's (mm; RAS +x is the patient's right) > 20."""
    import nibabel as nib

    img = nib.load(str(ws / "data" / "images" / f"{case}.nii.gz"))
    out = read_output_volume(
        resolve_output(ws, rows[case].get("mask_file", "")), img.shape, img.affine
    )
    if out is None or not np.any(np.rint(out) > 0):
        return PilotFigure("liver_side_mm", None, False)

    def world_x(mask: np.ndarray) -> float:
        return float(nib.affines.apply_affine(img.affine, np.argwhere(mask))[:, 0].mean())

    side = world_x(np.rint(out) > 0) - world_x(img.get_fdata() > -500)
    return PilotFigure("liver_side_mm", side, side > 20, tolerance=0.06)


def _segmentation_risky(draw: Draw) -> frozenset[str]:
    import nibabel as nib

    stored = {
        c: "".join(nib.aff2axcodes(_nifti(draw.files[f"data/images/{c}.nii.gz"]).affine))
        for c in draw.case_ids
    }
    return frozenset(c for c, codes in stored.items() if codes != "RAS")


# -- enhancement: the noise drops ------------------------------------------------------


def _noise_hu(a: np.ndarray, body: np.ndarray) -> float:
    d = np.diff(a, axis=1)[body[:, 1:] & body[:, :-1]]
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def _enhancement(draw: Draw, ws: Path, rows: Rows, case: str) -> PilotFigure:
    """The noise (robust, of horizontal differences in the body) in over out, >= 1.5."""
    import nibabel as nib

    img = nib.load(str(ws / "data" / "images" / f"{case}.nii.gz"))
    hu = img.get_fdata()
    out = read_output_volume(
        resolve_output(ws, rows[case].get("output_file", "")), hu.shape, img.affine
    )
    if out is None:
        return PilotFigure("noise_reduction", None, False)
    body = (hu > -300) & (hu < 300)
    factor = _noise_hu(hu, body) / max(_noise_hu(out, body), 1e-6)
    return PilotFigure("noise_reduction", factor, factor >= 1.5, tolerance=0.006)


# -- synthesis: a training pair's contrast B -------------------------------------------


def _synthesis(draw: Draw, ws: Path, rows: Rows, case: str) -> PilotFigure:
    """Pearson r of the output with the pair's known contrast B in the head, > 0.8."""
    import nibabel as nib

    truth = ws / "data" / "train" / f"{case}_B.nii.gz"
    if not truth.is_file():
        return PilotFigure("pearson_r", None, False)
    b_img = nib.load(str(truth))
    b = b_img.get_fdata()
    pred = read_output_volume(
        resolve_output(ws, rows[case].get("output_file", "")), b.shape, b_img.affine
    )
    if pred is None:
        return PilotFigure("pearson_r", None, False)
    head = b > 0.1 * np.percentile(b, 99.5)
    p, g = pred[head] / max(pred[head].mean(), 1e-9), b[head] / b[head].mean()
    r = float(np.corrcoef(p, g)[0, 1]) if p.std() > 0 else 0.0
    return PilotFigure("pearson_r", r, r > 0.8, tolerance=0.0015)


def _synthesis_risky(draw: Draw) -> frozenset[str]:
    return frozenset(
        rel.rsplit("/", 1)[-1].removesuffix("_B.nii.gz")
        for rel in draw.files
        if rel.startswith("data/train/") and rel.endswith("_B.nii.gz")
    )


# -- vqa: a worked example's known answer ----------------------------------------------


def _dev_questions(draw: Draw) -> dict[str, dict]:
    text = draw.files.get("data/dev/questions.jsonl", b"").decode("utf-8")
    return {q["qid"]: q for q in (json.loads(line) for line in text.splitlines() if line)}


def _vqa(draw: Draw, ws: Path, rows: Rows, case: str) -> PilotFigure:
    """The pilot's answer to a worked question, passing when it is the worked answer."""
    worked = _dev_questions(draw).get(case)
    got = rows[case].get("answer", "")
    if worked is None:
        return PilotFigure("answer", None, False)
    return PilotFigure("answer", got, got.strip().lower() == worked["answer"].strip().lower())


def _vqa_risky(draw: Draw) -> frozenset[str]:
    import csv
    import io

    meta = draw.files.get("data/metadata.csv", b"").decode("utf-8")
    view = {r["image_id"]: r["view_convention"] for r in csv.DictReader(io.StringIO(meta))}
    dev = _dev_questions(draw)
    side = frozenset(
        qid
        for qid, q in dev.items()
        if "which lung" in q["question"].lower() and view.get(q["image_id"]) == "radiological"
    )
    # Without such a question the convention shows on no worked example: any counts.
    return side or frozenset(dev) | frozenset(draw.case_ids)


# -- detection: boxes on the lesions, read as the scorer reads them ---------------------


def _load_image(ws: Path, case: str) -> np.ndarray | None:
    """The image as floats in [0, 1], as the task's pipeline reads it (PNG /255, DICOM /4095)."""
    png, dcm = ws / "data" / "images" / f"{case}.png", ws / "data" / "images" / f"{case}.dcm"
    if png.is_file():
        from PIL import Image

        return np.asarray(Image.open(png), dtype=np.float64) / 255.0
    if dcm.is_file():
        import pydicom
        from pydicom.pixels import apply_modality_lut

        ds = pydicom.dcmread(str(dcm))
        return apply_modality_lut(ds.pixel_array, ds).astype(np.float64) / 4095.0
    return None


def _local_contrast(x: np.ndarray, b: list[float]) -> float:
    x0, y0, x1, y1 = int(b[0]), int(b[1]), int(np.ceil(b[2])), int(np.ceil(b[3]))
    m = max(x1 - x0, y1 - y0) // 2
    inner = x[y0:y1, x0:x1]
    outer = x[max(y0 - m, 0) : y1 + m, max(x0 - m, 0) : x1 + m]
    if inner.size == 0:
        return -1.0
    return float(inner.mean() - (outer.sum() - inner.sum()) / max(outer.size - inner.size, 1))


def _detection(draw: Draw, ws: Path, rows: Rows, case: str) -> PilotFigure:
    """Median contrast of the top three boxes over their ring, read x-first, >= 0.1."""
    x = _load_image(ws, case)
    found_file = resolve_output(ws, rows[case].get("detections_file", ""))
    if x is None or found_file is None:
        return PilotFigure("box_contrast", None, False)
    try:
        boxes = json.loads(found_file.read_text(encoding="utf-8"))["boxes"]
        found = sorted(boxes, key=lambda b: -b[4])[:3]
        top = float(np.median([_local_contrast(x, b) for b in found])) if found else None
    except (ValueError, KeyError, TypeError, IndexError):
        return PilotFigure("box_contrast", None, False)
    if top is None:
        return PilotFigure("box_contrast", None, False)
    return PilotFigure("box_contrast", top, top >= 0.1, tolerance=0.0015)


def _detection_risky(draw: Draw) -> frozenset[str]:
    boxes = draw.answers.get("boxes", {})
    return frozenset(c for c in draw.case_ids if len(boxes.get(c, ())) > 0) or frozenset(
        draw.case_ids
    )


# The figure's name per track, and the function that computes it.
_FIGURES: dict[str, tuple[str, FigureFn]] = {
    "segmentation": ("liver_side_mm", _segmentation),
    "enhancement": ("noise_reduction", _enhancement),
    "synthesis": ("pearson_r", _synthesis),
    "vqa": ("answer", _vqa),
    "detection": ("box_contrast", _detection),
}
_RISKY: dict[str, Callable[[Draw], frozenset[str]]] = {
    "segmentation": _segmentation_risky,
    "synthesis": _synthesis_risky,
    "vqa": _vqa_risky,
    "detection": _detection_risky,
}


def risky_cases(track: str, draw: Draw) -> frozenset[str] | None:
    """The cases where ``track``'s planted mistake shows; None: every case (the trap shows on all)."""
    fn = _RISKY.get(track)
    if fn is None:
        return None
    return fn(draw) or frozenset(draw.case_ids)


def pilot_figure(
    track: str, draw: Draw, workspace: Path, rows: Rows | None, case: str
) -> PilotFigure | None:
    """The track's check figure on the pilot's ``case``; None when the track declares none.

    Args:
        track: the track's name.
        draw: the task.
        workspace: the frozen workspace, as a directory.
        rows: the pilot's rows by case id (None when the pilot is unusable).
        case: the case the receipt says was checked.
    """
    if track not in _FIGURES:
        return None
    name, fn = _FIGURES[track]
    if rows is None or case not in rows:
        return PilotFigure(name, None, False)
    try:
        return fn(draw, Path(workspace), rows, case)
    except (OSError, ValueError, KeyError, IndexError, EOFError):
        # An unreadable input or output: nothing a stated figure could match.
        return PilotFigure(name, None, False)
