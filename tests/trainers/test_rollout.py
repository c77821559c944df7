"""Token-in/token-out rollouts: training sees exactly the ids the policy saw and sampled."""

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.policies import make_policy  # noqa: E402
from bat_gym.policies.transformers_policy import TokenGeneration  # noqa: E402
from bat_gym.protocol import get_protocol  # noqa: E402
from bat_gym.rubrics.reward import RubricReward  # noqa: E402
from bat_gym.trainers.rollout import RolloutWorkers, TemplateDelta, play_token_episode  # noqa: E402
from bat_gym.trainers.tiny_model import build_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERMES = get_protocol("hermes")


@pytest.fixture(scope="module")
def tokenizer(toy_bank, tmp_path_factory):
    from transformers import AutoTokenizer

    texts = [m.get("content") or "" for i in toy_bank.select() for m in toy_bank.get(i).messages]
    texts += (ROOT / "README.md").read_text().splitlines()
    path = build_tiny_model(tmp_path_factory.mktemp("m"), texts, vocab_size=700, hidden_size=64)
    return AutoTokenizer.from_pretrained(path)


class TeacherTokens:
    """Emits the teacher's next turn as tokens, recording every prompt it is given."""

    def __init__(self, bench, state, tokenizer, *, cut_at: int | None = None) -> None:
        self.turns = list(make_policy("teacher")._turns(_request(bench, state)))
        self.tokenizer = tokenizer
        self.prompts: list[list[int]] = []
        self.samples: list[list[int]] = []
        self.cut_at = cut_at

    def __call__(self, prompt: list[int]) -> TokenGeneration:
        self.prompts.append(list(prompt))
        turn = self.turns[len(self.samples)]
        text = HERMES.render(turn.content, list(turn.calls))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.cut_at is not None and len(self.samples) == 0:
            # A turn cut by the length limit: no end-of-turn token sampled.
            ids, reason = ids, "length"
        else:
            ids, reason = ids + [self.tokenizer.eos_token_id], "stop"
        self.samples.append(ids)
        return TokenGeneration(ids, [-0.5] * len(ids), reason)


def _request(bench, state):
    from bat_gym.policies import EpisodeContext, PolicyRequest

    return PolicyRequest([], [], EpisodeContext(benchmark=bench, state=state, turn=0))


@pytest.fixture
def env(toy, toy_bank):
    env = RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank))
    yield env
    env.close()


def test_no_retokenization_drift_across_turns(toy, toy_bank, tokenizer, env):
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    gen = TeacherTokens(toy, state, tokenizer)
    _, info = env.reset(options={"state_id": state.state_id})
    delta = TemplateDelta(tokenizer, info["tools"])
    rollout = play_token_episode(env, gen, delta, state_id=state.state_id)
    assert rollout.finished and rollout.reward == pytest.approx(1.0)
    sequence = rollout.prompt_ids + rollout.completion_ids
    # Every generation was conditioned on a prefix of the training sequence...
    for prompt in gen.prompts:
        assert sequence[: len(prompt)] == prompt
    # ...and the sampled ids sit in it unchanged, each followed by its observation.
    sampled = [t for t, m in zip(rollout.completion_ids, rollout.loss_mask, strict=True) if m]
    assert sampled == [t for s in gen.samples for t in s]
    starts = [len(p) - len(rollout.prompt_ids) for p in gen.prompts[1:]]
    for start, sample in zip([0, *starts], gen.samples, strict=False):
        assert rollout.completion_ids[start : start + len(sample)] == sample
        assert all(rollout.loss_mask[start : start + len(sample)])
    assert rollout.sample_logprobs.count(-0.5) == len(sampled)


def test_observations_are_the_templates_rendering_of_tool_results(toy, toy_bank, tokenizer, env):
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    gen = TeacherTokens(toy, state, tokenizer)
    _, info = env.reset(options={"state_id": state.state_id})
    rollout = play_token_episode(
        env, gen, TemplateDelta(tokenizer, info["tools"]), state_id=state.state_id
    )
    obs = [t for t, m in zip(rollout.completion_ids, rollout.loss_mask, strict=True) if not m]
    text = tokenizer.decode(obs)
    tool_results = [m["content"] for m in env.unwrapped.messages if m["role"] == "tool"]
    for result in tool_results[:-1]:  # the last (finish) ends the episode: no observation
        assert result in text
    assert text.count("<tool_response>") == len(tool_results) - 1
    # Each observation ends with the next generation prompt.
    assert text.count("<|im_start|>assistant\n") == rollout.turns - 1


def test_a_length_cut_turn_is_closed_by_an_observation_token(toy, toy_bank, tokenizer, env):
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    gen = TeacherTokens(toy, state, tokenizer, cut_at=0)
    _, info = env.reset(options={"state_id": state.state_id})
    rollout = play_token_episode(
        env, gen, TemplateDelta(tokenizer, info["tools"]), state_id=state.state_id
    )
    first = len(gen.samples[0])
    assert rollout.completion_ids[first] == tokenizer.eos_token_id  # added, not sampled
    assert rollout.loss_mask[first] == 0


def test_worker_pool_plays_groups_concurrently(toy, toy_bank, tokenizer):
    state = toy_bank.get(toy_bank.select(focus="S1")[0])
    turns = TeacherTokens(toy, state, tokenizer).turns
    text = HERMES.render(turns[0].content, list(turns[0].calls))
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    calls = []

    def generate_batch(prompts):
        calls.append(len(prompts))
        return [TokenGeneration(ids, [0.0] * len(ids), "stop") for _ in prompts]

    env0 = RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank))
    _, info = env0.reset(options={"state_id": state.state_id})
    env0.close()
    workers = RolloutWorkers(
        lambda: RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank)),
        generate_batch,
        TemplateDelta(tokenizer, info["tools"]),
        num_envs=4,
        wait_s=0.05,
    )
    try:
        rollouts = workers.play([state.state_id] * 4)
    finally:
        workers.close()
    assert [r.state_id for r in rollouts] == [state.state_id] * 4
    for r in rollouts:  # observations differ (they report durations); samples do not
        assert r.completion_ids[: len(ids)] == ids and r.reward is not None
    assert max(calls) > 1  # episodes met in one generation batch
