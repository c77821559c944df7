"""Fixtures for the radiology suite: the benchmark, and a skip where Orthanc is missing."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def orthanc():
    """The Orthanc binary's path, or a skip that names the install command."""
    from bat_gym.envs.radiology.orthanc import OrthancMissing, find_orthanc

    try:
        return find_orthanc()
    except OrthancMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def radiology():
    from bat_gym.catalog import get_benchmark

    return get_benchmark("radiology")
