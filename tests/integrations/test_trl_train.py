"""TRL's GRPOTrainer trains a tiny local model on a bat_gym env, rubric reward included."""

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from bat_gym.integrations.trl import BatRollout, bat_dataset, rubric_reward  # noqa: E402


class RecordingRollout(BatRollout):
    """Keeps every batch's results, to compare with what the trainer logged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches = []

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        self.batches.append((self.last_results, out))
        return out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers deprecations inside TRL
def test_grpo_trains_on_a_bat_env_with_the_rubric_reward(
    toy, toy_bank, tiny_model_dir, tmp_path, monkeypatch, helpers
):
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    # A 16-token cap per turn ends turns early and cut_turn="act" runs them, so the env
    # replies (a malformed-call error) inside the 160-token completion: there are reply
    # tokens to mask.
    rollout = RecordingRollout(
        "bat/E2E-v0",
        env_kwargs={"benchmark": toy, "states": toy_bank},
        max_new_tokens_per_turn=16,
        cut_turn="act",
    )
    args = helpers.tiny_grpo_config(tmp_path, max_steps=2, max_completion_length=160)
    trainer = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=rubric_reward,
        args=args,
        train_dataset=bat_dataset(toy_bank, focus="S1"),
        processing_class=tokenizer,
        rollout_func=rollout,
        environment_factory=rollout.environment_factory,
    )
    seen = []
    score = trainer._generate_and_score_completions

    def capture(inputs):
        out = score(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = capture
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        trainer.train()
    finally:
        rollout.close()

    assert trainer.state.global_step == 2
    assert any(
        not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters()
    ), "no parameter moved"
    assert len(rollout.batches) == len(seen) == 2
    logged = [h for h in trainer.state.log_history if "rewards/rubric_reward/mean" in h]
    assert len(logged) == 2
    for (results, out), batch, log in zip(rollout.batches, seen, logged, strict=True):
        # One GRPO group per batch: both rollouts replayed the same Stage Bank state.
        assert len({r.state_id for r in results}) == 1
        assert out["env_mask"] == [r.response_mask for r in results]
        # The rewards are the env's rubric verdicts.
        assert all(r.verdict is not None for r in results)
        mean = sum(r.reward for r in results) / len(results)
        assert log["rewards/rubric_reward/mean"] == pytest.approx(mean)
        # TRL's tool_mask is the rollout's env_mask: env replies are out of the loss.
        mask = batch["tool_mask"] * batch["completion_mask"]
        for i, r in enumerate(results):
            n = len(r.response_ids)
            assert batch["completion_ids"][i, :n].tolist() == r.response_ids
            assert batch["tool_mask"][i, :n].tolist() == r.response_mask
            assert mask[i, n:].sum() == 0
        zeros = [
            t
            for row, m in zip(batch["completion_ids"].tolist(), mask.tolist(), strict=True)
            for t, k in zip(row, m, strict=True)
            if k == 0
        ]
        replies = tokenizer.decode(zeros)
        assert "[tool call error]" in replies and "<|im_start|>user" in replies
        assert 0 < mask.sum() < batch["completion_mask"].sum()
