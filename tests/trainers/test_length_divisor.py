"""``seq_mean_token_sum_norm`` divides by the policy's own tokens, not the tool results.

The divisor used to be the longest response *including* the env's replies, which carry
loss mask 0: a long tool output anywhere in the step shrank every rollout's gradient,
an effective learning rate that moved from step to step with the tool outputs. Here the
real update runs on a tiny model, with and without a long tool reply at the end of one
rollout: the reply changes neither the loss nor the gradient.
"""

from contextlib import nullcontext
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.rollout import EpisodeResult  # noqa: E402
from bat_gym.trainers.fsdp import Dist  # noqa: E402
from bat_gym.trainers.grpo import GRPOConfig  # noqa: E402
from bat_gym.trainers.grpo.batch import policy_tokens  # noqa: E402
from bat_gym.trainers.grpo.update import make_optimizer, update  # noqa: E402

PROMPT = [5, 6, 7]
REPLY = [40 + i for i in range(12)]  # a tool result: 12 tokens the policy did not write


def rollout(sampled, reply=()):
    """A rollout whose response is ``sampled`` (mask 1), then ``reply`` (mask 0)."""
    return EpisodeResult(
        state_id="s", prompt_ids=PROMPT, response_ids=[*sampled, *reply],
        response_mask=[1] * len(sampled) + [0] * len(reply), response_logprobs=None,
        reward=0.0, verdict=None, num_turns=1, num_replies=int(bool(reply)),
        stop_reason="terminated", messages=[],
    )  # fmt: skip


def step(tiny, tmp_path, rollouts):
    """One real update (lr 0: the weights stay) -> (stats, flat gradient)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny).float()
    cfg = GRPOConfig(
        model=str(tiny), output_dir=str(tmp_path), benchmark="toy_pipeline", state_ids=("s",),
        aggregation="seq_mean_token_sum_norm", kl_coef=0.0, lr=0.0, max_grad_norm=1e9,
        gradient_checkpointing=False, mlp_chunk_size=None, device="cpu",
    )  # fmt: skip
    opt = make_optimizer(model, cfg, torch.device("cpu"))
    stats = update(
        model, None, opt, rollouts, torch.tensor([0.5, -0.5]), cfg, torch.device("cpu"),
        SimpleNamespace(pad_token_id=0), nullcontext(), Dist(), set_checkpointing=False,
    )  # fmt: skip
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return stats, grad


def test_policy_tokens_leave_out_the_tool_results():
    assert policy_tokens(rollout([8, 9, 10], REPLY)) == 3
    assert len(rollout([8, 9, 10], REPLY).response_ids) == 15


def test_a_long_tool_result_changes_neither_the_loss_nor_the_gradient(tiny, tmp_path):
    short = [rollout([8, 9, 10]), rollout([11, 12])]
    long = [rollout([8, 9, 10]), rollout([11, 12], REPLY)]
    s_short, g_short = step(tiny, tmp_path / "a", short)
    s_long, g_long = step(tiny, tmp_path / "b", long)
    # On-policy (rho = 1) each sampled token's policy term is -A_i, so with the divisor
    # L = 3 (the most tokens a rollout sampled):
    # loss = (1/B) sum_i (1/L) sum_t -A_i = -(0.5 * 3 - 0.5 * 2) / (2 * 3)
    assert s_short["loss"] == pytest.approx(-(0.5 * 3 - 0.5 * 2) / 6, abs=1e-6)
    assert s_long["loss"] == pytest.approx(s_short["loss"], abs=1e-6)
    assert s_long["grad_norm"] == pytest.approx(s_short["grad_norm"], rel=1e-4)
    torch.testing.assert_close(g_long, g_short, rtol=1e-4, atol=1e-7)
