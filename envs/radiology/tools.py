"""Typed DICOM tools over the env's Orthanc (host-side, :mod:`bat_gym.core.tools`).

Each takes a strict pydantic model (UIDs are checked as DICOM UIDs before any request
is made) and answers in JSON. A UID the server does not hold, or a slice past the
series, is a :class:`~bat_gym.core.tools.ToolError` that says how to find the right one.
What the tools store (annotations on a series, findings on a study) is kept by the
server itself, so it is part of the service state a stage hands on.

* ``find_studies``: the studies, optionally of one patient or modality;
* ``list_series``: a study's series (number, description, modality, instances);
* ``series_metadata``: the header fields a reader relies on, from the first instance
  (for a radiograph also its photometric interpretation, detector spacing and
  magnification);
* ``get_slice``: one slice, window/levelled to 0..255 and block-averaged to at most
  ``max_size`` pixels a side, with the stored-to-modality rescale applied;
* ``measure_roi``: mean, standard deviation, minimum and maximum (modality units, HU
  for CT; stored values for a radiograph) in a disc, and its area in mm² at the patient;
* ``store_annotation``: a lesion mark on a series (slice, centre, diameter, label);
* ``submit_finding``: the structured finding for a study.
"""

from __future__ import annotations

import io
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bat_gym.core.tools import Tool, ToolContext, ToolError

__all__ = ["dicom_tools", "pixel_spacing", "read_volume"]

_STRICT = ConfigDict(extra="forbid")
Uid = Annotated[
    str, Field(pattern=r"^[0-9]+(\.[0-9]+)*$", max_length=64, description="A DICOM UID.")
]


class FindStudies(BaseModel):
    model_config = _STRICT
    patient_id: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="Only this patient's studies."
    )
    modality: Literal["CT", "MR", "DX"] | None = Field(
        None, description="Only studies holding this modality."
    )


class StudyRef(BaseModel):
    model_config = _STRICT
    study_uid: Uid


class SeriesRef(BaseModel):
    model_config = _STRICT
    series_uid: Uid


class SliceRef(SeriesRef):
    index: Annotated[
        int, Field(ge=1, le=4096, description="Slice number, 1-based, in instance order.")
    ]


class GetSlice(SliceRef):
    window_center: float | None = Field(
        None, description="Window centre (modality units); default: the header's."
    )
    window_width: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Window width; default: the header's."
    )
    max_size: Annotated[int, Field(ge=4, le=32)] = Field(
        16, description="Largest side of the returned array, pixels."
    )


class MeasureRoi(SliceRef):
    row: Annotated[float, Field(ge=0, le=4096, description="Disc centre row, pixels.")]
    col: Annotated[float, Field(ge=0, le=4096, description="Disc centre column, pixels.")]
    radius_px: Annotated[float, Field(gt=0, le=512, description="Disc radius, pixels.")]


class StoreAnnotation(SliceRef):
    row: Annotated[float, Field(ge=0, le=4096)]
    col: Annotated[float, Field(ge=0, le=4096)]
    diameter_mm: Annotated[float, Field(gt=0, le=500)]
    label: Annotated[str, Field(min_length=1, max_length=64)]


class SubmitFinding(StudyRef):
    lesion_diameter_mm: Annotated[float, Field(ge=0, le=500, description="Longest diameter, mm.")]
    change: Literal["new", "larger", "smaller", "stable", "no_prior"] = Field(
        description="Against the patient's prior study."
    )
    series_uid: Uid = Field(description="The series the measurement was made on.")
    note: Annotated[str, Field(max_length=500)] = ""


def _service(ctx: ToolContext) -> Any:
    if ctx.service is None:
        raise RuntimeError("the radiology tools need the env's Orthanc service")
    return ctx.service


def _one(ctx: ToolContext, level: str, uid: str) -> str:
    tag = {"Study": "StudyInstanceUID", "Series": "SeriesInstanceUID"}[level]
    found = _service(ctx).client.post("/tools/find", {"Level": level, "Query": {tag: uid}})
    if not found:
        hint = (
            "find_studies lists the studies"
            if level == "Study"
            else "list_series lists a study's series"
        )
        raise ToolError(f"no {level.lower()} {uid} on the server; {hint}")
    return str(found[0])


def _instances(ctx: ToolContext, series_uid: str) -> list[str]:
    client = _service(ctx).client
    oid = _one(ctx, "Series", series_uid)
    items = client.get(f"/series/{oid}/instances")
    items.sort(key=lambda i: int(i["MainDicomTags"].get("InstanceNumber", "0") or 0))
    return [str(i["ID"]) for i in items]


def _dataset(ctx: ToolContext, series_uid: str, index: int) -> Any:
    import pydicom

    ids = _instances(ctx, series_uid)
    if index > len(ids):
        raise ToolError(f"series {series_uid} has {len(ids)} slice(s); index {index} is past it")
    data = _service(ctx).client.get(f"/instances/{ids[index - 1]}/file", raw=True)
    return pydicom.dcmread(io.BytesIO(data))


