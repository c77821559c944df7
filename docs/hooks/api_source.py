"""A source tree of the installed package's layout for the API pages (an mkdocs hook).

``rubrics/``, ``envs/`` and ``trainers/`` sit at the repository's top level and install
as ``bat_gym.rubrics``, ``bat_gym.envs`` and ``bat_gym.trainers`` (pyproject's
``package-dir``). mkdocstrings reads source statically and cannot follow that mapping,
so this hook links the four folders into one ``bat_gym/`` under a temporary directory
and points the Python handler there, before the handler reads its options.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
MAPPED = ("rubrics", "envs", "trainers")


def _linked_tree() -> Path:
    top = Path(tempfile.mkdtemp(prefix="bat-gym-api-"))
    atexit.register(shutil.rmtree, top, ignore_errors=True)
    package = top / "bat_gym"
    package.mkdir()
    for entry in (ROOT / "bat_gym").iterdir():
        (package / entry.name).symlink_to(entry)
    for name in MAPPED:
        (package / name).symlink_to(ROOT / name, target_is_directory=True)
    return top


@event_priority(100)  # before mkdocstrings hands its options to the handler
def on_config(config):
    """Point mkdocstrings' Python handler at the linked tree."""
    python = config["plugins"]["mkdocstrings"].config["handlers"].setdefault("python", {})
    python["paths"] = [str(_linked_tree())]
    return config
