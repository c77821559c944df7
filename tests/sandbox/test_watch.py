"""The change watches share one inotify instance per process: fork and threads."""

from __future__ import annotations

import os
import signal
import threading
import time

from bat_gym.core.sandbox import watch


def test_a_child_forked_while_a_thread_holds_the_shared_lock_can_still_watch(tmp_path):
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with watch._INOTIFY.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: no thread holds its lock
            code = 1
            try:
                w = watch.ChangeWatch()
                fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
                w.add(fd)
                w.clear()
                (tmp_path / "new").write_text("x")
                code = 0 if w.changed() else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:  # stuck on the inherited lock
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung on the shared inotify lock")
        status = done[1]
    finally:
        release.set()
        t.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_watches_of_two_trees_see_only_their_own_events(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    wa, wb = watch.ChangeWatch(), watch.ChangeWatch()
    fa, fb = os.open(a, os.O_RDONLY | os.O_DIRECTORY), os.open(b, os.O_RDONLY | os.O_DIRECTORY)
    try:
        wa.add(fa)
        wb.add(fb)
        wa.clear()
        wb.clear()
        (a / "f").write_text("x")
        assert wb.changed() is False  # b's check reads the queue and hands a its event
        assert wa.changed() is True
        (b / "g").write_text("y")
        (a / "f").read_text()
        assert wb.changed() is True
        assert wa.take_reads() == frozenset({"f"})
        assert wb.take_reads() == frozenset()
    finally:
        wa.close()
        wb.close()
        os.close(fa)
        os.close(fb)
