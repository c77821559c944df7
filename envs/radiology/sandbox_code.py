"""The code the radiology teacher and the naive baseline run inside a task's sandbox.

Real files in ``scripts/``, a data folder (no ``__init__.py``; the suite never imports
them, they run only in a sandbox), read as text and sent into the sandbox, so ruff
lints them and a test compiles every one:

* ``infer.py``: the teacher's ``pipeline/infer.py``. Its docstring documents it here
  and is not sent (:func:`pipeline`).
* ``naive_load.py``, ``naive_radiograph.py``, ``naive_diameter.py``: the naive
  baseline's three mistakes (stored values taken as HU; a radiograph's photometry and
  detector spacing trusted; the MR series picked by its description), each a patch of
  one function of ``infer.py``. The naive pipeline is ``infer.py`` with the three
  replaced, line for line (:func:`naive_pipeline`).
* ``s2_setup.py``, ``s3_validate.py``, ``s4_infer.py``, ``s5_submit.py`` and
  ``naive_s2_setup.py``: the stage scripts, with slots (:func:`stage_script`):
  ``SLOT_PIPELINE`` takes a pipeline's text as a value, ``SLOT_RECEIPT`` the code of
  ``receipt.py``, the helper that writes an artifact's receipt (:data:`RECEIPT`), and
  S3's ``SLOT_CHECK`` the code of ``pilot_check.py``, the pilot's check: the studies
  read as the model card says, apart from the pipeline (:data:`CHECK`).

The names the scripts get from a slot are declared as builtins in this folder's
``ruff.toml``, so ruff still reports any other undefined name. The reading, the slots
and the patches are :mod:`bat_gym.core.scripts`'s. The text sent is the one the teacher has
always sent, byte for byte, so its transcripts and the states built from them do not
depend on this layout.
"""

from __future__ import annotations

import functools
from pathlib import Path

from bat_gym.core.scripts import fill_slots, replace_function, without_docstring

__all__ = [
    "SCRIPT_DIR",
    "NAIVE_PATCHES",
    "RECEIPT",
    "CHECK",
    "script",
    "pipeline",
    "naive_pipeline",
    "stage_script",
]

SCRIPT_DIR = Path(__file__).with_name("scripts")
"""The folder of the scripts."""

NAIVE_PATCHES = ("naive_load", "naive_radiograph", "naive_diameter")
"""The naive baseline's patches of ``infer.py``, one function each, applied in order."""


@functools.cache
def script(name: str) -> str:
    """The text of ``scripts/<name>.py``, as it is on disk.

    Raises:
        FileNotFoundError: there is no such script.
    """
    return (SCRIPT_DIR / f"{name}.py").read_text(encoding="utf-8")


def _sent(source: str) -> str:
    # The pipeline the teacher writes has always begun with an empty line; kept, so
    # the file in the sandbox and every transcript that writes it stay as they were.
    return "\n" + without_docstring(source)


def pipeline() -> str:
    """The text the teacher writes to ``pipeline/infer.py``: ``infer.py`` less its docstring."""
    return _sent(script("infer"))


def naive_pipeline() -> str:
    """The naive baseline's ``pipeline/infer.py``: ``infer.py`` with each patch applied.

    Raises:
        PluginError: a patch defines no function or several, or one ``infer.py`` lacks
            (see :func:`bat_gym.core.scripts.replace_function`).
    """
    source = script("infer")
    for patch in NAIVE_PATCHES:
        source = replace_function(source, script(patch), f"scripts/{patch}.py")
    return _sent(source)


RECEIPT = without_docstring(script("receipt"))
"""The receipt helper's code, for a stage script's ``SLOT_RECEIPT``."""

CHECK = without_docstring(script("pilot_check"))
"""The pilot check's code, for ``s3_validate.py``'s ``SLOT_CHECK``."""


def stage_script(name: str, **slots: object) -> str:
    """The stage script ``scripts/<name>.py``, docstring left out, slots filled.

    Args:
        name: the script's file name without ``.py`` (``s2_setup``, ...).
        **slots: code or value by slot key in lower case (see
            :func:`bat_gym.core.scripts.fill_slots`).

    Raises:
        PluginError: a slot of the script is not given, or one given is not in it.
    """
    return fill_slots(without_docstring(script(name)), f"scripts/{name}.py", **slots)
