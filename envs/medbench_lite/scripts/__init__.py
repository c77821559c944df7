"""The code the MedBench-Lite teacher runs inside a task's sandbox, one real file each.

Each track has a folder ``<track>/`` of Python files, read as text and sent into the
sandbox (never imported here), so ruff lints them and a test compiles every one:

* ``pipeline.py``: the correct ``pipeline/infer.py``, sent as it is.
* ``pipeline_bug.py`` (and ``pipeline_naive.py`` where the naive baseline differs): the
  track's realistic mistake as a patch. It holds one function named like a function of
  ``pipeline.py``; the variant is ``pipeline.py`` with that function replaced, line for
  line (:func:`pipeline_variant`). Its docstring and imports are for readers and ruff.
* ``s2_inspect.py``, ``s2_smoke.py``, ``s3_pilot.py``, ``s3_weak_pilot.py`` and
  ``s5_submit_check.py``: fragments the teacher splices into its stage scripts
  (:func:`stage_script`). A fragment's one-line docstring says what it checks and is
  not sent (:func:`fragment`). What the stage script gives it, and what it must set:

  ================== ============================================ =====================
  fragment           given                                        sets
  ================== ============================================ =====================
  s2_inspect         ``case_ids``; ``json``, ``os``               ``compat`` (JSON-able)
  s2_smoke           ``infer_lib`` (model/infer_lib.py), ``W``    ``smoke`` (JSON-able)
  s3_pilot, s3_weak  ``case_ids``, ``infer`` (pipeline/infer.py)  ``case_id``, ``checks``
  s5_submit_check    ``rows`` (in case order), ``problems``       appends to ``problems``
  ================== ============================================ =====================

  ``checks`` maps a check's name to ``{"value", "expect", "ok"}``; the pilot script
  fails the stage when one is not ok, the submit script when ``problems`` is not empty.
  The names given are declared as builtins in this folder's ``ruff.toml``, so ruff
  still reports any other undefined name.

The teacher's own stage scripts, the same for every track, are in ``stages/``: each a
real file with slots (:func:`stage_script`) where a track's fragments and values go.
The reading, the slots and the patches are :mod:`bat_gym.core.scripts`'s.

The text is sent byte for byte (surrounding whitespace aside), so the teacher's
transcripts and the states built from them do not depend on this layout.
"""

from __future__ import annotations

import functools
from pathlib import Path

from bat_gym.core.scripts import Source, fill_slots, replace_function, without_docstring

__all__ = [
    "script",
    "fragment",
    "pipeline_variant",
    "recipe_scripts",
    "stage_script",
    "Source",
    "SCRIPT_DIR",
]

SCRIPT_DIR = Path(__file__).parent
"""The folder of the per-track script folders and of ``stages/``."""


@functools.cache
def script(track: str, name: str) -> str:
    """The text of ``<track>/<name>.py``, as it is on disk.

    Raises:
        FileNotFoundError: the track has no such script.
    """
    return (SCRIPT_DIR / track / f"{name}.py").read_text(encoding="utf-8")


def fragment(track: str, name: str) -> str:
    """A fragment's code without its module docstring: what the stage script splices in."""
    return without_docstring(script(track, name))


def pipeline_variant(track: str, patch: str) -> str:
    """``pipeline.py`` with its function of the name defined in ``<patch>.py`` replaced.

    Raises:
        PluginError: the patch defines no function or several, or one the pipeline
            lacks (see :func:`bat_gym.core.scripts.replace_function`).
    """
    return replace_function(script(track, "pipeline"), script(track, patch), f"{track}/{patch}.py")


def recipe_scripts(track: str) -> dict[str, str]:
    """A track's sandbox code as :class:`~bat_gym.envs.medbench_lite.teacher.Recipe` fields.

    Returns:
        ``inspect``, ``smoke``, ``pipeline``, ``pipeline_bug``, ``naive_pipeline``,
        ``pilot``, ``weak_pilot`` and ``submit_check``. The naive baseline runs
        ``pipeline_naive.py``'s variant where the track has one, else the buggy one.
    """
    bug = pipeline_variant(track, "pipeline_bug")
    naive = (
        pipeline_variant(track, "pipeline_naive")
        if (SCRIPT_DIR / track / "pipeline_naive.py").is_file()
        else bug
    )
    return {
        "inspect": fragment(track, "s2_inspect"),
        "smoke": fragment(track, "s2_smoke"),
        "pipeline": script(track, "pipeline"),
        "pipeline_bug": bug,
        "naive_pipeline": naive,
        "pilot": fragment(track, "s3_pilot"),
        "weak_pilot": fragment(track, "s3_weak_pilot"),
        "submit_check": fragment(track, "s5_submit_check"),
    }


def stage_script(name: str, **slots: object) -> str:
    """The teacher's stage script ``stages/<name>.py``, docstring left out, slots filled.

    Args:
        name: the stage script's file name without ``.py`` (``s2_setup``, ...).
        **slots: code or value by slot key in lower case (see
            :func:`bat_gym.core.scripts.fill_slots`).

    Raises:
        PluginError: a slot of the script is not given, or one given is not in it.
    """
    return fill_slots(fragment("stages", name), f"stages/{name}.py", **slots)
