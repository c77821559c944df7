"""The naive pipeline's ``radiograph``: stored values and the detector's spacing as they are.

A ``MONOCHROME1`` image is not inverted (its lesion, stored dark, falls under the
threshold), and the magnification is read but the spacing is not divided by it. The
trailing comment is the correct pipeline's, left as a hurried edit leaves it.

A patch, not a script: the naive pipeline is ``infer.py`` with its function of this
name replaced by the one below (see ``sandbox_code.py``). The import
names what the function uses from ``infer.py``.
"""

from infer import glob, os, pydicom


def radiograph(folder):
    ds = pydicom.dcmread(glob.glob(os.path.join(folder, "*.dcm"))[0])
    img = ds.pixel_array.astype(float)
    mag = float(ds.get("EstimatedRadiographicMagnificationFactor", 1))
    return img, [float(v) for v in ds.ImagerPixelSpacing]  # at the patient
