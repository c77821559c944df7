"""Progress of long operations: what the library reports, and how it is shown.

Code that can run for more than a few seconds (building a bank or the default states,
an audit, an evaluation) opens a :class:`ProgressTask` on the current reporter and
advances it; it never prints. Who shows it is chosen once, by whoever drives the
library:

* library use (``gym.make``, :func:`~bat_gym.bank.build_bank`, ...): :class:`LogReporter`,
  the default, which logs a line at the start and the end of each task on the
  ``bat_gym`` logger (INFO) and nothing in between, so a non-terminal is never spammed;
* the command line: :func:`for_cli` picks :class:`RichReporter` (a live display on
  stderr: done / total, rate, ETA) when stdout is a terminal and ``--quiet`` is not
  given, and :class:`SilentReporter` otherwise.

Install one for a block with :func:`use`; the reporter is process-wide (worker threads
report to it too), not per thread.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "ProgressTask",
    "Reporter",
    "SilentReporter",
    "LogReporter",
    "RichReporter",
    "current",
    "use",
    "task",
    "for_cli",
]

log = logging.getLogger("bat_gym")

_SHOW_DONE_S = 2.0  # a task that took longer gets a "done in" line when it ends


class ProgressTask:
    """One operation's progress: ``done`` of ``total`` units (``total`` None: unknown).

    Use it as a context manager, or call :meth:`close` when the operation ends. Every
    method is safe to call from several threads.
    """

    def __init__(self, what: str, total: int | None, done: int = 0) -> None:
        self.what = what
        self.total = total
        self.done = done
        self.first_done = done  # units finished before this run (a resumed operation)
        self.started = time.perf_counter()
        self.closed = False
        self._lock = threading.Lock()

    def advance(self, n: int = 1, *, line: str | None = None) -> None:
        """Count ``n`` more units done; ``line`` is shown above the display, if any."""
        with self._lock:
            self.done += n
        self._advanced(n)
        if line is not None:
            self.note(line)

    def count(self, text: str) -> None:
        """Count one unit done and show ``[k/total] text``, ``k`` the count this unit made.

        For work finished by several threads: the number in the line is this unit's own,
        whatever the others do meanwhile.
        """
        with self._lock:
            self.done += 1
            line = f"[{self.done}/{'?' if self.total is None else self.total}] {text}"
        self._advanced(1)
        self.note(line)

    def describe(self, what: str) -> None:
        """Change the description (e.g. the step now under way)."""
        self.what = what
        self._described()

    def note(self, line: str) -> None:
        """Show one line about the operation (a finished cell, a rejected task)."""

    def close(self) -> None:
        """End the task (idempotent)."""
        if not self.closed:
            self.closed = True
            self._closed()

    def __enter__(self) -> ProgressTask:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def elapsed_s(self) -> float:
        """Seconds since the task was opened."""
        return time.perf_counter() - self.started

    # Hooks for the reporters.
    def _advanced(self, n: int) -> None:
        pass

    def _described(self) -> None:
        pass

    def _closed(self) -> None:
        pass


class Reporter:
    """Where progress goes. The base class shows nothing (see :class:`SilentReporter`)."""

    def task(self, what: str, total: int | None = None, *, done: int = 0) -> ProgressTask:
        """Open a task: ``what`` is under way, ``done`` of ``total`` units finished."""
        return ProgressTask(what, total, done)


class SilentReporter(Reporter):
    """Shows nothing: ``--quiet``, or a command whose stdout is not a terminal."""


class _LogTask(ProgressTask):
    def note(self, line: str) -> None:
        log.info("%s", line)

    def _closed(self) -> None:
        count = f" ({self.done}/{self.total})" if self.total is not None else ""
        log.info("%s: done%s in %.1f s", self.what, count, self.elapsed_s)


class LogReporter(Reporter):
    """A line on the ``bat_gym`` logger (INFO) when a task starts and when it ends.

    The library's default: seen by whoever configured logging, silent otherwise.
    """

    def task(self, what: str, total: int | None = None, *, done: int = 0) -> ProgressTask:  # noqa: D102
        count = f" ({total - done} to do)" if total is not None and total > done else ""
        log.info("%s%s", what, count)
        return _LogTask(what, total, done)


class _RichTask(ProgressTask):
    def __init__(self, owner: RichReporter, what: str, total: int | None, done: int) -> None:
        super().__init__(what, total, done)
        self.owner = owner
        self.id = owner._open(self)

    def note(self, line: str) -> None:
        self.owner._print(line)

    def _advanced(self, n: int) -> None:
        self.owner._update(self, advance=n)

    def _described(self) -> None:
        self.owner._update(self, description=self.what)

    def _closed(self) -> None:
        self.owner._close(self)


class RichReporter(Reporter):
    """A live display on stderr: a spinner, what is under way, done / total, rate, ETA.

    A task without a total shows a spinner and the time elapsed. The display runs while
    at least one task is open; :meth:`ProgressTask.note` lines print above it.

    Args:
        console: a ``rich.console.Console`` (default: one on stderr).
    """

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._progress: Any = None
        self._open_tasks = 0
        self._lock = threading.RLock()

    def task(self, what: str, total: int | None = None, *, done: int = 0) -> ProgressTask:  # noqa: D102
        return _RichTask(self, what, total, done)

    def _display(self) -> Any:
        from rich.progress import (
            BarColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        class Counts(ProgressColumn):
            """``done/total``, the rate and the ETA; nothing for a task of unknown size."""

            def render(self, task: Any) -> Text:
                if task.total is None:
                    return Text("")
                left = task.time_remaining
                eta = "" if left is None else f"  ETA {int(left) // 60}:{int(left) % 60:02d}"
                rate = task.fields.get("rate", "")
                return Text(
                    f"{int(task.completed)}/{int(task.total)}"
                    + (f"  {rate}" if rate else "")
                    + eta,
                    style="progress.download",
                )

        return Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            Counts(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )

    def _open(self, t: _RichTask) -> int:
        with self._lock:
            if self._progress is None:
                self._progress = self._display()
                self._progress.start()
            self._open_tasks += 1
            return self._progress.add_task(
                t.what, total=t.total, completed=t.done, rate=self._rate(t)
            )

    def _update(self, t: _RichTask, **kwargs: Any) -> None:
        with self._lock:
            if self._progress is not None and not t.closed:
                self._progress.update(t.id, rate=self._rate(t), **kwargs)

    def _close(self, t: _RichTask) -> None:
        with self._lock:
            if self._progress is None:
                return
            self._progress.remove_task(t.id)
            if t.elapsed_s >= _SHOW_DONE_S:  # a quick step needs no line of its own
                count = f" {t.done}/{t.total}" if t.total is not None else ""
                self.console.print(
                    f"{t.what}:{count} done in {t.elapsed_s:.1f} s",
                    style="dim",
                    markup=False,
                    highlight=False,
                )
            self._open_tasks -= 1
            if self._open_tasks == 0:
                self._progress.stop()
                self._progress = None

    def _print(self, line: str) -> None:
        with self._lock:
            self.console.print(line, markup=False, highlight=False)

    @staticmethod
    def _rate(t: ProgressTask) -> str:
        # Units done in this run only: a resumed task's earlier units took no time here.
        if t.total is None:
            return ""
        elapsed = t.elapsed_s
        done = t.done - t.first_done
        if done <= 0 or elapsed <= 0:
            return ""
        per_s = done / elapsed
        return f"{per_s:.2f}/s" if per_s >= 1 else f"{elapsed / done:.1f} s each"


_current: Reporter = LogReporter()
_SILENT = SilentReporter()
_current_lock = threading.Lock()


def current() -> Reporter:
    """The reporter progress goes to now."""
    return _current


@contextlib.contextmanager
def use(reporter: Reporter) -> Iterator[Reporter]:
    """Send progress to ``reporter`` inside the block (process-wide), then restore."""
    global _current
    with _current_lock:
        before, _current = _current, reporter
    try:
        yield reporter
    finally:
        with _current_lock:
            _current = before


def task(what: str, total: int | None = None, *, done: int = 0, shown: bool = True) -> ProgressTask:
    """Open a task on the current reporter (see :meth:`Reporter.task`).

    ``shown=False`` opens it on no reporter: it counts, and shows nothing.
    """
    return (_current if shown else _SILENT).task(what, total, done=done)


def for_cli(quiet: bool = False) -> Reporter:
    """The reporter a command shows: live on a terminal, nothing when quiet or piped."""
    if quiet or not sys.stdout.isatty():
        return SilentReporter()
    return RichReporter()
