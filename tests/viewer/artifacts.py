"""Image artifacts made in code: a NIfTI label volume and a small PNG."""

import gzip
import io

import numpy as np


def nifti_bytes(shape=(16, 12, 5)) -> bytes:
    import nibabel as nib

    vol = np.zeros(shape, dtype=np.int16)
    vol[4:12, 3:9, :] = 1  # a box: a "segmentation"
    return gzip.compress(nib.Nifti1Image(vol, np.eye(4)).to_bytes())


def png_bytes() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()
