"""Shared fixtures: a private cache, so tests never touch the user's banks.

And the rule that makes CI mean what it says: ``BAT_GYM_REQUIRE`` names the services
whose set-up succeeded (``.ci/run`` sets it: any of ``docker``, ``browser``,
``orthanc``), and a test of such a service that skips fails instead, with the skip's
reason. Without the variable a missing service skips its tests, as on a laptop.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Set before any test imports bat_gym, and inherited by spawned workers.
    cache = Path(config.rootpath) / ".pytest-bat-cache"
    os.environ.setdefault("BAT_GYM_CACHE", str(cache))


# The files that take longest (about 20 to 110 s each on two cores), handed out first:
# `--dist loadfile` gives whole files to the workers in collection order, and a long file
# near the end leaves one worker running it alone while the other waits.
_LONGEST_FIRST = (
    "medbench_lite/test_heuristics.py",
    "medbench_lite/test_rubrics.py",
    "test_hostile.py",
    "docs/test_new_benchmark.py",
    "bank/test_default.py",
    "bank/test_build.py",
    "radiology/test_repair.py",
    "test_exploits.py",
    "sandbox/test_requirements.py",
    "medbench_lite/test_pilots.py",
    "medbench_lite/test_episodes.py",
    "sandbox/test_docker.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}

    def order(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        return rank.get(path, len(rank))

    items.sort(key=order)  # stable: every other file keeps its place


# A service's skip: one of its fixture's, or a reason that names it. (Not every skip of a
# test marked `docker` is: "one CPU: no affinity to narrow" is the machine's.)
_SERVICES = {
    "docker": ("docker_client", ("docker",)),
    "browser": (None, ("chromium", "chromedriver", "selenium")),
    "orthanc": ("orthanc", ("orthanc",)),
}


def _required_service(item: pytest.Item, reason: str) -> str | None:
    """The required service (``BAT_GYM_REQUIRE``) whose test ``item`` is, if any."""
    required = os.environ.get("BAT_GYM_REQUIRE", "").replace(",", " ").split()
    for service in required:
        fixture, words = _SERVICES.get(service, (None, (service,)))
        if (fixture and fixture in getattr(item, "fixturenames", ())) or any(
            w in reason.lower() for w in words
        ):
            return service
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    reason = reason.removeprefix("Skipped: ")
    service = _required_service(item, reason)
    if service is not None:
        report.outcome = "failed"
        report.longrepr = (
            f"the {service} set-up succeeded (BAT_GYM_REQUIRE={os.environ['BAT_GYM_REQUIRE']}), "
            f"so its test may not skip; it skipped: {reason}"
        )


@pytest.fixture(scope="session")
def toy():
    from bat_gym.catalog import get_benchmark

    return get_benchmark("toy_pipeline")


@pytest.fixture(scope="session")
def toy_bank(toy, tmp_path_factory):
    """A bank of the toy benchmark: every focus x track, two tasks per track."""
    from bat_gym.bank import build_bank

    return build_bank(toy, tmp_path_factory.mktemp("bank") / "toy", tasks_per_track=2)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    # Token auth would write a token under the home folder; a short temp dir keeps the
    # socket paths under the kernel's 107-byte limit.
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
        yield
        ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_client():
    """A Docker SDK client to a live engine that has the sandbox base image, or a skip.

    ``.ci/docker-setup.sh`` sets the engine and the image up.
    """
    pytest.importorskip(
        "docker", reason="the docker SDK is not installed: pip install 'bat-gym[docker]'"
    )
    from bat_gym.core.errors import SandboxUnavailable
    from bat_gym.core.sandbox.docker import connect
    from bat_gym.core.sandbox.docker_image import ensure_image

    try:
        client = connect(timeout_s=30)
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    try:
        ensure_image(client=client)
    except SandboxUnavailable as exc:
        client.close()
        pytest.skip(f"the sandbox base image is not available: {exc}")
    yield client
    client.close()
