import inspect
from types import SimpleNamespace

import gymnasium as gym
import pytest

from bat_gym import StageCurriculum
from bat_gym.core.errors import BatGymError
from bat_gym.integrations.trl import BatEnvironment, BatRollout, bat_dataset, rubric_reward
from bat_gym.rollout.chat_tokens import render_ids

pytest.importorskip("datasets")
pytest.importorskip("transformers")


def test_the_dataset_has_one_row_per_state(toy_bank):
    ds = bat_dataset(toy_bank, focus="S3")
    assert len(ds) == len(toy_bank.select(focus="S3"))
    assert {"prompt", "state_id", "benchmark", "focus", "track", "outcome"} <= set(ds.column_names)
    assert set(ds["focus"]) == {"S3"}
    first = toy_bank.get(ds[0]["state_id"])
    assert [m["role"] for m in ds[0]["prompt"]] == [m["role"] for m in first.messages]
    assert "<tool_call>" in ds[0]["prompt"][2]["content"]  # earlier stages' calls, as text
    ids = toy_bank.select()[:3]
    assert bat_dataset(toy_bank, state_ids=[ids[1], ids[1]])["state_id"] == [ids[1], ids[1]]
    with pytest.raises(ValueError, match="no states"):
        bat_dataset(toy_bank, focus="S3", track="nope")


def test_the_dataset_follows_a_curriculum_round(toy, toy_bank):
    env = StageCurriculum(
        gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank), target="S3", batches=2
    )
    try:
        ds = bat_dataset(env)
        assert ds["state_id"] == [r.state_id for r in env.current_round]
        assert set(ds["pool"]) <= {"target", "mix", "e2e"} and set(ds["target"]) == {"S3"}
        with pytest.raises(ValueError, match="chooses its own states"):
            bat_dataset(env, focus="S3")
    finally:
        env.close()


def test_the_environment_exposes_no_tool_to_trl(toy, toy_bank):
    # TRL turns every public function of an environment class into a model tool.
    public = [n for n, _ in inspect.getmembers(BatEnvironment, inspect.isfunction)]
    assert [n for n in public if not n.startswith("_")] == ["reset"]
    with BatRollout("bat/Submit-v0", env_kwargs={"benchmark": toy, "states": toy_bank}) as rollout:
        environment = rollout.environment_factory()
        with pytest.raises(RuntimeError, match="not been reset"):
            _ = environment.info
        environment.reset(prompt=[], state_id=toy_bank.select(focus="S5")[0], track="x")
        assert environment.info["state_id"] == toy_bank.select(focus="S5")[0]


def test_a_rollout_returns_tokens_masks_and_rewards_per_row(toy, toy_bank, tiny_tokenizer, helpers):
    ds = bat_dataset(toy_bank, focus="S5")
    rows = [ds[0], ds[0], ds[1], ds[1]]  # TRL repeats each row num_generations times
    kinds = ["teacher", "finish", "teacher", "malformed"]
    with BatRollout("bat/E2E-v0", env_kwargs={"benchmark": toy, "states": toy_bank}) as rollout:
        trainer = helpers.fake_trl_trainer(rollout, rows, tiny_tokenizer)
        gens, prompts = [], []
        for environment, kind in zip(trainer.environments, kinds, strict=True):
            state = toy_bank.get(environment.info["state_id"])
            gens.append(helpers.ScriptedTokens(tiny_tokenizer, helpers.script(toy, state, kind)))
            info = environment.info
            prompts.append(
                render_ids(
                    tiny_tokenizer, info["messages"], info["tools"], add_generation_prompt=True
                )
            )
        rollout.generate = helpers.RoutedBatch(gens, prompts)
        out = rollout([r["prompt"] for r in rows], trainer)

    assert out["bat_state_id"] == [r["state_id"] for r in rows]
    assert out["prompt_ids"] == prompts and out["logprobs"] is None
    for i in range(4):
        assert len(out["completion_ids"][i]) == len(out["env_mask"][i])
        sampled = [
            t for t, m in zip(out["completion_ids"][i], out["env_mask"][i], strict=True) if m
        ]
        assert sampled == [t for turn in gens[i].turns for t in turn]
    assert out["bat_reward"][0] == pytest.approx(1.0) and out["bat_reward"][2] == pytest.approx(1.0)
    assert out["bat_reward"][1] < 1.0 and out["bat_reward"][3] < 1.0
    assert out["bat_stop_reason"] == ["terminated"] * 4
    assert out["bat_num_turns"] == [len(g.turns) for g in gens]
    # Lockstep: the first call samples all four rollouts, the budget rides along.
    assert len(rollout.generate.max_new[0]) == 4 and rollout.generate.max_new[0][0] == 4096
    rewards = rubric_reward(
        ["c"] * 4,
        state_id=[r["state_id"] for r in rows],
        bat_reward=out["bat_reward"],
        bat_state_id=out["bat_state_id"],
    )
    assert rewards == out["bat_reward"]


def test_the_reward_function_checks_the_state_and_the_count():
    with pytest.raises(BatGymError, match="played state 'b'"):
        rubric_reward(["c"], bat_reward=[1.0], bat_state_id=["b"], state_id=["a"])
    with pytest.raises(BatGymError, match="one bat_reward per completion"):
        rubric_reward(["c", "d"], bat_reward=[1.0], bat_state_id=["a"])
    assert rubric_reward(["c"], bat_reward=[None], bat_state_id=["a"], trainer_state=None) == [None]


def test_the_rollout_needs_the_environment_factory(tiny_tokenizer):
    rollout = BatRollout()
    trainer = SimpleNamespace(environments=None, processing_class=tiny_tokenizer)
    with pytest.raises(BatGymError, match="environment_factory=rollout.environment_factory"):
        rollout([[{"role": "user", "content": ""}]], trainer)
    with pytest.raises(ValueError, match="max_response_tokens must be positive"):
        BatRollout(max_response_tokens=0)
