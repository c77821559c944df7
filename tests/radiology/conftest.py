"""Fixtures for the radiology suite: the benchmark, and a skip where Orthanc is missing.

:func:`play` drives an env with scripted turns, for the suite and check tests.
"""

from __future__ import annotations

import pytest

from bat_gym.core.protocol import get_protocol

HERMES = get_protocol("hermes")


def play(env, turns):
    """Step ``env`` with ``turns`` (Hermes-rendered) until the episode ends: (reward, info)."""
    for t in turns:
        _, reward, terminated, truncated, info = env.step(HERMES.render(t.content, list(t.calls)))
        if terminated or truncated:
            return reward, info
    raise AssertionError("the script never ended the episode")


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
