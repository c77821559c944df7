"""Gymnasium's SyncVectorEnv and AsyncVectorEnv (spawned workers) over the bat/* ids.

Autoreset, as these tests pin it down (Gymnasium's default ``NEXT_STEP`` mode): the
step that ends an episode returns the rubric reward and ``info["verdict"]``; on the
next ``step`` that env ignores its action and returns a fresh episode's prompt, with
reward 0 and ``terminated = truncated = False``. The fresh episode is a *sampled*
state (seeded by the env), not the ``state_id`` of the last reset: a GRPO group that
must restart from one state resets it explicitly (``options={"state_id": ...,
"reset_mask": done}``), best with ``autoreset_mode=DISABLED``.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from hermes_actions import FINISH, bash, teacher_plan

from bat_gym.core.textspace import UnicodeText


def make_vec(mode: str, bank, n: int = 2, **vector_kwargs):
    if mode == "async":
        vector_kwargs = {"context": "spawn", **vector_kwargs}
    return gym.make_vec(
        "bat/E2E-v0",
        num_envs=n,
        vectorization_mode=mode,
        vector_kwargs=vector_kwargs,
        benchmark="toy_pipeline",
        states=str(bank.root),
    )


@pytest.fixture(scope="module")
def plan_state(toy_bank):
    return toy_bank.select(focus="S1")[0]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_group_from_one_state_earns_the_rubric_reward_at_the_end(mode, toy, toy_bank, plan_state):
    envs = make_vec(mode, toy_bank)
    try:
        assert envs.single_observation_space == UnicodeText(1_000_000)
        assert envs.observation_space == gym.spaces.Tuple([UnicodeText(1_000_000)] * 2)
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP

        obs, infos = envs.reset(seed=0, options={"state_id": plan_state})
        assert isinstance(obs, tuple) and obs[0] == obs[1] and "[system]" in obs[0]
        assert list(infos["state_id"]) == [plan_state] * 2 and list(infos["stage"]) == ["S1"] * 2

        obs, rewards, terminated, truncated, infos = envs.step(
            (teacher_plan(toy, toy_bank, plan_state), bash("echo other"))
        )
        assert obs[0].startswith("[exit code 0") and obs[1].endswith("other")
        assert rewards.tolist() == [0.0, 0.0] and not terminated.any() and not truncated.any()
        assert "verdict" not in infos

        obs, rewards, terminated, truncated, infos = envs.step((FINISH, bash("true")))
        assert terminated.tolist() == [True, False]
        assert infos["_verdict"].tolist() == [True, False]
        verdict = infos["verdict"][0]
        assert rewards[0] == verdict.reward and rewards[0] > 0.5
        assert rewards[1] == 0.0
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_next_step_autoreset_and_per_env_state_ids(mode, toy_bank):
    first, second = toy_bank.select(focus="S3")[:2]
    envs = make_vec(mode, toy_bank)
    try:
        # One state per env: a masked reset per state (Gymnasium passes one options
        # dict to every env it resets). The returned batch holds every env's prompt.
        envs.reset(seed=0, options={"state_id": first, "reset_mask": np.array([True, False])})
        obs, infos = envs.reset(
            seed=0, options={"state_id": second, "reset_mask": np.array([False, True])}
        )
        assert infos["_state_id"].tolist() == [False, True]
        assert infos["state_id"][1] == second and obs[0] != obs[1]

        _, rewards, terminated, _, infos = envs.step((FINISH, bash("true")))
        assert terminated.tolist() == [True, False] and infos["_verdict"].tolist() == [True, False]

        # NEXT_STEP: env 0 ignores this action and starts a sampled episode.
        obs, rewards, terminated, truncated, infos = envs.step((bash("exit 7"), bash("exit 3")))
        assert rewards.tolist() == [0.0, 0.0] and not terminated.any() and not truncated.any()
        assert obs[0].startswith("[system]") and infos["turns"].tolist() == [0, 2]
        assert obs[1].startswith("[exit code 3")
        assert infos["stage"][0] == "E2E"  # the id's focus, not the last state_id's
    finally:
        envs.close()


def test_disabled_autoreset_restarts_only_ended_envs_from_the_same_state(toy_bank, plan_state):
    envs = make_vec("sync", toy_bank, autoreset_mode=AutoresetMode.DISABLED)
    try:
        envs.reset(options={"state_id": plan_state})
        _, _, terminated, truncated, _ = envs.step((FINISH, bash("echo x > f")))
        done = terminated | truncated
        obs, infos = envs.reset(options={"state_id": plan_state, "reset_mask": done})
        assert infos["_state_id"].tolist() == [True, False] and infos["state_id"][0] == plan_state
        obs, *_, infos = envs.step((bash("ls f || echo none"), bash("cat f")))
        assert "none" in obs[0] and obs[1].endswith("x")  # env 0 restarted, env 1 went on
    finally:
        envs.close()


def test_async_vector_env_from_factories_in_spawned_workers(toy_bank, plan_state):
    root = str(toy_bank.root)
    envs = AsyncVectorEnv(
        [lambda: gym.make("bat/Plan-v0", benchmark="toy_pipeline", states=root)] * 2,
        context="spawn",
    )
    try:
        obs, infos = envs.reset(seed=[1, 2], options={"state_id": plan_state})
        assert list(infos["state_id"]) == [plan_state] * 2
        envs.step_async((bash("sleep 0.3; echo slow"), bash("echo fast")))
        obs, rewards, terminated, truncated, infos = envs.step_wait()
        assert obs[0].endswith("slow") and obs[1].endswith("fast")
        assert infos["record"][0].calls[0].code == "sleep 0.3; echo slow"
    finally:
        envs.close()


@pytest.mark.filterwarnings("ignore:.*Calling `close` while waiting")
def test_terminated_worker_closes_its_sandbox_first(toy_bank, tmp_path, monkeypatch):
    # multiprocessing's terminate() (AsyncVectorEnv.close(terminate=True), and the
    # driver's exit) sends SIGTERM; the worker must not leave its slot directory behind.
    monkeypatch.setenv("BAT_GYM_RUNTIME_DIR", str(tmp_path / "rt"))
    envs = make_vec("async", toy_bank, n=1)
    envs.reset(seed=0)
    assert _slot_dirs(tmp_path / "rt") == ["slot-0"]
    envs.step_async((bash("sleep 30"),))
    time.sleep(0.5)
    envs.close(terminate=True)
    assert envs.processes[0].exitcode == -signal.SIGTERM  # it still dies of SIGTERM
    assert _slot_dirs(tmp_path / "rt") == []


def test_sigterm_in_a_forked_worker_spares_the_parents_sandbox(toy_bank):
    parent = gym.make("bat/E2E-v0", benchmark="toy_pipeline", states=str(toy_bank.root))
    try:
        parent.reset(seed=0)  # this process now owns a sandbox, which a fork copies
        envs = make_vec("async", toy_bank, n=1, context="fork")
        envs.reset(seed=0)
        envs.close(terminate=True)
        obs, *_ = parent.step(bash("echo alive"))
        assert obs.startswith("[exit code 0") and obs.endswith("alive")
    finally:
        parent.close()


# -- nothing outlives a driver that dies -----------------------------------------------------
#
# A driver process steps two envs, leaves a tool call running, and is then killed. Every
# process it started (sandboxes, workers, Ray's daemons and actors) must go, and every
# sandbox slot directory with them. Guarantees, as measured here:
#
# * Ctrl-C (SIGINT to the driver's process group, as a terminal sends it) and SIGINT to
#   the driver alone: everything goes within seconds, for AsyncVectorEnv and for
#   RayVectorEnv (which closes its envs at exit, killing actors whose call does not
#   finish within ``close_timeout_s``).
# * SIGKILL, AsyncVectorEnv: each worker finishes the tool call it is running (at most
#   the tool timeout), finds the driver gone and closes its env; idle workers at once.
# * SIGKILL, RayVectorEnv: Ray's reaper stops the local cluster, actors die, and the
#   sandboxes die with them (bubblewrap's --die-with-parent); the slot directories stay
#   until sweep_stale() or the next EnvActor on the machine removes them. Ray 2.60 may
#   leave its dashboard and runtime-env agents behind (a Ray matter: ``ray stop``).

DRIVER = """
import sys, time
import gymnasium as gym
from bat_gym import ToolCall
from bat_gym.core.protocol import get_protocol

