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

The text is sent byte for byte (surrounding whitespace aside), so the teacher's
transcripts and the states built from them do not depend on this layout.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from bat_gym.errors import PluginError

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
"""The folder of the per-track script folders."""


@functools.cache
def script(track: str, name: str) -> str:
    """The text of ``<track>/<name>.py``, as it is on disk.

    Raises:
        FileNotFoundError: the track has no such script.
    """
    return (SCRIPT_DIR / track / f"{name}.py").read_text(encoding="utf-8")


def _docstring_end(source: str) -> int:
    """The 1-based line where ``source``'s module docstring ends (0 without one)."""
    body = ast.parse(source).body
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.end_lineno or 0
    return 0


def fragment(track: str, name: str) -> str:
    """A fragment's code without its module docstring: what the stage script splices in."""
    source = script(track, name)
    lines = source.splitlines(keepends=True)
    return "".join(lines[_docstring_end(source) :]).strip() + "\n"


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def pipeline_variant(track: str, patch: str) -> str:
    """``pipeline.py`` with its function of the name defined in ``<patch>.py`` replaced.

    The patch file defines exactly one top-level function; its lines (decorators aside,
    which these scripts do not use) replace those of the pipeline's function of the same
    name, and every other line of the pipeline is kept as it is.

    Raises:
        PluginError: the patch defines no function or several, or one the pipeline
            lacks (a ValueError too).
    """
    base, source = script(track, "pipeline"), script(track, patch)
    patch_fns = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    if len(patch_fns) != 1:
        raise PluginError(
            f"{track}/{patch}.py must define exactly one function, found "
            f"{[f.name for f in patch_fns]}: a patch replaces one function of pipeline.py"
        )
    new = patch_fns[0]
    old = _function(ast.parse(base), new.name)
    if old is None:
        raise PluginError(
            f"{track}/{patch}.py defines {new.name}(), which {track}/pipeline.py lacks: "
            "name the patch's function after the pipeline function it replaces"
        )
    base_lines = base.splitlines(keepends=True)
    new_lines = source.splitlines(keepends=True)[new.lineno - 1 : new.end_lineno]
    return "".join(base_lines[: old.lineno - 1] + new_lines + base_lines[old.end_lineno :])


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


class Source(str):
    """Python source a value slot takes as it is written, instead of the value's ``repr``.

    For a value rendered another way on purpose, e.g. case ids as a JSON list.
    """

    __slots__ = ()


_SLOT = re.compile(r"\bSLOT_([A-Z_]+)\b")


def _value(value: object) -> str:
    return value if isinstance(value, Source) else repr(value)


def stage_script(name: str, **slots: object) -> str:
    """The teacher's stage script ``stages/<name>.py`` with its slots filled.

    A slot is a name ``SLOT_<KEY>``. Alone on its line it stands for code: the line
    becomes ``slots["<key>"]`` stripped (a fragment, or the receipt helper). Inside a
        line it stands for a value: it becomes ``repr(slots["<key>"])``, or the text itself
    for a :class:`Source`. The module docstring is left out, as for fragments.

    Args:
        name: the stage script's file name without ``.py`` (``s2_setup``, ...).
        **slots: code or value by lower-case slot key (``receipt=...``, ``out_dir=...``).

    Raises:
        PluginError: a slot of the script is not given, or a given one is not in it.
    """
    source = fragment("stages", name)
    used = {key.lower() for key in _SLOT.findall(source)}
    if used != set(slots):
        raise PluginError(
            f"stages/{name}.py has the slots {sorted(used)} but was given {sorted(slots)}: "
            "give each of its slots, and only those"
        )
    lines = []
    for line in source.splitlines(keepends=True):
        alone = _SLOT.fullmatch(line.strip())
        if alone and line.strip() == line.rstrip("\n"):
            lines.append(str(slots[alone.group(1).lower()]).strip() + "\n")
        else:
            lines.append(_SLOT.sub(lambda m: _value(slots[m.group(1).lower()]), line))
    return "".join(lines)
