"""How MedBench-Lite outputs are compared with the reference run's, and reproduced.

The rubric's ``matches_reference`` and ``pipeline_reproduces`` checks compare an
agent's output files with the ones the reference run (the teacher's ``success``
workflow, played by the verifier on the pristine task) left. The teacher writes the
reference's own bytes, but the same result has many encodings, so
:func:`files_agree` compares decoded values:

* **NIfTI** (segmentation masks, denoised and synthesized volumes): NIfTI-1 or -2,
  gzipped or not, any byte order, any on-disk dtype and any ``scl_slope``/``scl_inter``
  that yields the values. The shape must be the reference's, the affine within
  ``1e-6`` (relative and absolute, far below the scorer's ``1e-3`` grid check), and the
  voxel values (after scaling):

  - **exactly** equal for label masks (the track declares ``nifti_label_mask``, or the
    reference is stored as unscaled integers): a label is right or wrong;
  - for float outputs, within ``|mine - ref| <= 1e-6 * |ref| + 1e-6 * max|ref|``
    voxel by voxel. The models are deterministic numpy, so the same pipeline gives the
    same numbers; what differs between honest encodings is storage precision: the
    reference stores float32 (relative step ``2**-24``, about ``6e-8``), an agent may
    store the float64 values it computed, or the float32 ones as float64. ``1e-6``
    relative is some 16 times that, and the ``max|ref|`` term (about 1e-3 HU for CT,
    1e-6 for normalized MR) covers values near zero, where relative error means
    nothing. Anything wider is an attack surface: a volume that is not the model's
    output but close to it. The difference between a right and a wrong pipeline in
    these tracks is tens to hundreds of HU, or the whole contrast.

* **JSON** (detections): parsed (UTF-8, an optional BOM) and equal as values: the same
  keys (no duplicate), lists of the same length in the same order, the same strings,
  booleans and nulls, and numbers within ``1e-9`` relative (``1e-12`` absolute), so
  ``12`` and ``12.0``, another indent or key order, or ``1e-01`` for ``0.1`` agree.

* **Everything else** (the report track's text reports): the same bytes. The reports
  are what ``infer_lib.format_report`` returns; there is one encoding of that text.

A file that cannot be read (not NIfTI, truncated, a gzip bomb, not UTF-8, not JSON)
never raises: it disagrees.

:func:`reproduction_command` is the bash the verifier runs (in a fresh sandbox holding
the agent's final workspace, inputs put back pristine) to run the agent's shipped
``pipeline/infer.py`` on every case, the way S4 runs it.
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

import numpy as np

from bat_gym.envs.medbench_lite.scripts import Source, stage_script

__all__ = [
    "AFFINE_TOL",
    "FLOAT_RTOL",
    "JSON_ATOL",
    "JSON_RTOL",
    "files_agree",
    "json_agree",
    "nifti_agree",
    "reproduction_command",
]

AFFINE_TOL = 1e-6
"""Relative and absolute tolerance on affine entries (mm)."""

FLOAT_RTOL = 1e-6
"""Tolerance on float voxel values, relative to the voxel and to the volume's max |value|."""

JSON_RTOL = 1e-9
JSON_ATOL = 1e-12

_GZIP_MAGIC = b"\x1f\x8b"
_SLACK = 1 << 20  # header, extensions, padding: what a decoded file may add to the data
_MAX_GROWTH = 8  # uint8 reference, float64 agent file
_TRUSTED = 1 << 40  # the reference run's own files: no cap beyond memory


# -- files ----------------------------------------------------------------------------