def bash(code):
    call = ToolCall(name="execute_code", arguments={"language": "bash", "code": code})
    return get_protocol("hermes").render("", [call])

def main(backend, bank, ray_tmp, sleep_s):
    kwargs = dict(benchmark="toy_pipeline", states=bank)
    if backend == "ray":
        from bat_gym.distributed import RayVectorEnv
        init = {"num_cpus": 2, "_temp_dir": ray_tmp, "log_to_driver": False}
        envs = RayVectorEnv("bat/E2E-v0", 2, close_timeout_s=2, ray_init_kwargs=init, **kwargs)
    else:
        envs = gym.make_vec("bat/E2E-v0", num_envs=2, vectorization_mode="async",
                            vector_kwargs={"context": "spawn"}, **kwargs)
    envs.reset(seed=0)
    envs.step((bash("echo warm"),) * 2)
    envs.step_async((bash(f"sleep {sleep_s}"),) * 2)
    print("READY", flush=True)
    envs.step_wait()
    time.sleep(600)

if __name__ == "__main__":
    main(*sys.argv[1:])
"""


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> start time (to tell a reused pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if (st := _proc_stat(child)) is not None:
                found[child] = st[1]
                todo.append(child)
    return found


def _alive(procs: dict[int, int]) -> dict[int, str]:
    out = {}
    for pid, start in procs.items():
        st = _proc_stat(pid)
        if st is not None and st[1] == start and st[0] != "Z":
            with contextlib.suppress(OSError):
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80]
    return {pid: cmd.decode(errors="replace") for pid, cmd in out.items()}


def _slot_dirs(rt: Path) -> list[str]:
    return sorted(p.name for p in rt.glob("slot-*") if p.is_dir())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "how", "sleep_s", "within_s"),
    [
        ("async", "ctrl-c", 60, 15),
        ("async", "sigint", 60, 15),
        ("async", "sigkill", 3, 25),
        ("ray", "ctrl-c", 60, 40),
        ("ray", "sigkill", 60, 40),
    ],
)
def test_killing_the_driver_leaves_no_sandbox_behind(
    backend, how, sleep_s, within_s, toy_bank, tmp_path, monkeypatch
):
    if backend == "ray":
        pytest.importorskip("ray")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    rt = tmp_path / "rt"
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: socket paths are limited
    env = {**os.environ, "BAT_GYM_RUNTIME_DIR": str(rt), "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen(
        [sys.executable, str(script), backend, str(toy_bank.root), ray_tmp, str(sleep_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    procs: dict[int, int] = {}
    try:
        ready, _, _ = select.select([driver.stdout], [], [], 180)
        assert ready and driver.stdout.readline() == b"READY\n"
        time.sleep(1.0)  # the sleeps are running in their sandboxes
        procs = _descendants(driver.pid)
        assert sum("bwrap" in c for c in _alive(procs).values()) == 2
        assert _slot_dirs(rt) == ["slot-0", "slot-1"]

        if how == "ctrl-c":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            driver.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        driver.wait(timeout=within_s)
        # After a SIGKILL, Ray 2.60's agents may hang on (see above); nothing else may.
        ray_agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
        tolerated = ray_agents if (backend, how) == ("ray", "sigkill") else ()
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            left = {p: c for p, c in _alive(procs).items() if not c.startswith(tolerated)}
            if not left:
                break
            time.sleep(0.2)
        if (backend, how) == ("ray", "sigkill"):
            assert _slot_dirs(rt)  # stale: their owners died without a word
            from bat_gym.core.sandbox.slots import sweep_stale

            monkeypatch.setenv("BAT_GYM_RUNTIME_DIR", str(rt))
            assert sweep_stale() == 2
        assert left == {}
        assert _slot_dirs(rt) == []
    finally:
        for pid in [driver.pid, *_alive(procs)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        driver.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
