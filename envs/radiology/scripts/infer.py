"""The teacher's pipeline, written into the sandbox as ``pipeline/infer.py``.

``python pipeline/infer.py OUT [PATIENT ...]`` writes OUT, a CSV of
``id,diameter_mm,prior_mm,change`` (diameters in mm, one decimal) for the patients
given, or for every patient of ``task.json`` when none is. It measures each study as
the model card says: CT in Hounsfield units (the header's rescale applied), MR on the
series whose echo time says T2 (TE > 60 ms), a radiograph on displayed values
(``MONOCHROME1`` inverted) at the patient's spacing (the detector's over the
magnification), with ``model/measure.py`` and the thresholds of ``model/model.json``.
"""

import csv, glob, json, os, sys
import numpy as np
import pydicom
sys.path.insert(0, "model")
from measure import measure, measure_2d
model = json.load(open("model/model.json"))
task = json.load(open("task.json"))
out, wanted = sys.argv[1], sys.argv[2:]
CHANGE_MM = 2.0

def load(folder):
    dss = sorted((pydicom.dcmread(f) for f in glob.glob(os.path.join(folder, "*.dcm"))), key=lambda d: int(d.InstanceNumber))
    vol = np.stack([d.pixel_array * float(d.get("RescaleSlope", 1)) + float(d.get("RescaleIntercept", 0)) for d in dss])
    first = dss[0]
    return first, vol, (float(first.get("SliceThickness", 1)), *(float(v) for v in first.PixelSpacing))

def radiograph(folder):
    ds = pydicom.dcmread(glob.glob(os.path.join(folder, "*.dcm"))[0])
    img = ds.pixel_array.astype(float)
    if ds.PhotometricInterpretation == "MONOCHROME1":  # bright anatomy stored low
        img = (2 ** int(ds.BitsStored) - 1) - img
    mag = float(ds.get("EstimatedRadiographicMagnificationFactor", 1))
    return img, [float(v) / mag for v in ds.ImagerPixelSpacing]  # at the patient

def diameter(study_dir):
    for folder in sorted(glob.glob(os.path.join(study_dir, "*"))):
        head = pydicom.dcmread(glob.glob(os.path.join(folder, "*.dcm"))[0], stop_before_pixels=True)
        if head.Modality == "DX":
            img, spacing = radiograph(folder)
            return measure_2d(img, spacing, model["DX"]["threshold"])
        first, vol, spacing = load(folder)
        if first.Modality == "CT":
            return measure(vol, spacing, model["CT"]["threshold"])
        if first.Modality == "MR" and float(first.EchoTime) > 60:  # T2 by its echo time
            return measure(vol, spacing, model["MR"]["threshold"])
    raise SystemExit(f"no measurable series in {study_dir}")

with open(out, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["id", "diameter_mm", "prior_mm", "change"])
    for pid in task["patients"]:
        if wanted and pid not in wanted:
            continue
        prior_dir, current_dir = sorted(glob.glob(os.path.join("data/dicom", pid, "*")))
        d, p = diameter(current_dir), diameter(prior_dir)
        change = "larger" if d - p > CHANGE_MM else ("smaller" if p - d > CHANGE_MM else "stable")
        w.writerow([pid, f"{d:.1f}", f"{p:.1f}", change])
