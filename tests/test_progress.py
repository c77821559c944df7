"""Progress: the library reports, the command line shows it on a terminal only."""

import io
import logging

from rich.console import Console

from bat_gym.core import progress


def test_the_library_logs_a_line_when_a_task_starts_and_ends(caplog):
    caplog.set_level(logging.INFO, logger="bat_gym")
    with progress.task("building things", 3) as shown:
        shown.advance(3)
    lines = [r.getMessage() for r in caplog.records if r.name == "bat_gym"]
    assert lines[0] == "building things (3 to do)"
    assert lines[1].startswith("building things: done (3/3) in ")
    assert len(lines) == 2  # nothing per unit: a log is never spammed


def test_the_terminal_display_shows_done_total_and_what_is_under_way():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    reporter = progress.RichReporter(console)
    with progress.use(reporter):
        shown = progress.task("evaluating: held-out cells", 4, done=1)
        shown.advance(line="[2/4] segmentation-1000007-r0  overall 0.981")
        shown.describe("evaluating: second half")
        reporter._progress.refresh()
        shown.close()
    text = out.getvalue()
    assert "[2/4] segmentation-1000007-r0  overall 0.981" in text  # printed above the bar
    assert "2/4" in text and "evaluating: second half" in text
    assert reporter._progress is None  # the display stops with its last task


def test_use_restores_the_reporter_before_it():
    before = progress.current()
    silent = progress.SilentReporter()
    with progress.use(silent):
        assert progress.current() is silent
    assert progress.current() is before


def test_commands_are_quiet_when_asked_or_when_stdout_is_not_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdout", Tty())
    assert isinstance(progress.for_cli(), progress.RichReporter)
    assert isinstance(progress.for_cli(quiet=True), progress.SilentReporter)
    monkeypatch.setattr("sys.stdout", io.StringIO())  # piped, redirected, CI
    assert isinstance(progress.for_cli(), progress.SilentReporter)


def test_count_numbers_each_unit_by_its_own_count_across_threads():
    import threading

    class Lines(progress.ProgressTask):
        def __init__(self, *args):
            super().__init__(*args)
            self.lines = []

        def note(self, line):
            self.lines.append(line)

    shown = Lines("work", 40, 0)
    threads = [
        threading.Thread(target=lambda i=i: [shown.count(f"item {i}-{k}") for k in range(10)])
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = sorted(int(line[1:].split("/")[0]) for line in shown.lines)
    assert numbers == list(range(1, 41)) and shown.done == 40
    assert all(line.split("] ")[0].endswith("/40") for line in shown.lines)


def test_a_task_not_shown_counts_and_shows_nothing(caplog):
    caplog.set_level(logging.INFO, logger="bat_gym")
    with progress.task("quiet work", 2, shown=False) as shown:
        shown.count("one")
        shown.count("two")
    assert shown.done == 2
    assert not [r for r in caplog.records if r.name == "bat_gym"]
