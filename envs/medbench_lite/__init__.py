"""MedBench-Lite: seven synthetic medical-imaging tracks as staged benchmark tasks.

Every task is generated on the spot from a seed (no downloads, no patient data): real
file formats (NIfTI, DICOM, PNG), a small numpy "pretrained" model with a model card,
and a five-stage workflow (plan, setup, validate, infer, submit) with receipts. Each
track hides one trap that only a real validation catches:

* ``segmentation`` (Dice): CT volumes stored in non-RAS+ voxel orders; the model's side
  prior needs RAS+.
* ``classification`` (balanced accuracy): DICOM with RescaleSlope/Intercept, some
  MONOCHROME1 (inverted).
* ``detection`` (mAP@0.5): the model returns boxes as (row, col); the submission wants
  (x, y).
* ``enhancement`` (scaled SSIM): the denoiser works in a normalized intensity window,
  not in HU.
* ``synthesis`` (SSIM in mask): scanner gains differ; the model wants foreground-
  normalized input.
* ``vqa`` (exact match): images in radiological or neurological display convention.
* ``report`` (finding F1 + size accuracy): sizes come out in voxels unless the voxel
  spacing in mm is passed.
"""

from bat_gym.envs.medbench_lite.suite import MedBenchLite

__all__ = ["MedBenchLite", "benchmark"]


def benchmark() -> MedBenchLite:
    """Entry point for the ``bat_gym.benchmarks`` group."""
    return MedBenchLite()
