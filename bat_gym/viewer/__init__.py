"""``bat-gym view``: see what an agent did, stage by stage, and why it was scored so.

Reads evaluation runs, Stage Banks, GRPO and BiCuRL run directories
(:mod:`~bat_gym.viewer.runs`), renders their pages (:mod:`~bat_gym.viewer.site`),
serves them on 127.0.0.1 (:mod:`~bat_gym.viewer.serve`) or writes them as a folder
that opens from disk, and exports evaluations as Inspect eval logs
(:mod:`~bat_gym.viewer.export`).
"""

from bat_gym.viewer.export import inspect_log
from bat_gym.viewer.images import ImageError, to_png
from bat_gym.viewer.runs import Run, ViewerError, load_runs
from bat_gym.viewer.serve import make_server
from bat_gym.viewer.site import Site

__all__ = [
    # reading runs
    "Run",
    "ViewerError",
    "load_runs",
    # pages, served or written
    "Site",
    "make_server",
    # artifacts and export
    "ImageError",
    "inspect_log",
    "to_png",
]
