"""The S3 check the s3_validate script splices in (``SLOT_CHECK``): a study read as the card says.

Apart from the pipeline, so that a mistake of the pipeline does not repeat in its
check. ``trap(study_dir)`` names what a careless reading of a study gets wrong (the
CT rescale, MR descriptions that disagree with the echo time, a radiograph's
magnification or ``MONOCHROME1`` photometry), or None. ``card_reading(study_dir)``
reads the series the model card measures as it says; ``lesion_size`` is its lesion's
volume in mm^3 (a radiograph's area at the patient in mm^2, named by ``size_name``),
the figure the S3 receipt states; ``card_diameter`` the model's diameter.
"""

import glob, json, os, sys
import numpy as np
import pydicom
sys.path.insert(0, "model")
from measure import measure, measure_2d
MODEL = json.load(open("model/model.json"))

def heads(study_dir):
    for folder in sorted(glob.glob(os.path.join(study_dir, "*"))):
        yield folder, pydicom.dcmread(sorted(glob.glob(os.path.join(folder, "*.dcm")))[0], stop_before_pixels=True)

def trap(study_dir):
    for _, h in heads(study_dir):
        if h.Modality == "CT" and (float(h.get("RescaleSlope", 1)), float(h.get("RescaleIntercept", 0))) != (1.0, 0.0):
            return "CT stored values need the rescale to HU"
        if h.Modality == "MR" and ("T2" in str(h.SeriesDescription)) != (float(h.EchoTime) > 60):
            return "an MR description disagrees with its echo time"
        if h.Modality == "DX" and (h.PhotometricInterpretation == "MONOCHROME1" or float(h.get("EstimatedRadiographicMagnificationFactor", 1)) != 1):
            return "a radiograph's photometry or magnification"
    return None

def card_reading(study_dir):
    """(values in modality units, spacing (slice, row, col) mm, threshold); slice 0 on a radiograph."""
    for folder, h in heads(study_dir):
        dss = sorted((pydicom.dcmread(f) for f in glob.glob(os.path.join(folder, "*.dcm"))), key=lambda d: int(d.InstanceNumber))
        if h.Modality == "DX":
            img = dss[0].pixel_array.astype(float)
            if h.PhotometricInterpretation == "MONOCHROME1":
                img = (2 ** int(h.BitsStored) - 1) - img
            mag = float(h.get("EstimatedRadiographicMagnificationFactor", 1))
            return img[None], (0.0, *(float(v) / mag for v in h.ImagerPixelSpacing)), MODEL["DX"]["threshold"]
        if h.Modality == "CT" or (h.Modality == "MR" and float(h.EchoTime) > 60):
            vol = np.stack([d.pixel_array * float(d.get("RescaleSlope", 1)) + float(d.get("RescaleIntercept", 0)) for d in dss])
            spacing = (float(h.get("SliceThickness", 1)), *(float(v) for v in h.PixelSpacing))
            return vol, spacing, MODEL[h.Modality]["threshold"]
    raise SystemExit(f"no series the card measures in {study_dir}")

def size_name(study_dir):
    return "area_mm2" if card_reading(study_dir)[1][0] == 0 else "volume_mm3"

def lesion_size(study_dir):
    vol, (dz, dy, dx), threshold = card_reading(study_dir)
    return float((vol > threshold).sum()) * (dz or 1.0) * dy * dx

def card_diameter(study_dir):
    vol, spacing, threshold = card_reading(study_dir)
    return measure_2d(vol[0], spacing[1:], threshold) if spacing[0] == 0 else measure(vol, spacing, threshold)
