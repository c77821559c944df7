"""The segmentation pipeline's mistake: the model sees the stored voxel order.

The model card wants RAS+ voxel order; run on the array as stored, its right-side
prior and its texture filters look at the wrong tissue.

A patch, not a script: the teacher's buggy pipeline is ``pipeline.py`` with its
function of this name replaced by the one below (see ``scripts/__init__.py``). The
import names what the function uses from ``pipeline.py``.
"""

from pipeline import W, infer_lib, np


def predict(img):
    """Labels on the input's own voxel grid."""
    return infer_lib.segment(img.get_fdata(dtype=np.float32), img.header.get_zooms()[:3], W)
