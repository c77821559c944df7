"""The provided measurement model: a lesion's equivalent-sphere diameter.

measure(volume, spacing_mm, threshold) -> diameter in mm, one decimal:
  the voxels above `threshold` (modality units: HU for CT) are the lesion, and the
  diameter is that of a sphere of their total volume, (6 V / pi) ** (1 / 3).
volume: (slices, rows, cols) array; spacing_mm: (slice, row, column) spacing in mm.
"""
import math

import numpy as np


def measure(volume, spacing_mm, threshold):
    voxels = int((np.asarray(volume) > threshold).sum())
    cc = voxels * spacing_mm[0] * spacing_mm[1] * spacing_mm[2]
    return round((6.0 * cc / math.pi) ** (1.0 / 3.0), 1)


def measure_2d(image, spacing_mm, threshold):
    """A projection image's lesion: the diameter of a circle of the area above threshold.

    image: (rows, cols) array of displayed values; spacing_mm: (row, column) at the patient.
    """
    pixels = int((np.asarray(image) > threshold).sum())
    area = pixels * spacing_mm[0] * spacing_mm[1]
    return round(2.0 * math.sqrt(area / math.pi), 1)
