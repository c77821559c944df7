"""Reading sandbox code from real files: docstrings, slots and patches keep every other byte."""

import pytest

from bat_gym.core.errors import PluginError
from bat_gym.core.scripts import Source, fill_slots, replace_function, without_docstring

PIPELINE = 'X = 1\n\n\ndef f(a):\n    """Doc."""\n    return a + 1\n\n\ndef g():\n    return f(X)\n'


def test_a_patch_replaces_the_function_of_its_name_and_keeps_every_other_line():
    patch = (
        '"""Notes."""\n\nfrom pipeline import X\n\n\ndef f(a):\n    """Doc."""\n    return a - X\n'
    )
    assert replace_function(PIPELINE, patch, "bug.py") == PIPELINE.replace("a + 1", "a - X")


@pytest.mark.parametrize(
    "patch",
    [
        "def h():\n    return 0\n",  # no such function in the pipeline
        "def f(a):\n    return a\n\n\ndef g():\n    return 0\n",  # two functions
        "X = 2\n",  # none
    ],
)
def test_a_malformed_patch_is_refused_with_the_fix(patch):
    with pytest.raises(PluginError, match="bug.py .*function"):
        replace_function(PIPELINE, patch, "bug.py")


def test_a_docstring_is_left_out_and_code_without_one_is_kept_whole():
    assert without_docstring('"""Not sent."""\n\nimport os\nx = 1\n') == "import os\nx = 1\n"
    assert without_docstring("\nsmoke = {'ok': True}\n\n") == "smoke = {'ok': True}\n"
    # A string that is not the first statement is code, not a docstring.
    assert without_docstring('x = 1\n"""kept"""\n') == 'x = 1\n"""kept"""\n'


def test_a_slot_alone_on_its_line_takes_code_and_one_inside_a_line_a_value():
    source = "import os\nSLOT_BODY\nos.makedirs(SLOT_OUT_DIR, exist_ok=True)\n"
    got = fill_slots(source, "s9.py", body="\nx = 1\ny = 2\n\n", out_dir="outputs/a b")
    assert got == "import os\nx = 1\ny = 2\nos.makedirs('outputs/a b', exist_ok=True)\n"
    # Source: a value written another way on purpose (here as JSON) goes in as it is.
    got = fill_slots(source, "s9.py", body="", out_dir=Source('"o"'))
    assert got.endswith('os.makedirs("o", exist_ok=True)\n')


def test_an_indented_slot_is_a_value_not_a_line_of_code():
    got = fill_slots("if True:\n    SLOT_X\n", "s9.py", x="a")
    assert got == "if True:\n    'a'\n"


@pytest.mark.parametrize("slots", [{"body": "x = 1"}, {"body": "x", "out_dir": "o", "extra": 1}])
def test_a_missing_or_unknown_slot_is_refused(slots):
    with pytest.raises(PluginError, match="s9.py has the slots"):
        fill_slots("SLOT_BODY\nprint(SLOT_OUT_DIR)\n", "s9.py", **slots)
