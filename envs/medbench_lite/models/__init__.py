"""The "pretrained" models shipped inside MedBench-Lite tasks, one numpy-only file each.

Each module here is copied verbatim into a task as ``model/infer_lib.py``, so it may
import nothing but numpy and the standard library. The generators import the same
modules to compute reference outputs, so the model the agent runs and the model the
scorer trusts are one file.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["model_source"]


def model_source(track: str) -> str:
    """The source text of a track's model module, as written to ``model/infer_lib.py``."""
    path = Path(__file__).with_name(f"{track}.py")
    return path.read_text(encoding="utf-8")
