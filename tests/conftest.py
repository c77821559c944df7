"""Shared fixtures: a private cache, so tests never touch the user's banks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Set before any test imports bat_gym, and inherited by spawned workers.
    cache = Path(config.rootpath) / ".pytest-bat-cache"
    os.environ.setdefault("BAT_GYM_CACHE", str(cache))


@pytest.fixture(scope="session")
def toy():
    from bat_gym.registry import get_benchmark

    return get_benchmark("toy_pipeline")


@pytest.fixture(scope="session")
def toy_bank(toy, tmp_path_factory):
    """A bank of the toy benchmark: every focus x track, two tasks per track."""
    from bat_gym.bank import build_bank

    return build_bank(toy, tmp_path_factory.mktemp("bank") / "toy", tasks_per_track=2)
