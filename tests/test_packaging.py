"""The wheel holds every file the package reads at run time.

An editable install reads the source tree, so a module, contract or script left out
of ``pyproject.toml``'s package list or package data passes every other test and fails
only for a user who installed from a wheel. This test builds a real wheel from the
tracked files and compares.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Source folder -> its import path in the installed package (pyproject's package-dir).
PACKAGE_DIRS = {
    "bat_gym": "bat_gym",
    "envs": "bat_gym/envs",
    "rubrics": "bat_gym/rubrics",
    "trainers": "bat_gym/trainers",
}
# Files the package never reads: lint settings of the script folders.
NOT_SHIPPED = {"ruff.toml"}


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout of the project")
    return [line for line in out.splitlines() if line]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    src = tmp_path_factory.mktemp("src")
    for rel in _tracked():
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})",
        ],
        cwd=src,
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def test_the_wheel_ships_every_tracked_package_file(wheel_names):
    expected = set()
    for rel in _tracked():
        top, _, rest = rel.partition("/")
        if top in PACKAGE_DIRS and rest and Path(rel).name not in NOT_SHIPPED:
            expected.add(f"{PACKAGE_DIRS[top]}/{rest}")
    missing = sorted(expected - wheel_names)
    assert not missing, (
        f"left out of the wheel (add to pyproject's packages/package-data): {missing}"
    )


def test_every_registered_suite_imports_from_the_wheel_layout(wheel_names):
    # The entry points name modules; each must be a file in the wheel.
    for suite in ("toy_pipeline", "skill_ladder", "medbench_lite", "radiology"):
        assert f"bat_gym/envs/{suite}/__init__.py" in wheel_names, suite