def files_agree(kind: str | None, mine: bytes, reference: bytes) -> bool:
    """Whether an agent's output file holds the reference file's result.

    Args:
        kind: the track's output kind (``task.json`` ``output.kind``): which decoder
            applies (``nifti_label_mask``, ``nifti_image``, ``json_boxes``); anything
            else compares bytes. A reference that does not decode as its kind says
            is compared as bytes.
        mine: the agent's file.
        reference: the reference run's file.
    """
    if mine == reference:
        return True
    try:
        if kind in ("nifti_label_mask", "nifti_image") and _is_nifti(reference):
            return nifti_agree(mine, reference, labels=kind == "nifti_label_mask")
        if kind == "json_boxes" and _parses_as_json(reference):
            return json_agree(mine, reference)
    except Exception:  # any decoding failure of agent output: a disagreement
        return False
    return False


# -- NIfTI ----------------------------------------------------------------------------


def _gunzip(data: bytes, limit: int) -> bytes:
    """``data`` gunzipped (every member), refusing more than ``limit`` bytes out."""
    out = bytearray()
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += d.decompress(data, limit + 1 - len(out))
        if len(out) > limit or d.unconsumed_tail:
            raise ValueError("gzip stream decompresses past the limit")
        if not d.eof:
            raise ValueError("truncated gzip stream")
        data = d.unused_data.lstrip(b"\x00")  # members may follow; padding may too
    return bytes(out)


def _raw(data: bytes, limit: int) -> bytes:
    return _gunzip(data, limit) if data[:2] == _GZIP_MAGIC else data


def _image(raw: bytes) -> Any:
    """A single-file NIfTI-1 or NIfTI-2 image from its uncompressed bytes."""
    import nibabel as nib

    errors = []
    for cls in (nib.Nifti1Image, nib.Nifti2Image):
        try:
            return cls.from_bytes(raw)
        except Exception as exc:  # not this flavour
            errors.append(exc)
    raise ValueError(f"not a single-file NIfTI image: {errors}")


def _is_nifti(data: bytes) -> bool:
    try:
        _image(_raw(data, _TRUSTED))
    except Exception:
        return False
    return True


def _values(img: Any) -> np.ndarray:
    dtype = np.dtype(img.get_data_dtype())
    if dtype.kind not in "biuf":  # complex, RGB records, strings: not a volume of values
        raise ValueError(f"unsupported voxel dtype {dtype}")
    return np.asarray(img.dataobj, dtype=np.float64)


def _is_unscaled_integer(img: Any) -> bool:
    if np.dtype(img.get_data_dtype()).kind not in "biu":
        return False
    # nibabel moves the scaling into the data proxy on load (the header's reads nan).
    slope = float(getattr(img.dataobj, "slope", 1.0))
    inter = float(getattr(img.dataobj, "inter", 0.0))
    return slope == 1.0 and inter == 0.0


def nifti_agree(mine: bytes, reference: bytes, *, labels: bool = False) -> bool:
    """Same shape, affine (``AFFINE_TOL``) and voxel values; see the module docstring.

    Args:
        mine: the agent's file (``.nii`` or ``.nii.gz`` bytes).
        reference: the reference run's file.
        labels: demand exactly equal values (a label mask). Also exact when the
            reference is stored as unscaled integers.

    Raises:
        Exception: the reference does not decode (callers treat it as disagreement).
    """
    ref_raw = _raw(reference, _TRUSTED)
    ref = _image(ref_raw)
    try:
        img = _image(_raw(mine, _SLACK + _MAX_GROWTH * len(ref_raw)))
    except Exception:
        return False
    if tuple(img.shape) != tuple(ref.shape):
        return False  # before any voxel is read: the data read is bounded by the reference's
    a, b = img.affine, ref.affine
    if a is None or b is None or not np.allclose(a, b, rtol=AFFINE_TOL, atol=AFFINE_TOL):
        return False
    try:
        m = _values(img)
    except Exception:
        return False
    r = _values(ref)
    if labels or _is_unscaled_integer(ref):
        return bool(np.array_equal(m, r))
    return _floats_agree(m, r)


