"""Module paths from before the folders by layer still import, as the same modules."""

import importlib
import subprocess
import sys

import pytest

from bat_gym.core.moved import MOVED, new_name


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_names_a_module_that_exists(old):
    assert importlib.util.find_spec(MOVED[old]) is not None


def test_an_old_path_is_the_new_module_itself_and_says_where_it_went():
    # A fresh interpreter: this one imported the new paths long ago.
    code = """
import warnings
warnings.simplefilter("error")
try:
    import bat_gym.errors
except DeprecationWarning as w:
    print(w)
warnings.simplefilter("ignore")
import bat_gym.errors as old, bat_gym.core.errors as new
from bat_gym.sandbox.local import LocalSandbox
from bat_gym.exploits.policies import Exploit
import bat_gym.audits.exploits.policies as policies
from bat_gym.rubrics.reward import RubricReward
from bat_gym.rubrics.verifier.reward import RubricReward as Reward
assert old is new and new.__spec__.name == "bat_gym.core.errors"
assert LocalSandbox.__module__ == "bat_gym.core.sandbox.local"
assert Exploit is policies.Exploit and RubricReward is Reward
print("same")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "bat_gym.errors moved to bat_gym.core.errors; import it from there",
        "same",
    ]


def test_only_moved_paths_are_answered():
    assert new_name("bat_gym.sandbox.local") == "bat_gym.core.sandbox.local"
    assert new_name("bat_gym.rubrics.tool_checks") == "bat_gym.rubrics.verifier.checks.tool"
    assert new_name("bat_gym.rubrics.contract") is None  # a package of its own now
    assert new_name("bat_gym.bank") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("bat_gym.no_such_module")
