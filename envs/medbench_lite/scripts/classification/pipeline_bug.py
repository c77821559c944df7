"""The classification pipeline's mistake: MONOCHROME1 images are not inverted.

The modality LUT is applied, but an image stored inverted (high = dark) reaches the
model inverted.

A patch, not a script: the teacher's buggy pipeline is ``pipeline.py`` with its
function of this name replaced by the one below (see ``scripts/__init__.py``). The
import names what the function uses from ``pipeline.py``.
"""

from pipeline import apply_modality_lut, np, pydicom


def model_input(path):
    """The image as the model wants it."""
    ds = pydicom.dcmread(path)
    return apply_modality_lut(ds.pixel_array, ds).astype(np.float64)
