"""A Ray cluster of several nodes on this machine, one node killed mid-episode.

Ray's own test cluster (``ray.cluster_utils.Cluster``) starts a head and worker nodes
as separate raylets here. The evaluation's eight env actors fill the two worker nodes
(a quarter CPU each, one CPU per node); once every episode is under way, a spare node
joins and one worker node is killed without warning. Its episodes must be played again
on the survivors, never scored as failures, and nothing may be left running.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

import pytest

from bat_gym.core.sandbox.slots import runtime_dir, sweep_stale
from bat_gym.evaluation import EvalConfig, evaluate
from bat_gym.policies import make_policy

pytestmark = pytest.mark.slow

WORKERS = 8  # 8 x 0.25 CPU fills both one-CPU worker nodes exactly


def _orphan_sandboxes() -> set[int]:
    """bubblewrap processes whose parent is gone (reparented to PID 1): leaked sandboxes.

    Other jobs on the machine may run sandboxes too; theirs have a live parent.
    """
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if comm == "bwrap" and ppid == 1:
                pids.add(int(entry.name))
    return pids


def _ownerless_slots() -> set[str]:
    """Slot directories whose lock nobody holds: what a dead owner left behind."""
    out = set()
    for lock in runtime_dir().glob("slot-*.lock"):
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live sandbox holds it
        else:
            if lock.with_suffix("").is_dir():
                out.add(lock.with_suffix("").name)
        finally:
            os.close(fd)
    return out


class WaitForTheKill:
    """The teacher, whose first turn in every episode waits until all are under way.

    When all ``WORKERS`` episodes have reset, ``under_way`` is set; the test's main
    thread (Ray adds nodes from the main thread only) then adds a spare node, kills a
    worker node and sets ``killed``, which lets the turns go on.
    """

    def __init__(self) -> None:
        self.inner = make_policy("teacher")
        self.barrier = threading.Barrier(WORKERS, action=self._all_under_way)
        self.under_way = threading.Event()
        self.killed = threading.Event()
        self.seen = threading.local()

    def _all_under_way(self) -> None:
        self.under_way.set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def act(self, request):
        if not getattr(self.seen, "first", False):
            self.seen.first = True
            if not self.killed.is_set():
                with contextlib.suppress(threading.BrokenBarrierError):
                    self.barrier.wait(timeout=240)
                self.killed.wait(timeout=240)
        return self.inner.act(request)


@pytest.fixture
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        c = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False},
        )
        workers = [c.add_node(num_cpus=1) for _ in range(2)]
        ray.init(address=c.address, log_to_driver=False)
        try:
            yield c, workers
        finally:
            ray.shutdown()
            c.shutdown()


def test_a_node_killed_mid_episode_costs_retries_not_scores(cluster, toy, tmp_path):
    c, (_, victim) = cluster
    orphans_before = _orphan_sandboxes()
    reference = evaluate(
        toy, make_policy("teacher"), tmp_path / "here", EvalConfig(repeats=4, progress=False)
    )
    policy = WaitForTheKill()
    cfg = EvalConfig(repeats=4, workers=WORKERS, max_attempts=3, progress=False, ray="auto")
    reports = []
    os.environ["RAY_ADDRESS"] = c.address
    try:
        run = threading.Thread(
            target=lambda: reports.append(evaluate(toy, policy, tmp_path / "ray", cfg))
        )
        run.start()
        assert policy.under_way.wait(timeout=300), "the eight episodes never all started"
        c.add_node(num_cpus=1)  # room for the replacements
        c.remove_node(victim, allow_graceful=False)
        policy.killed.set()
        run.join(timeout=600)
    finally:
        policy.killed.set()
        del os.environ["RAY_ADDRESS"]
    (report,) = reports
    cells = report.cells
    assert len(cells) == 2 * 4 and all(r.valid for r in cells)
    # The four episodes on the killed node were played again, the others once.
    assert sorted(r.attempts for r in cells) == [1] * 4 + [2] * 4

    # Played again from the start on a survivor: scored exactly as without the fault.
    def scores(rep):
        return {r.cell.key: (r.reward, r.stages, r.failures) for r in rep.cells}

    assert scores(report) == scores(reference)
    assert report.aggregates.overall == pytest.approx(reference.aggregates.overall)
    # Nothing left behind: the killed node's sandboxes died with their actors, and its
    # slot directories are swept like any dead owner's.
    sweep_stale()
    assert _orphan_sandboxes() - orphans_before == set()
    assert _ownerless_slots() == set()
