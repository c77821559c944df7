"""The seven MedBench-Lite tracks, one module each."""

from __future__ import annotations

from bat_gym.envs.medbench_lite.tracks.base import TrackBase
from bat_gym.envs.medbench_lite.tracks.classification import Classification
from bat_gym.envs.medbench_lite.tracks.detection import Detection
from bat_gym.envs.medbench_lite.tracks.enhancement import Enhancement
from bat_gym.envs.medbench_lite.tracks.report import Report
from bat_gym.envs.medbench_lite.tracks.segmentation import Segmentation
from bat_gym.envs.medbench_lite.tracks.synthesis import Synthesis
from bat_gym.envs.medbench_lite.tracks.vqa import Vqa

__all__ = ["TRACKS", "TrackBase", "get_track"]

TRACKS: tuple[TrackBase, ...] = (
    Segmentation(),
    Classification(),
    Detection(),
    Enhancement(),
    Synthesis(),
    Vqa(),
    Report(),
)


def get_track(name: str) -> TrackBase:
    """The track called ``name``."""
    for t in TRACKS:
        if t.name == name:
            return t
    raise KeyError(f"unknown track {name!r}; tracks: {[t.name for t in TRACKS]}")
