"""A process's scratch folders go when it exits, and after a kill, when the next one starts."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from bat_gym.core import scratch

# Makes a scratch folder, says where, then waits to be killed.
_MAKE_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from bat_gym.core.scratch import scratch_dir
    print(scratch_dir("reproduce-"), flush=True)
    time.sleep(600)
    """
)


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _MAKE_AND_WAIT], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_processs_folders_are_swept_and_a_living_ones_are_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(scratch.tempfile, "tempdir", None)  # read TMPDIR again
    killed, killed_dir = _start(tmp_path)
    living, living_dir = _start(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert killed_dir.is_dir()  # no exit handler ran
        removed = scratch.sweep()
        assert [Path(p) for p in removed] == [killed_dir.parent]
        assert not killed_dir.exists()
        assert living_dir.is_dir()
    finally:
        living.kill()
        living.wait(30)


def test_a_process_removes_its_folders_when_it_exits(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    code = "from bat_gym.core.scratch import scratch_dir; print(scratch_dir('x-'))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    made = Path(out.stdout.strip())
    assert made.parent.parent == tmp_path and not made.parent.exists()


def test_folders_of_another_kind_or_without_an_owner_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(scratch.tempfile, "tempdir", None)
    mid_creation = tmp_path / "bat-gym-scratch-new"  # made, not yet locked and named
    mid_creation.mkdir()
    other = tmp_path / "bat-gym-task-1"
    (other / "x").mkdir(parents=True)
    link = tmp_path / "bat-gym-scratch-link"
    link.symlink_to(other)
    (other / ".owner").write_text("")  # reached through the link only
    assert scratch.sweep() == []
    assert mid_creation.is_dir() and (other / "x").is_dir() and link.is_symlink()
