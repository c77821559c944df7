"""Reading what the sandbox observed of a call: did it run a workspace script?

A call *ran* ``entry`` when the record shows, from the host's own observation
(:class:`bat_gym.core.sandbox.base.Provenance`):

* a program run that executed the script (its path, or an interpreter's program
  operand resolved against the run's working directory, or ``python -m`` with its
  dotted name from the workspace root), that exited 0, in a call that read the
  script (where reads are observed); or
* for code the sandbox runs in its own interpreter (``python`` calls, which execute
  no program of their own), a read of the script's file together with code that runs
  it (:func:`bat_gym.rubrics.verifier.invocation.runs_script`) and a call that exited 0: the
  observed read is the evidence, the reading of the code says how it was used. A
  ``bash`` call gets no such reading: ``python -c 'import infer'`` is a program run,
  and it counts only if it names the script.

A path counts only inside the workspace (:attr:`ExecutionRecord.workspace_root`):
a look-alike copy under ``/tmp`` runs other code. A call with no observation
(``runs`` is ``None``) is left to the caller, which falls back to reading the code.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from bat_gym.core.record import ProgramRun, ToolCallRecord
from bat_gym.rubrics.verifier.invocation import Script, runs_script

__all__ = ["observed_run_of", "ran_ok"]


def ran_ok(run: ProgramRun, call: ToolCallRecord) -> bool:
    """The run exited 0; where the kernel gave no status, the call as a whole did."""
    if run.exit_code is not None:
        return run.exit_code == 0
    return not run.replaced and call.succeeded


_INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|bash|sh|dash)$")
# Interpreter options that take the next argument as their value.
_VALUED = frozenset({"-W", "-X", "-Q", "-o", "-O", "--rcfile", "--init-file"})


def _runs_script(run: ProgramRun, script: Script, root: str) -> bool:
    """``run`` executed the script: directly, or as an interpreter's program argument.

    The program argument is the interpreter's first operand (``python -u x.py``,
    ``bash x.sh``) or ``python -m dotted.name`` from the workspace root; the script named
    anywhere else (``true x.py``, ``cat x.py``, after ``-c``) is not a run of it.
    """
    target = posixpath.join(root, script.path)
    cwd = run.cwd or root

    def at(arg: str) -> bool:
        return posixpath.normpath(posixpath.join(cwd, arg)) == target

    if at(run.path):
        return True
    if not _INTERPRETER.match(posixpath.basename(run.path)):
        return False
    args = iter(run.argv[1:])
    for arg in args:
        if arg in ("-c", "--command"):
            return False  # code on the command line, the rest are its arguments
        if arg == "-m":
            return next(args, None) == script.dotted and cwd == root
        if arg in _VALUED:
            next(args, None)
        elif not arg.startswith("-") or arg == "-":
            return at(arg)
    return False


def _read_script(reads: Sequence[str], script: Script) -> bool:
    """The script's source was read, or its cached bytecode (which Python loads instead)."""
    cache = posixpath.join(script.directory, "__pycache__", script.stem + ".")
    return script.path in reads or any(r.startswith(cache) and r.endswith(".pyc") for r in reads)


def observed_run_of(call: ToolCallRecord, entry: str, root: str) -> str | None:
    """How the record shows ``call`` ran ``entry``, or None; the call must have runs."""
    script = Script(entry)
    # Running the script reads it; a record that saw reads and not this one saw no run.
    read = call.reads is None or _read_script(call.reads, script)
    for run in call.runs or ():
        if read and _runs_script(run, script, root) and ran_ok(run, call):
            return f"ran {' '.join(run.argv)[:120]!r} (exit {run.exit_code})"
    # Only a python call runs code in the sandbox's own interpreter: a bash call that
    # imports the script inside `python -c` is a program run like any other, and it
    # must name the script and exit 0 to count.
    if (
        call.language == "python"
        and _read_script(call.reads or (), script)
        and call.succeeded
        and runs_script(call.code, call.language, entry)
    ):
        return f"read {entry} and ran it in the sandbox's interpreter"
    return None
