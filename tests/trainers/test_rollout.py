"""GRPO rollouts: concurrent token-level episodes, trained on exactly what was sampled."""

import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.policies import EpisodeContext, PolicyRequest, make_policy  # noqa: E402
from bat_gym.policies.local import TokenGeneration  # noqa: E402
from bat_gym.protocol import get_protocol  # noqa: E402
from bat_gym.rubrics.reward import RubricReward  # noqa: E402
from bat_gym.trainers.rollout import RolloutWorkers  # noqa: E402
from bat_gym.trainers.tiny_model import build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERMES = get_protocol("hermes")


@pytest.fixture(scope="module")
def tokenizer(toy_bank, tmp_path_factory):
    texts = [m.get("content") or "" for i in toy_bank.select() for m in toy_bank.get(i).messages]
    texts += (ROOT / "README.md").read_text().splitlines()
    return build_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=700)


class TeacherTokens:
    """A batch generator that emits each episode's next teacher turn, recording prompts."""

    def __init__(self, toy, toy_bank, tokenizer) -> None:
        self.toy, self.bank, self.tokenizer = toy, toy_bank, tokenizer
        self.prompts: list[list[int]] = []
        self.batches: list[int] = []
        self.sampled: list[list[int]] = []
        self.turn_of: dict[tuple[int, ...], int] = {}
        self.lock = threading.Lock()

    def turns(self, state_id):
        state = self.bank.get(state_id)
        ctx = EpisodeContext(benchmark=self.toy, state=state, turn=0)
        return make_policy("teacher")._turns(PolicyRequest([], [], ctx))

    def __call__(self, prompts, max_new_tokens):
        out = []
        with self.lock:
            self.batches.append(len(prompts))
            for prompt in prompts:
                self.prompts.append(list(prompt))
                # Each earlier turn left two end-of-turn tokens: its own and its reply's.
                k = (prompt.count(self.tokenizer.eos_token_id) - self.prompt_turns) // 2
                turn = self.script[k]
                ids = self.tokenizer.encode(HERMES.render(turn.content, list(turn.calls)))
                ids = ids + [self.tokenizer.eos_token_id]
                self.sampled.append(ids)
                out.append(TokenGeneration(ids, [-0.25] * len(ids), "stop"))
        return out


def make_env(toy, toy_bank):
    return RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank))


def test_every_turn_is_trained_on_exactly_the_ids_that_were_sampled(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="E2E")[0]
    gen = TeacherTokens(toy, toy_bank, tokenizer)
    gen.script = gen.turns(state_id)
    # The prompt's own end-of-turn tokens (system, user) precede the first turn.
    workers = RolloutWorkers(lambda: make_env(toy, toy_bank), gen, tokenizer, max_new_tokens=512)
    env = make_env(toy, toy_bank)
    _, info = env.reset(options={"state_id": state_id})
    env.close()
    from bat_gym.integrations._episode import render_ids

    prompt = render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)
    gen.prompt_turns = prompt.count(tokenizer.eos_token_id)
    try:
        (result,) = workers.play([state_id])
    finally:
        workers.close()
    assert result.stop_reason == "terminated" and result.reward == pytest.approx(1.0)
    sequence = result.prompt_ids + result.response_ids
    for seen in gen.prompts:  # every turn was conditioned on a prefix of the sequence
        assert sequence[: len(seen)] == seen
    sampled = [t for t, m in zip(result.response_ids, result.response_mask, strict=True) if m]
    assert sampled == [t for s in gen.sampled for t in s]
    assert result.response_logprobs.count(-0.25) == len(sampled)


def test_group_episodes_meet_in_one_generation_batch(toy, toy_bank, tokenizer):
    state_id = toy_bank.select(focus="S1")[0]
    gen = TeacherTokens(toy, toy_bank, tokenizer)
    gen.script = gen.turns(state_id)
    env = make_env(toy, toy_bank)
    _, info = env.reset(options={"state_id": state_id})
    env.close()
    from bat_gym.integrations._episode import render_ids

    prompt = render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)
    gen.prompt_turns = prompt.count(tokenizer.eos_token_id)
    workers = RolloutWorkers(
        lambda: make_env(toy, toy_bank), gen, tokenizer, max_new_tokens=512, num_envs=4, wait_s=0.05
    )
    try:
        results = workers.play([state_id] * 4)
    finally:
        workers.close()
    assert [r.state_id for r in results] == [state_id] * 4
    assert all(r.reward == pytest.approx(1.0) for r in results)
    assert max(gen.batches) > 1  # concurrent episodes were decoded together
    assert len(workers._all) <= 4
