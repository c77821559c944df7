import gzip
import io

import nibabel as nib
import numpy as np
import pydicom
from PIL import Image
from pydicom.pixels import apply_modality_lut

from bat_gym.envs.medbench_lite.formats import (
    csv_text,
    dicom_bytes,
    nifti_bytes,
    npz_bytes,
    png_bytes,
    seeded_uid,
)


def test_nifti_is_deterministic_and_keeps_scaling_and_affine():
    stored = np.arange(60, dtype=np.uint16).reshape(3, 4, 5)
    aff = np.array([[-2.0, 0, 0, 10], [0, -2.0, 0, 20], [0, 0, 3.0, -5], [0, 0, 0, 1]])
    a = nifti_bytes(stored, aff, slope=0.5, inter=-1024)
    assert a == nifti_bytes(stored, aff, slope=0.5, inter=-1024)
    img = nib.Nifti1Image.from_bytes(gzip.decompress(a))
    assert np.allclose(img.affine, aff)
    assert img.get_fdata()[0, 0, 1] == 0.5 * 1 - 1024
    assert nib.aff2axcodes(img.affine) == ("L", "P", "S")


def test_dicom_is_deterministic_and_readable():
    px = np.arange(12, dtype=np.uint16).reshape(3, 4) * 100
    kw = dict(uid_parts=("t", 1), photometric="MONOCHROME1", slope=2.0, intercept=-1024.0)
    a = dicom_bytes(px, **kw)
    assert a == dicom_bytes(px, **kw)
    assert a != dicom_bytes(px, **{**kw, "uid_parts": ("t", 2)})
    ds = pydicom.dcmread(io.BytesIO(a))
    assert ds.PhotometricInterpretation == "MONOCHROME1"
    assert apply_modality_lut(ds.pixel_array, ds)[0, 1] == 2 * 100 - 1024
    assert seeded_uid("x") == seeded_uid("x") != seeded_uid("y")


def test_png_npz_and_csv_are_deterministic():
    img = (np.arange(64, dtype=np.uint8) * 3).reshape(8, 8)
    p = png_bytes(img, {"ViewConvention": "radiological"})
    assert p == png_bytes(img, {"ViewConvention": "radiological"})
    im = Image.open(io.BytesIO(p))
    assert im.text["ViewConvention"] == "radiological" and np.array_equal(np.asarray(im), img)
    z = npz_bytes({"b": np.ones(2), "a": np.arange(3)})
    assert z == npz_bytes({"a": np.arange(3), "b": np.ones(2)})
    assert np.load(io.BytesIO(z))["a"].tolist() == [0, 1, 2]
    assert csv_text([{"id": "x", "v": 1}], ["id", "v"]) == "id,v\nx,1\n"