def _modality_values(ds: Any) -> np.ndarray:
    slope = float(getattr(ds, "RescaleSlope", 1) or 1)
    intercept = float(getattr(ds, "RescaleIntercept", 0) or 0)
    return ds.pixel_array.astype(np.float64) * slope + intercept


def pixel_spacing(ds: Any) -> tuple[float, float]:
    """(row, column) spacing at the patient, mm.

    ``PixelSpacing`` where the header has it; for a projection radiograph, the detector's
    ``ImagerPixelSpacing`` divided by ``EstimatedRadiographicMagnificationFactor``.
    """
    if getattr(ds, "PixelSpacing", None):
        dy, dx = (float(v) for v in ds.PixelSpacing)
        return dy, dx
    magnification = float(getattr(ds, "EstimatedRadiographicMagnificationFactor", 1) or 1)
    dy, dx = (float(v) / magnification for v in ds.ImagerPixelSpacing)
    return dy, dx


def read_volume(client: Any, series_oid: str) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A series as a (slices, rows, cols) array in modality units, and its (z, y, x) spacing, mm."""
    import pydicom

    items = client.get(f"/series/{series_oid}/instances")
    items.sort(key=lambda i: int(i["MainDicomTags"].get("InstanceNumber", "0") or 0))
    slices, first = [], None
    for item in items:
        ds = pydicom.dcmread(io.BytesIO(client.get(f"/instances/{item['ID']}/file", raw=True)))
        first = first or ds
        slices.append(_modality_values(ds))
    assert first is not None
    dy, dx = pixel_spacing(first)
    dz = float(getattr(first, "SliceThickness", 0) or 0)
    return np.stack(slices), (dz, dy, dx)


def find_studies(args: FindStudies, ctx: ToolContext) -> list[dict[str, Any]]:
    """The studies on the server, oldest first within a patient."""
    client = _service(ctx).client
    query: dict[str, Any] = {}
    if args.patient_id:
        query["PatientID"] = args.patient_id
    if args.modality:
        query["ModalitiesInStudy"] = args.modality
    out = []
    for study in client.post("/tools/find", {"Level": "Study", "Query": query, "Expand": True}):
        tags, patient = study["MainDicomTags"], study["PatientMainDicomTags"]
        out.append(
            {
                "study_uid": tags.get("StudyInstanceUID"),
                "patient_id": patient.get("PatientID"),
                "date": tags.get("StudyDate"),
                "description": tags.get("StudyDescription"),
                "series": len(study.get("Series", [])),
            }
        )
    return sorted(out, key=lambda s: (str(s["patient_id"]), str(s["date"])))


def list_series(args: StudyRef, ctx: ToolContext) -> list[dict[str, Any]]:
    """A study's series, by series number."""
    client = _service(ctx).client
    oid = _one(ctx, "Study", args.study_uid)
    out = []
    for series in client.get(f"/studies/{oid}/series"):
        tags = series["MainDicomTags"]
        out.append(
            {
                "series_uid": tags.get("SeriesInstanceUID"),
                "number": int(tags.get("SeriesNumber", "0") or 0),
                "description": tags.get("SeriesDescription", ""),
                "modality": tags.get("Modality"),
                "instances": len(series.get("Instances", [])),
            }
        )
    return sorted(out, key=lambda s: s["number"])


def _float_list(value: Any) -> list[float] | None:
    return None if value is None else [float(v) for v in value]


def series_metadata(args: SeriesRef, ctx: ToolContext) -> dict[str, Any]:
    """Header fields of the series' first instance, plus its slice count."""
    ds = _dataset(ctx, args.series_uid, 1)
    slices = len(_instances(ctx, args.series_uid))

    def num(name: str) -> float | None:
        v = getattr(ds, name, None)
        return None if v in (None, "") else float(v)

    return {
        "series_uid": args.series_uid,
        "modality": ds.Modality,
        "description": getattr(ds, "SeriesDescription", ""),
        "body_part": getattr(ds, "BodyPartExamined", ""),
        "rows": int(ds.Rows),
        "columns": int(ds.Columns),
        "slices": slices,
        "photometric_interpretation": str(getattr(ds, "PhotometricInterpretation", "")),
        "bits_stored": int(getattr(ds, "BitsStored", 0) or 0),
        "pixel_spacing_mm": _float_list(getattr(ds, "PixelSpacing", None)),
        "imager_pixel_spacing_mm": _float_list(getattr(ds, "ImagerPixelSpacing", None)),
        "magnification_factor": num("EstimatedRadiographicMagnificationFactor"),
        "slice_thickness_mm": num("SliceThickness"),
        "image_orientation_patient": _float_list(getattr(ds, "ImageOrientationPatient", None)),
        "image_position_patient": _float_list(getattr(ds, "ImagePositionPatient", None)),
        "window_center": num("WindowCenter"),
        "window_width": num("WindowWidth"),
        "rescale_slope": num("RescaleSlope"),
        "rescale_intercept": num("RescaleIntercept"),
        "echo_time_ms": num("EchoTime"),
        "repetition_time_ms": num("RepetitionTime"),
    }


