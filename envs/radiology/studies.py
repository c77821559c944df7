"""Synthetic DICOM studies, made with pydicom: deterministic bytes from a seed.

A patient has a current study and, for longitudinal work, a prior one (an earlier
date, the same patient, the same kind of study, the lesion smaller). Kinds:

* ``ct_chest``: one axial CT series (``CT``), int16 stored values with rescale
  ``HU = stored - 1024``, a water-density body ellipse and a soft-tissue lesion.
* ``mr_brain``: two axial MR series, ``T1 AX`` and ``T2 AX``; the lesion is dark on
  T1 and bright on T2. In a *mislabelled* study the two series descriptions are
  swapped: only the acquisition parameters (echo and repetition times) tell them apart.
* ``dx_chest``: one projection radiograph (``DX``), a single frame. As on a real
  detector, the header gives the spacing at the detector (``ImagerPixelSpacing``) and
  the magnification (``EstimatedRadiographicMagnificationFactor``, 1.08 to 1.25), and no
  ``PixelSpacing``: the spacing at the patient is their quotient. An *inverted* study
  is stored ``MONOCHROME1`` (bright anatomy as low values: ``4095 - value``).

Headers are those a reader relies on: patient and study identity, study date,
modality, series description and number, instance number, image position and
orientation (patient), pixel spacing, slice thickness, window centre and width, and
rescale slope and intercept. Every UID is derived from the seed, and the file meta
carries a fixed implementation UID, so the same seed gives the same bytes under any
pydicom version.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

__all__ = [
    "IMPLEMENTATION_UID",
    "Lesion",
    "SeriesSpec",
    "StudySpec",
    "PatientSpec",
    "make_patient",
    "render_series",
    "render_patient",
]

StudyKind = Literal["ct_chest", "mr_brain", "dx_chest"]

IMPLEMENTATION_UID = "1.2.826.0.1.3680043.10.1422.1"
"""The file meta's implementation class UID: fixed, so bytes do not follow pydicom's version."""

_SOP_CLASS = {
    "CT": "1.2.840.10008.5.1.4.1.1.2",  # CT Image Storage
    "MR": "1.2.840.10008.5.1.4.1.1.4",  # MR Image Storage
    "DX": "1.2.840.10008.5.1.4.1.1.1.1",  # Digital X-Ray Image Storage - For Presentation
}
_AXIAL = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
_CORONAL = (1.0, 0.0, 0.0, 0.0, 0.0, -1.0)


@dataclass(frozen=True)
class Lesion:
    """A spherical lesion, in patient millimetres (centre) and its diameter (mm)."""

    center_mm: tuple[float, float, float]
    diameter_mm: float


@dataclass(frozen=True)
class SeriesSpec:
    """One series: what it is, what its header says, and its grid (mm)."""

    modality: Literal["CT", "MR", "DX"]
    description: str
    number: int
    weighting: Literal["CT", "T1", "T2", "DX"]
    rows: int
    cols: int
    slices: int
    pixel_mm: float
    thickness_mm: float
    orientation: tuple[float, ...] = _AXIAL


@dataclass(frozen=True)
class StudySpec:
    """One study of a patient: date, kind, series, and the lesion it shows."""

    uid: str
    date: str
    kind: StudyKind
    description: str
    series: tuple[SeriesSpec, ...]
    lesion: Lesion
    mislabelled: bool = False
    inverted: bool = False
    magnification: float = 1.0


@dataclass(frozen=True)
class PatientSpec:
    """A patient and their studies, oldest first."""

    patient_id: str
    name: str
    birth_date: str
    sex: str
    studies: tuple[StudySpec, ...] = field(default_factory=tuple)


def _uid(*parts: object) -> str:
    return str(generate_uid(entropy_srcs=[str(p) for p in parts]))


def _series_for(kind: StudyKind, mislabelled: bool) -> tuple[SeriesSpec, ...]:
    if kind == "ct_chest":
        return (SeriesSpec("CT", "CHEST AX 2.5mm", 2, "CT", 64, 64, 16, 6.0, 2.5),)
    if kind == "dx_chest":
        return (SeriesSpec("DX", "CHEST PA", 1, "DX", 96, 96, 1, 4.0, 0.0, _CORONAL),)
    t1, t2 = "T1 AX", "T2 AX"
    if mislabelled:  # the hard case: the descriptions swapped, the parameters true
        t1, t2 = t2, t1
    return (
        SeriesSpec("MR", t1, 3, "T1", 48, 48, 12, 4.5, 4.0),
        SeriesSpec("MR", t2, 4, "T2", 48, 48, 12, 4.5, 4.0),
    )


def make_patient(
    seed: int, kind: StudyKind, *, prior: bool, mislabelled: bool = False, inverted: bool = False
) -> PatientSpec:
    """A patient with a current study of ``kind`` and, with ``prior``, an earlier one.

    The lesion grows between the prior and the current study. ``mislabelled`` swaps
    the MR series descriptions in the current study (MR only); ``inverted`` stores the
    current radiograph ``MONOCHROME1`` (DX only).
    """
    rng = np.random.default_rng([seed, 22])
    pid = f"BAT{seed:06d}"
    year = 2020 + int(rng.integers(0, 5))
    month, day = int(rng.integers(1, 13)), int(rng.integers(1, 28))
    center = (
        float(np.round(rng.uniform(-40, 40), 1)),
        float(np.round(rng.uniform(-30, 30), 1)),
        float(np.round(rng.uniform(-12, 12), 1)) if kind != "dx_chest" else 0.0,
    )
    now = float(np.round(rng.uniform(12, 30), 1))
    before = float(np.round(now * rng.uniform(0.5, 0.85), 1))
    studies = []
    dates = [(f"{year - 1}{month:02d}{day:02d}", before)] if prior else []
    dates.append((f"{year}{month:02d}{day:02d}", now))
    sex = "F" if rng.random() < 0.5 else "M"
    # Drawn after every other draw, so the other kinds' patients stay as they were.
    magnification = float(np.round(rng.uniform(1.08, 1.25), 3)) if kind == "dx_chest" else 1.0
    for i, (date, diameter) in enumerate(dates):
        current = i == len(dates) - 1
        bad = mislabelled and current and kind == "mr_brain"
        studies.append(
            StudySpec(
                uid=_uid("study", seed, kind, date),
                date=date,
                kind=kind,
                description={
                    "ct_chest": "CT CHEST",
                    "mr_brain": "MR BRAIN",
                    "dx_chest": "XR CHEST",
                }[kind],
                series=_series_for(kind, bad),
                lesion=Lesion(center, diameter),
                mislabelled=bad,
                inverted=inverted and current and kind == "dx_chest",
                magnification=magnification,
            )
        )
    return PatientSpec(
        pid, f"SYNTH^{pid}", f"{1940 + int(rng.integers(0, 50))}0101", sex, tuple(studies)
    )


def _pixels(
    series: SeriesSpec, study: StudySpec, z_mm: float, rng: np.random.Generator
) -> np.ndarray:
    """Stored values of one slice at patient z ``z_mm`` (rows x cols)."""
    n_r, n_c, px = series.rows, series.cols, series.pixel_mm
    # Pixel centres in patient mm, the grid centred on the isocentre.
    xs = (np.arange(n_c) - (n_c - 1) / 2) * px
    ys = (np.arange(n_r) - (n_r - 1) / 2) * px
    x, y = np.meshgrid(xs, ys)
    lx, ly, lz = study.lesion.center_mm
    r = study.lesion.diameter_mm / 2
    if series.weighting == "DX":
        dist2 = (x - lx) ** 2 + (y - ly) ** 2
    else:
        dist2 = (x - lx) ** 2 + (y - ly) ** 2 + (z_mm - lz) ** 2
    lesion = dist2 <= r * r
    body = (x / (n_c * px * 0.45)) ** 2 + (y / (n_r * px * 0.38)) ** 2 <= 1.0
    noise = rng.normal(0, 1, size=(n_r, n_c))
    if series.weighting == "CT":
        hu = np.full((n_r, n_c), -1000.0)
        hu[body] = 40.0
        hu[lesion & body] = 75.0
        hu += 4.0 * noise
        return np.clip(np.round(hu + 1024), 0, 4095).astype(np.uint16)
    if series.weighting == "DX":
        img = np.full((n_r, n_c), 300.0)
        img[body] = 1800.0
        img[lesion & body] = 2600.0
        return np.clip(np.round(img + 20.0 * noise), 0, 4095).astype(np.uint16)
    tissue, spot = (600.0, 250.0) if series.weighting == "T1" else (400.0, 1100.0)
    img = np.zeros((n_r, n_c))
    img[body] = tissue
    img[lesion & body] = spot
    return np.clip(np.round(img + 8.0 * noise), 0, 4095).astype(np.uint16)


def render_series(
    patient: PatientSpec, study: StudySpec, series: SeriesSpec, seed: int
) -> list[bytes]:
    """The series' instances as DICOM files (Part 10 bytes), in instance order."""
    rng = np.random.default_rng([seed, series.number, int(study.date)])
    series_uid = _uid("series", study.uid, series.number)
    out = []
    for k in range(series.slices):
        z = (k - (series.slices - 1) / 2) * series.thickness_mm if series.slices > 1 else 0.0
        pixels = _pixels(series, study, z, rng)
        sop = _uid("sop", series_uid, k)
        ds = Dataset()
        ds.SOPClassUID = _SOP_CLASS[series.modality]
        ds.SOPInstanceUID = sop
        ds.PatientID = patient.patient_id
        ds.PatientName = patient.name
        ds.PatientBirthDate = patient.birth_date
        ds.PatientSex = patient.sex
        ds.StudyInstanceUID = study.uid
        ds.StudyDate = study.date
        ds.StudyTime = "093000"
        ds.StudyDescription = study.description
        ds.AccessionNumber = f"A{abs(hash_int(study.uid)) % 10**8:08d}"
        ds.StudyID = "1"
        ds.SeriesInstanceUID = series_uid
        ds.SeriesNumber = series.number
        ds.SeriesDescription = series.description
        ds.Modality = series.modality
        ds.BodyPartExamined = "BRAIN" if study.kind == "mr_brain" else "CHEST"
        ds.InstanceNumber = k + 1
        ds.FrameOfReferenceUID = _uid("for", study.uid)
        ds.ImageOrientationPatient = [f"{v:g}" for v in series.orientation]
        half_c = (series.cols - 1) / 2 * series.pixel_mm
        half_r = (series.rows - 1) / 2 * series.pixel_mm
        ds.ImagePositionPatient = [f"{-half_c:g}", f"{-half_r:g}", f"{z:g}"]
        if series.modality == "DX":
            detector = f"{series.pixel_mm * study.magnification:.4f}"
            ds.ImagerPixelSpacing = [detector, detector]
            ds.EstimatedRadiographicMagnificationFactor = f"{study.magnification:.3f}"
        else:
            ds.PixelSpacing = [f"{series.pixel_mm:g}", f"{series.pixel_mm:g}"]
        if series.slices > 1:
            ds.SliceThickness = f"{series.thickness_mm:g}"
            ds.SliceLocation = f"{z:g}"
        ds.Rows, ds.Columns = series.rows, series.cols
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME1" if study.inverted else "MONOCHROME2"
        if study.inverted:
            pixels = (4095 - pixels).astype(np.uint16)
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
        ds.PixelRepresentation = 0
        if series.weighting == "CT":
            ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = "-1024", "1", "HU"
            ds.WindowCenter, ds.WindowWidth = "40", "400"
            ds.KVP = "120"
        elif series.modality == "MR":
            te, tr = (12, 500) if series.weighting == "T1" else (95, 4000)
            ds.EchoTime, ds.RepetitionTime = f"{te}", f"{tr}"
            ds.MagneticFieldStrength = "1.5"
            ds.WindowCenter, ds.WindowWidth = "500", "1000"
        else:
            ds.WindowCenter, ds.WindowWidth = "1500", "3000"
        ds.PixelData = pixels.tobytes()
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = ds.SOPClassUID
        meta.MediaStorageSOPInstanceUID = sop
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        meta.ImplementationClassUID = IMPLEMENTATION_UID
        meta.ImplementationVersionName = "BAT_GYM_1"
        ds.file_meta = meta
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        out.append(buf.getvalue())
    return out


def hash_int(text: str) -> int:
    """A stable integer from ``text`` (Python's ``hash`` is salted per process)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def render_patient(patient: PatientSpec, seed: int) -> dict[str, bytes]:
    """Every instance of every study, named ``dicom/<study>/<series>/<sop>.dcm`` by UIDs."""
    files = {}
    for study in patient.studies:
        for series in study.series:
            series_uid = _uid("series", study.uid, series.number)
            for k, data in enumerate(render_series(patient, study, series, seed)):
                sop = _uid("sop", series_uid, k)
                files[f"dicom/{study.uid}/{series_uid}/{sop}.dcm"] = data
    return files


def lesion_voxels(series: SeriesSpec, lesion: Lesion) -> float:
    """The lesion's diameter in pixels of ``series`` (for tolerances), ``d / pixel_mm``."""
    return lesion.diameter_mm / series.pixel_mm if series.pixel_mm else math.nan
