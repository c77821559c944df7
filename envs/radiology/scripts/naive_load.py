"""The naive pipeline's ``load``: a CT's stored values taken as Hounsfield units.

The header's rescale (``RescaleSlope``, ``RescaleIntercept``) is never applied, so the
model's HU threshold is compared with stored values.

A patch, not a script: the naive pipeline is ``infer.py`` with its function of this
name replaced by the one below (see ``sandbox_code.py``). The import
names what the function uses from ``infer.py``.
"""

from infer import glob, np, os, pydicom


def load(folder):
    dss = sorted((pydicom.dcmread(f) for f in glob.glob(os.path.join(folder, "*.dcm"))), key=lambda d: int(d.InstanceNumber))
    vol = np.stack([d.pixel_array.astype(float) for d in dss])
    first = dss[0]
    return first, vol, (float(first.get("SliceThickness", 1)), *(float(v) for v in first.PixelSpacing))
