"""The provided measurement model, shipped inside every radiology task.

``measure.py`` is copied verbatim into a task as ``model/measure.py``, so it may import
nothing but numpy and the standard library. The verifier imports the same module to
compute the reference diameters, so the model the agent runs and the model the scorer
trusts are one file.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MEASURE_PATH", "measure_source"]

MEASURE_PATH = Path(__file__).with_name("measure.py")
"""The model's file."""


def measure_source() -> str:
    """The text of ``measure.py``, as written to ``model/measure.py``."""
    return MEASURE_PATH.read_text(encoding="utf-8")
