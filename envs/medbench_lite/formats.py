"""Byte-deterministic writers for the file formats MedBench-Lite tasks ship.

Every public file must be a pure function of the task seed, so the same task always
has the same snapshot digest. The usual writers are not: gzip stamps the time and
file name, ``numpy.savez`` stamps zip members with the clock, and DICOM UIDs are
normally random. These helpers pin all of that (gzip mtime 0, fixed zip dates, UIDs
hashed from the seed) and return bytes; callers write them where they belong.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "nifti_bytes",
    "dicom_bytes",
    "png_bytes",
    "npz_bytes",
    "csv_text",
    "sha256_hex",
    "seeded_uid",
]

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def nifti_bytes(
    stored: np.ndarray,
    affine: np.ndarray,
    *,
    slope: float = 1.0,
    inter: float = 0.0,
    descrip: str = "",
    gz: bool = True,
) -> bytes:
    """A NIfTI-1 image as bytes (gzipped unless ``gz`` is False).

    Args:
        stored: the array exactly as it is to be stored on disk (its dtype is the
            on-disk dtype); readers see ``stored * slope + inter``.
        affine: voxel-to-world (RAS+ mm) matrix, written as both sform and qform.
        slope: ``scl_slope``; with ``inter``, the scaling nibabel applies on read.
        inter: ``scl_inter``.
        descrip: the header's description field (80 bytes at most).
        gz: gzip the result with a zero timestamp and no file name.
    """
    import nibabel as nib

    img = nib.Nifti1Image(np.asarray(stored), np.asarray(affine, dtype=np.float64))
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    img.header["descrip"] = descrip.encode()[:79]
    img.header.set_xyzt_units("mm", "sec")
    # Integer data with an explicit slope/inter: nibabel writes them as given.
    img.header.set_slope_inter(slope, inter)
    raw = img.to_bytes()
    return gzip.compress(raw, compresslevel=6, mtime=0) if gz else raw


def seeded_uid(*parts: object) -> str:
    """A valid DICOM UID that is a pure function of ``parts``."""
    from pydicom.uid import generate_uid

    return str(generate_uid(entropy_srcs=[str(p) for p in parts]))


def dicom_bytes(
    stored: np.ndarray,
    *,
    uid_parts: Sequence[object],
    photometric: str = "MONOCHROME2",
    slope: float = 1.0,
    intercept: float = 0.0,
    pixel_spacing: tuple[float, float] = (1.0, 1.0),
    modality: str = "DX",
    patient_id: str = "ANON",
    study_date: str = "20240101",
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """A single-frame DICOM Part 10 file (explicit VR little endian) as bytes.

    Args:
        stored: 2D unsigned 16-bit pixel values as stored (before rescale).
        uid_parts: what the study, series and instance UIDs are hashed from.
        photometric: ``MONOCHROME2`` (high = bright) or ``MONOCHROME1`` (high = dark).
        slope: RescaleSlope; modality value = stored * slope + intercept.
        intercept: RescaleIntercept.
        pixel_spacing: (row spacing, column spacing) in mm.
        modality: the Modality attribute.
        patient_id: PatientID (synthetic).
        study_date: StudyDate, YYYYMMDD.
        extra: further attributes by keyword, e.g. ``{"BodyPartExamined": "CHEST"}``.
    """
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    arr = np.asarray(stored)
    if arr.ndim != 2:
        raise ValueError(f"expected a 2D image, got shape {arr.shape}")
    arr = np.clip(arr, 0, 65535).astype("<u2")
    sop_class = "1.2.840.10008.5.1.4.1.1.2" if modality == "CT" else "1.2.840.10008.5.1.4.1.1.1.1"
    instance = seeded_uid("instance", *uid_parts)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = instance
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = instance
    ds.StudyInstanceUID = seeded_uid("study", *uid_parts[:1])
    ds.SeriesInstanceUID = seeded_uid("series", *uid_parts)
    ds.PatientID = patient_id
    ds.PatientName = "Synthetic^Phantom"
    ds.StudyDate = study_date
    ds.ContentDate = study_date
    ds.Modality = modality
    ds.Rows, ds.Columns = int(arr.shape[0]), int(arr.shape[1])
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = 16
    ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    ds.PixelSpacing = [f"{pixel_spacing[0]:.4g}", f"{pixel_spacing[1]:.4g}"]
    ds.RescaleSlope = f"{slope:.6g}"
    ds.RescaleIntercept = f"{intercept:.6g}"
    ds.RescaleType = "US"
    for key, value in (extra or {}).items():
        setattr(ds, key, value)
    ds.PixelData = arr.tobytes()
    buf = io.BytesIO()
    pydicom.dcmwrite(buf, ds, enforce_file_format=True)
    return buf.getvalue()


def png_bytes(image: np.ndarray, text: Mapping[str, str] | None = None) -> bytes:
    """An 8-bit grayscale PNG with optional tEXt chunks (no timestamp is written)."""
    from PIL import Image, PngImagePlugin

    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {arr.dtype}")
    info = PngImagePlugin.PngInfo()
    for key, value in (text or {}).items():
        info.add_text(key, value)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", pnginfo=info, optimize=False)
    return buf.getvalue()


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive (readable by ``numpy.load``) with fixed member dates."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def csv_text(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """Rows as CSV text with a header and newline line endings."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
