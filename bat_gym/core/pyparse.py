"""Parse Python source safely from any thread: one process-wide lock around ``ast.parse``.

CPython 3.11 and 3.12 keep the AST constructor's recursion depth in state shared by
the threads of an interpreter, so two ``ast.parse`` calls at once can fail with
``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905). The
verifier parses agent code while other threads (evaluation workers, the bank builder,
teachers rendering scripts) parse too; a spurious error there would change a check's
verdict, and so the reward. Every parse in the library goes through :func:`parse`.
"""

from __future__ import annotations

import ast
import threading

__all__ = ["parse"]

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)`` under the process-wide parse lock.

    A ``SystemError`` from the race above (a parse outside this library, in another
    thread, can still collide with ours) is retried once; a second one is raised.

    Raises:
        SyntaxError, ValueError: as ``ast.parse`` does for bad source.
    """
    with _LOCK:
        try:
            return ast.parse(source, filename=filename)
        except SystemError:
            return ast.parse(source, filename=filename)
