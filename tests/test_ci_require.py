"""CI's rule: once a service's set-up succeeded, a skip of its tests fails the run."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import pytest

@pytest.fixture
def orthanc():
    pytest.skip("Orthanc is not installed (apt-get install orthanc)")

def test_needs_orthanc(orthanc):
    pass

@pytest.mark.docker
def test_needs_docker():
    pytest.skip("no Docker engine answers")

def test_needs_a_browser():
    pytest.skip("no chromium and chromedriver on PATH")

def test_plain_skip():
    pytest.skip("the slow path is elsewhere")

@pytest.mark.docker
def test_a_docker_test_skipped_for_the_machine():
    pytest.skip("one CPU: no affinity to narrow")
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_services=TESTS)
    pytester.makeini("[pytest]\nmarkers =\n    docker: needs Docker\n")
    return pytester


def test_without_the_variable_missing_services_skip(suite, monkeypatch):
    monkeypatch.delenv("BAT_GYM_REQUIRE", raising=False)
    suite.runpytest("-p", "no:xdist").assert_outcomes(skipped=5)


def test_a_required_service_that_skips_fails_and_says_why(suite, monkeypatch):
    monkeypatch.setenv("BAT_GYM_REQUIRE", "docker orthanc")
    result = suite.runpytest("-p", "no:xdist")
    # A skip in a fixture fails the test's set-up (an error), one in its body the test.
    result.assert_outcomes(failed=1, errors=1, skipped=3)
    result.stdout.fnmatch_lines(["*the orthanc set-up succeeded*it skipped: Orthanc is not*"])
    result.stdout.fnmatch_lines(["*the docker set-up succeeded*it skipped: no Docker engine*"])
    monkeypatch.setenv("BAT_GYM_REQUIRE", "browser")
    suite.runpytest("-p", "no:xdist").assert_outcomes(failed=1, skipped=4)
