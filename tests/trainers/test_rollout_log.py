import json
from types import SimpleNamespace

from bat_gym.trainers.rollout_log import KEEP_PER_STEP, log_rollouts, sample_indices, step_file


def rollout(state, reward):
    info = {
        "messages": [],
        "turns": 1,
        "stage": "S3",
        "track": "t",
        "verdict": None,
        "record": None,
    }
    return SimpleNamespace(
        state_id=state,
        reward=reward,
        reward_or_none=reward,
        verdict=None,
        stop_reason="terminated",
        response_mask=[1, 1, 0, 1],
        info=info,
        messages=[{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
    )


def test_sample_round_robins_over_groups():
    assert sample_indices(["a", "a", "b", "b"], 3) == [0, 1, 2]
    assert sample_indices(["a", "a", "b", "b", "c", "c"], 2) == [0, 2]
    assert sample_indices(["a"] * 3, 0) == []


def test_a_step_file_is_bounded_and_overwritten_when_redone(tmp_path):
    rollouts = [rollout(f"s{i // 4}", i / 40) for i in range(40)]
    path = log_rollouts(tmp_path, 3, rollouts, ["target"] * 40)
    assert path == step_file(tmp_path, 3) and path.name == "step_000003.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == KEEP_PER_STEP
    assert len({x["group"] for x in lines}) == KEEP_PER_STEP  # one per group first
    assert lines[0]["step"] == 3 and lines[0]["sampled_tokens"] == 3
    assert lines[0]["prefix_messages"] == 1 and lines[0]["format"] == "bat_gym.episode/1"
    log_rollouts(tmp_path, 3, rollouts[:2], ["target"] * 2)
    assert len(path.read_text().splitlines()) == 2