def _floats_agree(m: np.ndarray, r: np.ndarray) -> bool:
    finite = np.isfinite(r)
    if not np.array_equal(np.isfinite(m), finite):
        return False
    # Non-finite voxels (none in these tracks) must be the same non-finite value.
    if not np.array_equal(m[~finite], r[~finite], equal_nan=True):
        return False
    mf, rf = m[finite], r[finite]
    if mf.size == 0:
        return True
    scale = float(np.max(np.abs(rf)))
    return bool(np.all(np.abs(mf - rf) <= FLOAT_RTOL * np.abs(rf) + FLOAT_RTOL * scale))


# -- JSON -----------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _parse_json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8-sig"), object_pairs_hook=_no_duplicates)


def _parses_as_json(data: bytes) -> bool:
    try:
        _parse_json(data)
    except Exception:
        return False
    return True


def _json_values_agree(mine: Any, ref: Any) -> bool:
    if isinstance(ref, bool) or isinstance(mine, bool):
        return mine is ref
    if isinstance(ref, (int, float)) and isinstance(mine, (int, float)):
        a, b = float(mine), float(ref)
        if math.isnan(b) or math.isnan(a):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(b) or math.isinf(a):
            return a == b
        return abs(a - b) <= JSON_ATOL + JSON_RTOL * abs(b)
    if isinstance(ref, dict):
        return (
            isinstance(mine, dict)
            and mine.keys() == ref.keys()
            and all(_json_values_agree(mine[k], ref[k]) for k in ref)
        )
    if isinstance(ref, list):
        return (
            isinstance(mine, list)
            and len(mine) == len(ref)
            and all(_json_values_agree(m, r) for m, r in zip(mine, ref, strict=True))
        )
    if ref is None:
        return mine is None
    return type(mine) is type(ref) and mine == ref  # strings


def json_agree(mine: bytes, reference: bytes) -> bool:
    """Parsed equal, numbers within ``JSON_RTOL`` (see the module docstring)."""
    ref = _parse_json(reference)
    try:
        return _json_values_agree(_parse_json(mine), ref)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return False


# -- reproduction ---------------------------------------------------------------------

# The bash around the reproduction script (scripts/stages/reproduce.py).
_REPRODUCE = """\
set -e
# The outputs of the episode are not evidence: the pipeline must write its own.
rm -rf outputs validation
mkdir -p {out_dir}
# -I: no PYTHON* variables or user site; a fresh pycache prefix, so that no compiled
# file left in the workspace stands in for pipeline/infer.py's source.
python3 -I -B -X pycache_prefix="$(mktemp -d)" - <<'REPRODUCE_EOF'
{script}REPRODUCE_EOF
"""


def reproduction_command(case_ids: list[str] | tuple[str, ...], out_dir: str) -> str:
    """Bash that runs the shipped ``pipeline/infer.py`` on every case, as S4 does.

    The S2 skill asks for ``pipeline/infer.py`` with ``run(ids, out_csv, out_dir)``
    and the teacher's S4 calls ``infer.run(ids, "outputs/predictions.csv", out_dir)``
    with the track's output directory; this does the same with the task's case ids
    written into the command (task.json is put back pristine anyway). The episode's
    ``outputs/`` and ``validation/`` trees are removed first, so the predictions
    must name per-case files this run wrote, and the output directory is created
    empty, as an S4 run finds it.

    Args:
        case_ids: every case id of the task, in the submission's order.
        out_dir: where the track's pipeline writes per-case outputs (under
            ``outputs``).
    """
    if not out_dir.startswith("outputs") or any(c in out_dir for c in "'\"$`\\ \n;&|"):
        raise ValueError(f"unsafe output directory {out_dir!r}")
    # JSON: the ids and the directory written as double-quoted literals, as S4 reads them.
    script = stage_script(
        "reproduce",
        ids=Source(json.dumps([str(i) for i in case_ids])),
        out_dir=Source(json.dumps(out_dir)),
    )
    return _REPRODUCE.format(out_dir=out_dir, script=script)
