import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "bat_gym.rubrics.verifier.scoring",
        "bat_gym.rubrics.contract.workspace",
        "bat_gym.rubrics.verifier.reading",
        "bat_gym.rubrics.verifier.invocation",
    ],
)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
