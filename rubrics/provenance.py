"""Reading what the sandbox observed of a call: did it run a workspace script?

A call *ran* ``entry`` when the record shows, from the host's own observation
(:class:`bat_gym.sandbox.base.Provenance`):

* a program run whose path is the script, or whose argv names it (as a file
  argument, resolved against the run's working directory, or as ``-m`` with its
  dotted module name), and that exited 0; or
* for code the sandbox runs in its own interpreter (``python`` calls, which execute
  no program of their own), a read of the script's file together with code that runs
  it (:func:`bat_gym.rubrics.invocation.runs_script`) and a call that exited 0: the
  observed read is the evidence, the reading of the code says how it was used. A
  ``bash`` call gets no such reading: ``python -c 'import infer'`` is a program run,
  and it counts only if it names the script.

A path counts only inside the workspace (:attr:`ExecutionRecord.workspace_root`):
a look-alike copy under ``/tmp`` runs other code. A call with no observation
(``runs`` is ``None``) is left to the caller, which falls back to reading the code.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from bat_gym.record import ProgramRun, ToolCallRecord
from bat_gym.rubrics.invocation import Script, runs_script

__all__ = ["observed_run_of", "ran_ok"]


def ran_ok(run: ProgramRun, call: ToolCallRecord) -> bool:
    """The run exited 0; where the kernel gave no status, the call as a whole did."""
    if run.exit_code is not None:
        return run.exit_code == 0
    return not run.replaced and call.succeeded


def _names(run: ProgramRun, script: Script, root: str) -> bool:
    target = posixpath.join(root, script.path)
    cwd = run.cwd or root

    def at(arg: str) -> bool:
        return posixpath.normpath(posixpath.join(cwd, arg)) == target

    if at(run.path):
        return True
    args = run.argv[1:]
    for i, arg in enumerate(args):
        if at(arg):
            return True
        if arg == "-m" and i + 1 < len(args) and args[i + 1] == script.dotted:
            return cwd == root  # ``python -m pipeline.infer`` from the workspace root
    return False


def _read_script(reads: Sequence[str], script: Script) -> bool:
    """The script's source was read, or its cached bytecode (which Python loads instead)."""
    cache = posixpath.join(script.directory, "__pycache__", script.stem + ".")
    return script.path in reads or any(r.startswith(cache) and r.endswith(".pyc") for r in reads)


def observed_run_of(call: ToolCallRecord, entry: str, root: str) -> str | None:
    """How the record shows ``call`` ran ``entry``, or None; the call must have runs."""
    script = Script(entry)
    for run in call.runs or ():
        if _names(run, script, root) and ran_ok(run, call):
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
