"""Pictures of image artifacts: PNG as is, a NIfTI volume's middle slice, a DICOM frame.

A person judging a segmentation or a synthesized contrast wants to see it, not its
path. Each renderer takes the file's bytes and returns PNG bytes, 8-bit grey (or the
PNG's own mode), intensities scaled from the 1st to the 99th percentile so a dark
volume is still visible.
"""

from __future__ import annotations

import io
import zlib

import numpy as np

from bat_gym.core.errors import BatGymError

__all__ = ["ImageError", "MAX_VOLUME_BYTES", "to_png", "slice_to_png"]


class ImageError(BatGymError):
    """An artifact could not be drawn (not an image, or an unreadable one)."""


def slice_to_png(plane: np.ndarray) -> bytes:
    """A 2-D array as an 8-bit PNG, intensities scaled between its 1st and 99th percentile.

    Args:
        plane: shape ``(rows, columns)``, any real dtype; a label map (few distinct
            values) is spread over the grey range so every label shows.
    """
    from PIL import Image

    a = np.asarray(plane, dtype=np.float64)
    if a.ndim != 2:
        raise ImageError(f"expected a 2-D slice, got shape {a.shape}")
    a = np.nan_to_num(a)
    values = np.unique(a)
    if values.size <= 16:  # a label map: equal steps, background black
        lut = {v: i for i, v in enumerate(values)}
        scaled = np.vectorize(lut.get)(a) * (255.0 / max(1, values.size - 1))
    else:
        low, high = np.percentile(a, [1, 99])
        scaled = (a - low) / (high - low or 1.0) * 255.0
    img = Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8), mode="L")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


#: The most a gzipped volume may expand to: an agent's file is untrusted, and a few MB of
#: zeros gzip to a few KB (a decompression bomb would exhaust the viewer's memory).
MAX_VOLUME_BYTES = 256 << 20


def _gunzip(data: bytes) -> bytes:
    d = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
    try:
        out = d.decompress(data, MAX_VOLUME_BYTES)
    except zlib.error as exc:
        raise ImageError(f"not a readable gzip stream ({exc})") from None
    if d.unconsumed_tail:
        raise ImageError(f"the volume expands past {MAX_VOLUME_BYTES >> 20} MiB; not drawn")
    return out


def _nifti(data: bytes) -> bytes:
    import nibabel as nib

    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data)
    try:
        vol = np.asanyarray(nib.Nifti1Image.from_bytes(data).dataobj)
    except Exception as exc:  # noqa: BLE001 - nibabel raises several kinds
        raise ImageError(f"not a readable NIfTI-1 file ({exc})") from None
    while vol.ndim > 3:  # a time series or vector image: its first volume
        vol = vol[..., 0]
    if vol.ndim == 3:
        vol = vol[:, :, vol.shape[2] // 2]
    # NIfTI stores x fastest with y up; transpose and flip so it reads like a radiograph.
    return slice_to_png(np.flipud(np.asarray(vol).T))


def _dicom(data: bytes) -> bytes:
    import pydicom

    try:
        ds = pydicom.dcmread(io.BytesIO(data), force=True)
        pixels = ds.pixel_array
    except Exception as exc:  # noqa: BLE001 - pydicom raises several kinds
        raise ImageError(f"not a readable DICOM image ({exc})") from None
    if pixels.ndim == 3 and pixels.shape[-1] not in (3, 4):  # multi-frame: the middle one
        pixels = pixels[pixels.shape[0] // 2]
    if pixels.ndim == 3:
        pixels = pixels.mean(axis=-1)
    slope = float(getattr(ds, "RescaleSlope", 1) or 1)
    intercept = float(getattr(ds, "RescaleIntercept", 0) or 0)
    return slice_to_png(pixels * slope + intercept)


def _raster(data: bytes) -> bytes:
    from PIL import Image, UnidentifiedImageError

    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return data
    try:
        img = Image.open(io.BytesIO(data))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageError(f"not a readable image ({exc})") from None
    return buf.getvalue()


def to_png(data: bytes, name: str) -> bytes:
    """PNG bytes picturing the file ``name`` with content ``data``.

    Raises:
        ImageError: the name is not an image kind the viewer draws, or the content
            does not parse as one.
    """
    lower = name.lower()
    if lower.endswith((".nii", ".nii.gz")):
        return _nifti(data)
    if lower.endswith(".dcm"):
        return _dicom(data)
    if lower.endswith((".png", ".jpg", ".jpeg")):
        return _raster(data)
    raise ImageError(f"{name}: not an image the viewer draws (PNG, JPEG, NIfTI, DICOM)")
