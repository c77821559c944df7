"""The report pipeline's mistake: nodule sizes come out in voxels, not mm.

``find_nodules`` measures in the units of ``spacing``; without it, one voxel is one
unit.

A patch, not a script: the teacher's buggy pipeline is ``pipeline.py`` with its
function of this name replaced by the one below (see ``scripts/__init__.py``). The
import names what the function uses from ``pipeline.py``.
"""

from pipeline import W, infer_lib, nib


def findings(img):
    can = nib.as_closest_canonical(img)
    return infer_lib.find_nodules(can.get_fdata(), W)
