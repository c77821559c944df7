"""The naive baseline's classification input: the stored pixel values as they are.

Neither the modality LUT (rescale slope and intercept) nor the MONOCHROME1 inversion
is applied.

A patch, not a script: the naive baseline's pipeline is ``pipeline.py`` with its
function of this name replaced by the one below (see ``scripts/__init__.py``). The
import names what the function uses from ``pipeline.py``.
"""

from pipeline import np, pydicom


def model_input(path):
    """The image as the model wants it."""
    ds = pydicom.dcmread(path)
    return ds.pixel_array.astype(np.float64)
