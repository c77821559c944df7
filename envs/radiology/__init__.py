"""radiology: lesion growth over a live Orthanc DICOM server, with typed DICOM tools.

Each task is a few synthetic patients with a current and a prior CT or MR study
(:mod:`.studies`, made with pydicom), stored on the env's own Orthanc
(:mod:`.orthanc`, :mod:`.service`) and exported under ``data/dicom``. Besides
``execute_code`` the agent has typed DICOM tools (:mod:`.tools`): find studies and
series, read headers, fetch a window/levelled slice, measure a region, store an
annotation, submit a structured finding. The server's state (studies, annotations,
findings) is part of every stage state. Needs Debian's ``orthanc`` package
(``apt-get update && apt-get install -y orthanc``).
"""

from bat_gym.envs.radiology.suite import Radiology

__all__ = ["Radiology", "benchmark"]


def benchmark() -> Radiology:
    """Entry point for the ``bat_gym.benchmarks`` group."""
    return Radiology()