def _blocks(image: np.ndarray, max_size: int) -> np.ndarray:
    """Block-average ``image`` so that neither side exceeds ``max_size``."""
    factor = max(1, int(np.ceil(max(image.shape) / max_size)))
    rows, cols = (image.shape[0] // factor) * factor, (image.shape[1] // factor) * factor
    cut = image[:rows, :cols]
    return cut.reshape(rows // factor, factor, cols // factor, factor).mean(axis=(1, 3))


def get_slice(args: GetSlice, ctx: ToolContext) -> dict[str, Any]:
    """One slice, window/levelled to 0..255 and downsampled by block averaging."""
    ds = _dataset(ctx, args.series_uid, args.index)
    values = _modality_values(ds)
    center = (
        args.window_center
        if args.window_center is not None
        else float(getattr(ds, "WindowCenter", values.mean()))
    )
    width = (
        args.window_width
        if args.window_width is not None
        else float(getattr(ds, "WindowWidth", np.ptp(values) or 1))
    )
    small = _blocks(values, args.max_size)
    shown = np.clip((small - (center - width / 2)) / width * 255, 0, 255).round().astype(int)
    if getattr(ds, "PhotometricInterpretation", "") == "MONOCHROME1":
        shown = 255 - shown  # low values are displayed bright
    return {
        "index": args.index,
        "shape": list(values.shape),
        "block": int(np.ceil(max(values.shape) / args.max_size)),
        "window": [center, width],
        "min": float(values.min()),
        "max": float(values.max()),
        "pixels": shown.tolist(),
    }


def measure_roi(args: MeasureRoi, ctx: ToolContext) -> dict[str, Any]:
    """Statistics in a disc of one slice, in modality units (HU for CT)."""
    ds = _dataset(ctx, args.series_uid, args.index)
    values = _modality_values(ds)
    rr, cc = np.mgrid[: values.shape[0], : values.shape[1]]
    mask = (rr - args.row) ** 2 + (cc - args.col) ** 2 <= args.radius_px**2
    if not mask.any():
        raise ToolError("the disc holds no pixel of the slice; check row, col and radius_px")
    dy, dx = pixel_spacing(ds)
    inside = values[mask]
    return {
        "pixels": int(mask.sum()),
        "area_mm2": round(float(mask.sum()) * dy * dx, 2),
        "mean": round(float(inside.mean()), 2),
        "std": round(float(inside.std()), 2),
        "min": float(inside.min()),
        "max": float(inside.max()),
    }


def store_annotation(args: StoreAnnotation, ctx: ToolContext) -> dict[str, Any]:
    """Store a lesion mark on a series; the server keeps it."""
    _dataset(ctx, args.series_uid, args.index)  # the slice must exist
    record = args.model_dump(exclude={"series_uid"})
    count = _service(ctx).add_record("series", args.series_uid, record)
    return {"stored": True, "annotations_on_series": count}


def submit_finding(args: SubmitFinding, ctx: ToolContext) -> dict[str, Any]:
    """Store the structured finding for a study; the server keeps it."""
    _one(ctx, "Study", args.study_uid)
    _one(ctx, "Series", args.series_uid)
    record = args.model_dump(exclude={"study_uid"})
    count = _service(ctx).add_record("studies", args.study_uid, record)
    return {"stored": True, "findings_on_study": count}


def dicom_tools() -> tuple[Tool, ...]:
    """The suite's DICOM tools, in the order the prompt lists them."""
    return (
        Tool(
            "find_studies",
            "List the studies on the DICOM server (optionally of one patient or modality).",
            FindStudies,
            find_studies,
        ),
        Tool(
            "list_series",
            "List a study's series: number, description, modality, instance count.",
            StudyRef,
            list_series,
        ),
        Tool(
            "series_metadata",
            "Header fields of a series: spacing, orientation, window, rescale, echo/repetition times.",
            SeriesRef,
            series_metadata,
        ),
        Tool(
            "get_slice",
            "One slice as a small window/levelled 0-255 array (block-averaged).",
            GetSlice,
            get_slice,
        ),
        Tool(
            "measure_roi",
            "Mean/std/min/max in a disc of a slice, in modality units (HU for CT), and its area.",
            MeasureRoi,
            measure_roi,
        ),
        Tool(
            "store_annotation",
            "Store a lesion mark (slice, centre, diameter, label) on a series.",
            StoreAnnotation,
            store_annotation,
        ),
        Tool(
            "submit_finding",
            "Submit the structured finding for a study.",
            SubmitFinding,
            submit_finding,
        ),
    )
