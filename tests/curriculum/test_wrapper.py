import json

import gymnasium as gym
import pytest

from bat_gym.curriculum.wrapper import StageCurriculum
from bat_gym.env import StageEnv

SMALL = {"batches": 2}  # 16 resets per round over the toy bank (24 states)


@pytest.fixture
def env(toy, toy_bank):
    inner = StageEnv("E2E", benchmark=toy, states=toy_bank)
    yield inner
    inner.close()


def walk(cur, n):
    out = []
    for _ in range(n):
        _, info = cur.reset()
        out.append((info["state_id"], info["curriculum"]))
    return out


def test_resets_follow_the_round_with_its_composition(env, toy_bank):
    cur = StageCurriculum(env, target="S2", **SMALL)
    expected = [r.state_id for r in cur.current_round]
    seen = walk(cur, 16)
    assert [sid for sid, _ in seen] == expected
    pools = [c["pool"] for _, c in seen]
    assert pools == (["target"] * 4 + ["mix"] * 2 + ["e2e"] * 2) * 2
    assert [(c["batch"], c["index"]) for _, c in seen[6:9]] == [(0, 6), (0, 7), (1, 0)]
    assert all(c["round"] == 0 and c["target"] == "S2" for _, c in seen)
    for sid, c in seen:
        focus = toy_bank.get(sid).focus
        assert {"target": focus == "S2", "mix": focus not in ("S2", "E2E"),
                "e2e": focus == "E2E"}[c["pool"]]  # fmt: skip
    assert env.state.state_id == seen[-1][0]  # the inner env really restored it


def test_an_exhausted_round_starts_the_next_with_seed_plus_round(env):
    cur = StageCurriculum(env, target="S1", seed=5, **SMALL)
    walk(cur, 16)
    _, info = cur.reset()
    assert info["curriculum"] == {"round": 1, "batch": 0, "index": 0, "pool": "target",
                                  "target": "S1"}  # fmt: skip
    assert cur.round_spec.seed == 6


def test_repeat_restores_the_last_state_without_advancing(env):
    cur = StageCurriculum(env, target="S3", **SMALL)
    with pytest.raises(ValueError, match="needs an earlier reset"):
        cur.reset(options={"repeat": True})
    _, first = cur.reset()
    nxt = cur.upcoming(1)
    for _ in range(3):  # a GRPO group of G = 4 rollouts from one state_id
        _, info = cur.reset(options={"repeat": True})
        assert info["state_id"] == first["state_id"]
        assert info["curriculum"] == first["curriculum"]
    _, info = cur.reset()
    assert [info["state_id"]] == nxt


def test_set_target_starts_a_new_round(env, toy_bank):
    cur = StageCurriculum(env, target="S1", **SMALL)
    walk(cur, 3)
    cur.set_target("Validate")  # names work as well as ids
    assert cur.target == "S3" and cur.round_index == 1
    _, info = cur.reset()
    assert info["curriculum"]["round"] == 1 and info["curriculum"]["index"] == 0
    assert toy_bank.get(info["state_id"]).focus == "S3"
    with pytest.raises(ValueError, match="E2E states are their own pool"):
        cur.set_target("E2E")


def test_resuming_from_a_state_dict_continues_identically(env, toy, toy_bank):
    cur = StageCurriculum(env, target="S4", seed=3, **SMALL)
    walk(cur, 5)
    saved = json.loads(json.dumps(cur.state_dict()))  # survives a checkpoint file
    rest = walk(cur, 20)  # crosses into round 1
    with StageEnv("E2E", benchmark=toy, states=toy_bank) as other:
        resumed = StageCurriculum(other)  # other args come from the state dict
        resumed.load_state_dict(saved)
        _, info = resumed.reset(options={"repeat": True})
        assert info["state_id"] == saved["last"]["state_id"]
        assert walk(resumed, 20) == rest


def test_a_state_dict_from_other_states_is_refused(env, toy, toy_bank):
    cur = StageCurriculum(env, target="S1", **SMALL)
    saved = cur.state_dict()
    ids = [i for i in toy_bank.select() if i != toy_bank.select(focus="S5")[0]]
    subset = type("Subset", (), {"select": lambda self, **_: ids, "get": lambda self, i:
                                 toy_bank.get(i), "store": toy_bank.store})()  # fmt: skip
    with pytest.raises(ValueError, match="saved over other states"):
        StageCurriculum(env, target="S1", states=subset, **SMALL).load_state_dict(saved)


def test_works_over_the_registered_rubric_env(toy, toy_bank):
    inner = gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank)
    cur = StageCurriculum(inner, target="S5", **SMALL)
    try:
        obs, info = cur.reset(seed=0)
        assert isinstance(obs, str) and info["curriculum"]["pool"] == "target"
        assert info["stage"] == "S5"
        _, reward, terminated, truncated, info = cur.step("no tool call here")
        assert isinstance(reward, float) and not terminated
        assert cur._saved_kwargs["target"] == "S5"  # RecordConstructorArgs
    finally:
        cur.close()


def test_explicit_state_ids_bypass_the_curriculum(env, toy_bank):
    cur = StageCurriculum(env, target="S1", **SMALL)
    nxt = cur.upcoming(1)
    sid = toy_bank.select(focus="S5")[0]
    _, info = cur.reset(options={"state_id": sid})
    assert info["state_id"] == sid and "curriculum" not in info
    assert cur.upcoming(1) == nxt


def test_constructor_arguments_are_checked(env):
    with pytest.raises(TypeError, match="unwrapped is a StageEnv"):
        StageCurriculum(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="batch_size"):
        StageCurriculum(env, e2e_per_batch=3)
    with pytest.raises(ValueError, match="'track' does not apply"):
        StageCurriculum(env, **SMALL).reset(options={"track": "a"})
