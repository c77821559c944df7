"""The one-line hint a GRPO step without a learning signal logs, and when it stays quiet."""

import logging

import pytest

from bat_gym.trainers.grpo_metrics import StepMetrics, no_signal_hint, warn_without_signal

ZERO = dict.fromkeys(
    [
        "reward",
        "loss",
        "kl",
        "clip_fraction",
        "entropy",
        "grad_norm",
        "lr",
        "sampler_logprob_gap",
        "sampler_gap_alarm",
        "tis_truncated_fraction",
        "rollout_s",
        "update_s",
        "response_tokens",
        "turns",
        "finished",
        "rerendered_replies",
    ],
    0.0,
)


def _step(**fields) -> StepMetrics:
    base = {"step": 3, "reward_by_pool": {}, "scored_rollouts": 4, "tis_weight_mean": 1.0}
    return StepMetrics.model_validate({**ZERO, **base, "zero_advantage_groups": 1.0, **fields})


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"length_cut": 1.0}, "a token limit cut every episode (cut 1.00): raise --max-new-tokens"),
        ({"length_cut": 0.5}, "no rollout earned credit: SFT the model first"),
        ({"length_cut": 0.0, "reward": 0.4}, "scored alike: raise --group-size or --temperature"),
    ],
)
def test_a_step_without_signal_says_why_in_one_line(fields, says):
    hint = no_signal_hint(_step(**fields).model_dump())
    assert hint.startswith("GRPO step 3: no learning signal (zero-adv groups 1.00, reward")
    assert says in hint and "\n" not in hint


def test_a_step_with_signal_is_quiet(caplog):
    assert no_signal_hint(_step(zero_advantage_groups=0.5, length_cut=1.0)) is None
    with caplog.at_level(logging.WARNING):
        warn_without_signal(_step(zero_advantage_groups=0.5, length_cut=0.0))
        assert not caplog.records
        warn_without_signal(_step(length_cut=1.0))
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "GRPO step 3: no learning signal (zero-ad"
    ]
