"""The Ray backend: EnvActor alone, then RayVectorEnv and RayEnvPool on a local Ray.

The Ray tests share one local Ray (2 CPUs, started once per module, about 5 s), so they
are marked slow. What happens when the driver dies is in ``tests/distributed/test_vector.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError
from gymnasium.vector import AutoresetMode
from hermes_actions import FINISH, bash, teacher_plan

from bat_gym.core.errors import ResetNeeded
from bat_gym.distributed import EnvActor, EnvActorsUnavailable


def test_env_actor_runs_an_env_without_ray(toy, toy_bank):
    plan = toy_bank.select(focus="S1")[0]
    actor = EnvActor("bat/Plan-v0", {"benchmark": "toy_pipeline", "states": str(toy_bank.root)})
    try:
        spaces = actor.spaces()
        assert spaces["observation_space"] == actor.env.observation_space
        assert spaces["spec"].id == "bat/Plan-v0"
        obs, info = actor.reset(options={"state_id": plan})
        assert info["state_id"] == plan
        out = actor.step(teacher_plan(toy, toy_bank, plan))
        assert out[0].startswith("[exit code 0") and out[5] is None
        obs, reward, terminated, truncated, info, final = actor.step(FINISH, autoreset=True)
        final_obs, final_info = final
        assert terminated and reward == final_info["verdict"].reward > 0.5
        assert final_obs == "Finished." and obs.startswith("[system]") and info["turns"] == 0
        assert actor.where()["slot"] is not None
        assert actor.call("turns") == 0
    finally:
        actor.close()
    assert actor.where()["slot"] is None
    with pytest.raises(ValueError, match="env_kwargs go with an env id"):
        EnvActor(lambda: None, {"x": 1})


# -- on a local Ray ------------------------------------------------------------------------


def ray_vec(bank, n: int = 2, **kwargs):
    from bat_gym.distributed import RayVectorEnv

    return RayVectorEnv("bat/E2E-v0", n, benchmark="toy_pipeline", states=str(bank.root), **kwargs)


@pytest.mark.slow
def test_ray_vector_env_matches_the_sync_vector_env(local_ray, toy, toy_bank):
    plan = toy_bank.select(focus="S1")[0]
    sync = gym.make_vec(
        "bat/E2E-v0",
        num_envs=2,
        vectorization_mode="sync",
        benchmark="toy_pipeline",
        states=str(toy_bank.root),
    )
    envs = ray_vec(toy_bank)
    try:
        assert envs.single_observation_space == sync.single_observation_space
        assert envs.observation_space == sync.observation_space
        assert envs.action_space == sync.action_space
        assert envs.metadata == sync.metadata and envs.render_mode == sync.render_mode
        script = [
            ("reset", {"seed": 5, "options": {"state_id": plan}}),
            ("step", (teacher_plan(toy, toy_bank, plan), bash("echo other"))),
            ("step", (FINISH, bash("true"))),
            ("step", (bash("exit 1"), bash("exit 2"))),  # env 0 autoresets (NEXT_STEP)
        ]
        for kind, arg in script:
            if kind == "reset":
                got, want = envs.reset(**arg), sync.reset(**arg)
                assert got[0] == want[0]
                assert list(got[1]["state_id"]) == list(want[1]["state_id"])
                continue
            got, want = envs.step(arg), sync.step(arg)
            assert list(got[0]) == list(want[0])
            for a, b in zip(got[1:4], want[1:4], strict=True):
                np.testing.assert_array_equal(a, b)
            assert got[4].keys() == want[4].keys()
            assert list(got[4]["state_id"]) == list(want[4]["state_id"])
        assert envs.get_attr("turns") == (0, 3)
    finally:
        envs.close()
        sync.close()


@pytest.mark.slow
def test_per_env_options_same_step_autoreset_and_masks(local_ray, toy_bank):
    first, second = toy_bank.select(focus="S3")[:2]
    envs = ray_vec(toy_bank, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        obs, infos = envs.reset(seed=[3, 4], options=[{"state_id": first}, {"state_id": second}])
        assert list(infos["state_id"]) == [first, second]
        obs, rewards, terminated, _, infos = envs.step((FINISH, bash("true")))
        assert terminated.tolist() == [True, False]
        assert infos["_final_info"].tolist() == [True, False]
        assert infos["final_obs"][0] == "Finished." and "verdict" in infos["final_info"]
        assert obs[0].startswith("[system]")  # the next episode's prompt, same step
        obs, infos = envs.reset(options={"state_id": first, "reset_mask": np.array([False, True])})
        assert infos["_state_id"].tolist() == [False, True] and infos["state_id"][1] == first
    finally:
        envs.close()


@pytest.mark.slow
def test_step_some_returns_each_env_as_soon_as_it_is_ready(local_ray, toy, toy_bank):
    long = toy.spec.budgets.model_copy(update={"max_turns": 10_000, "max_tool_calls": 10_000})
    envs = ray_vec(toy_bank, n=3, budgets=long)
    try:
        envs.reset(seed=0)
        start = time.monotonic()
        slow = envs.step_some([0], [bash("sleep 1; echo slept")])
        fast_steps = 0
        while time.monotonic() - start < 0.8:  # env 0 is still sleeping all along
            for r in envs.step_some([1, 2], [bash("true")] * 2):
                assert r.kind == "step" and not r.done
                fast_steps += 1
        assert envs.pool.in_flight == [0]
        (r,) = list(slow)
        assert r.index == 0 and r.obs.endswith("slept") and time.monotonic() - start >= 1.0
        assert fast_steps >= 10
        assert envs.pool.in_flight == []
    finally:
        envs.close()


@pytest.mark.slow
def test_pool_futures_errors_and_close(local_ray, toy_bank):
    from bat_gym.distributed import RayEnvPool

    pool = RayEnvPool("bat/E2E-v0", 2, benchmark="toy_pipeline", states=str(toy_bank.root))
    try:
        results = pool.reset_all(seed=3)
        assert [r.index for r in results] == [0, 1] and all(r.kind == "reset" for r in results)
        slots = [Path(w["slot"]) for w in pool.where()]
        assert all(s.is_dir() for s in slots)
        pool.submit_step(0, FINISH)
        with pytest.raises(AlreadyPendingCallError):
            pool.submit_step(0, FINISH)
        (done,) = pool.gather()
        assert done.done and done.info["verdict"] is not None
        pool.submit_step(0, FINISH)  # the episode is over: the env raises, named by index
        with pytest.raises(ResetNeeded) as err:
            pool.wait()
        assert "env 0 of the pool" in "".join(getattr(err.value, "__notes__", []))
        pool.submit_step(1, bash("sleep 30"))  # still running when close() gives up on it
        pool.close_timeout_s = 1.0
    finally:
        pool.close()
    assert not any(s.exists() for s in slots)  # closed, or killed and its node swept
    pool.close()  # idempotent


@pytest.mark.slow
def test_too_many_cpus_fail_fast_with_the_fix_named(local_ray, toy_bank):
    from bat_gym.distributed import RayEnvPool

    with pytest.raises(EnvActorsUnavailable, match="smaller num_cpus") as err:
        RayEnvPool(
            "bat/E2E-v0",
            2,
            num_cpus=1.5,
            start_timeout_s=3,
            benchmark="toy_pipeline",
            states=str(toy_bank.root),
        )
    assert err.value.cpus_needed == 3.0 and err.value.started == 1
