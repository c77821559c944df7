"""The GRPO trainer end to end on the toy benchmark, and its resumption after a kill."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from chat_templates import CHATML, qwen_model  # noqa: E402
from corpus import project_text  # noqa: E402

from bat_gym.core.errors import BatGymError, ConfigError  # noqa: E402
from bat_gym.rollout import EpisodeResult  # noqa: E402
from bat_gym.trainers.grpo import GRPOConfig, train  # noqa: E402
from bat_gym.trainers.grpo.batch import mask_overlong, shaped_reward  # noqa: E402
from bat_gym.trainers.grpo_metrics import read_metrics  # noqa: E402
from bat_gym.trainers.rollout import RolloutWorkers  # noqa: E402


def config(tiny, bank, out, **kw):
    # A random model does not finish a turn in 12 tokens, so every episode ends "length";
    # overlong="keep" trains on them anyway (under "mask" or the default "penalize" every
    # group would be uniform: no update).
    settings = dict(
        model=str(tiny), output_dir=str(out), benchmark="toy_pipeline", bank=str(bank.root),
        state_ids=tuple(bank.select(focus="S1")[:3]), steps=2, groups_per_step=1, group_size=2,
        max_new_tokens=12, max_turns=2, num_envs=2, lr=1e-3, save_every=1, seed=0,
        overlong="keep",
    )  # fmt: skip
    settings.update(kw)
    return GRPOConfig(**settings)


def test_grpo_runs_end_to_end_and_exports_a_loadable_model(tiny, toy_bank, tmp_path):
    from transformers import AutoModelForCausalLM

    seen = []
    summary = train(config(tiny, toy_bank, tmp_path, warmup_steps=2), on_step=seen.append)
    assert summary["steps"] == 2 and [m["step"] for m in seen] == [1, 2]
    assert [m["lr"] for m in seen] == pytest.approx([5e-4, 1e-3])  # linear warmup to 1e-3
    for key in ("reward", "kl", "clip_fraction", "entropy", "zero_advantage_groups",
                "response_tokens", "rollout_s", "update_s"):  # fmt: skip
        assert key in seen[0]
    assert seen[0]["scored_rollouts"] == 2  # one group of two
    assert seen[0]["reward_by_pool"] == {"fixed": seen[0]["reward"]}
    assert seen[0]["response_tokens"] > 0
    # The trainer scores the sampled tokens as the sampler did: same ids, same positions,
    # same temperature scaling.
    assert seen[0]["sampler_logprob_gap"] < 1e-4
    AutoModelForCausalLM.from_pretrained(summary["final"])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    # The file reads back checked, the keys of the records handed to on_step.
    steps = read_metrics(tmp_path / "metrics.jsonl")
    assert [m.model_dump() for m in steps] == [json.loads(x) for x in lines]
    assert set(json.loads(lines[0])) == set(seen[0])


def test_a_metrics_line_that_is_not_a_step_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n')
    with pytest.raises(BatGymError, match=r"metrics.jsonl:1: not a GRPO step's metrics: step"):
        read_metrics(path)
    path.write_text('{"step": 1, "rew')
    with pytest.raises(BatGymError, match="torn"):
        read_metrics(path)


def test_config_errors_name_the_fix(tiny, toy_bank, tmp_path):
    # ConfigError is a BatGymError (the CLI shows it as one line) and a ValueError.
    with pytest.raises(ConfigError, match="target"):
        GRPOConfig(model="m", output_dir="o")
    with pytest.raises(ConfigError, match="group_size"):
        config(tiny, toy_bank, tmp_path, group_size=1)
    with pytest.raises(ConfigError, match="generator"):
        config(tiny, toy_bank, tmp_path, generator="sglang")
    with pytest.raises(ConfigError, match="warmup_steps"):
        config(tiny, toy_bank, tmp_path, warmup_steps=3)
    for field, value in (
        ("cut_turn", "run"),
        ("overlong", "drop"),
        ("overlong_penalty", -1.0),
        ("max_total_tokens", 1),
        ("chat_template_kwargs", '{"enable_thinking": false}'),
    ):
        with pytest.raises(ConfigError, match=field):
            config(tiny, toy_bank, tmp_path, **{field: value})


def episode(stop_reason, reward):
    return EpisodeResult(
        state_id="s", prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
        response_logprobs=None, reward=reward, verdict=None, num_turns=1, num_replies=0,
        stop_reason=stop_reason, messages=[],
        length_limit="turn" if stop_reason == "length" else None,
    )  # fmt: skip


def test_episodes_a_token_limit_ended_are_masked_penalized_or_kept(tiny, toy_bank, tmp_path):
    rollouts = [episode("terminated", 1.0), episode("length", 0.4), episode("truncated", 0.0)]
    # penalize: the advantages see the reward less the penalty; the env's reward is kept.
    # (unfinished="keep": the budget-ended episode's own penalty is test_unfinished.py's.)
    cfg = config(
        tiny, toy_bank, tmp_path, overlong="penalize", overlong_penalty=0.5, unfinished="keep"
    )
    assert [shaped_reward(r, cfg) for r in rollouts] == pytest.approx([1.0, -0.1, 0.0])
    assert rollouts[1].reward == 0.4
    for mode in ("keep", "mask"):
        cfg = config(tiny, toy_bank, tmp_path, overlong=mode, unfinished="keep")
        assert [shaped_reward(r, cfg) for r in rollouts] == pytest.approx([1.0, 0.4, 0.0])
    # mask: the cut episode leaves the update with its advantage; the env's own
    # truncation (a turn budget) is an outcome like any other and stays.
    kept, adv = mask_overlong(rollouts, torch.tensor([0.5, -0.1, -0.4]))
    assert kept == [rollouts[0], rollouts[2]] and adv.tolist() == pytest.approx([0.5, -0.4])
    kept, adv = mask_overlong(rollouts[1:2], torch.tensor([0.3]))
    assert kept == [] and adv.shape == (0,)


def test_grpo_gives_the_episodes_the_samplers_stop_tokens_and_masks_cut_ones(
    toy_bank, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bat_gym.trainers.grpo import loop

    # A Qwen base tokenizer: eos <|endoftext|>, chat turns end in <|im_end|>.
    texts = project_text()
    start = qwen_model(tmp_path / "start", texts, template=CHATML)
    tok = AutoTokenizer.from_pretrained(start)
    seen = {}

    class Spy(RolloutWorkers):
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loop, "RolloutWorkers", Spy)
    template = {"enable_thinking": False}
    cfg = config(start, toy_bank, tmp_path / "run", steps=1, max_new_tokens=8,
                 overlong="mask", kl_coef=0.0, chat_template_kwargs=template)  # fmt: skip
    summary = train(cfg)
    assert set(seen["stop_token_ids"]) == set(
        tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    )
    assert seen["chat_template_kwargs"] == template and seen["cut_turn"] == "end"
    assert seen["max_total_tokens"] == 8192  # the model's max_position_embeddings
    step = summary["history"][0]
    assert step["length_cut"] == 1.0  # 8 tokens never finish a turn
    assert step["loss"] == 0.0 and step["grad_norm"] == 0.0
    # Every episode was masked out of the loss: the weights did not move.
    before = AutoModelForCausalLM.from_pretrained(start).state_dict()
    after = AutoModelForCausalLM.from_pretrained(summary["final"]).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_bf16_checkpoint_trains_fp32_master_weights_at_the_reference_lr(
    tiny, toy_bank, tmp_path, monkeypatch
):
    """One AdamW step at lr 2.5e-7 moves every weight that has a gradient by ~lr: far
    below bf16's spacing, so a bf16 master copy would round nearly all of it away."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bat_gym.trainers.grpo import batch

    start = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16).save_pretrained(start)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(start)
    # Rewards of a random tiny model are all 0; fixed advantages give every step a
    # policy gradient, which is what this test is about.
    monkeypatch.setattr(batch, "group_advantages", lambda r, g, **_: torch.linspace(-1, 1, len(r)))
    cfg = config(start, toy_bank, tmp_path / "run", steps=1, lr=2.5e-7, kl_coef=0.0)
    summary = train(cfg)
    before = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32).state_dict()
    after = AutoModelForCausalLM.from_pretrained(summary["final"], dtype="auto").state_dict()
    blocks = [k for k in before if ".layers." in k and k.endswith("weight")]
    assert all(after[k].dtype == torch.float32 for k in blocks)
    moved = sum(int((after[k] != before[k]).sum()) for k in blocks)
    total = sum(before[k].numel() for k in blocks)
    assert moved / total > 0.9, f"{moved} of {total} weights moved"


def test_a_resumed_run_samples_and_trains_as_the_uninterrupted_run(tiny, toy_bank, tmp_path):
    # Four episodes on two envs at once: whose turn reaches the sampler first varies, and
    # the episodes' seed keys (step, rank, place) decide the draws all the same. Rewards
    # are 0 (no advantage), so weight decay is what moves the weights between steps.
    kw = dict(steps=2, group_size=4, num_envs=2, temperature=1.0, lr=0.05, weight_decay=1.0)
    whole = tmp_path / "whole"
    train(config(tiny, toy_bank, whole, **kw))
    split = tmp_path / "split"
    train(config(tiny, toy_bank, split, **{**kw, "steps": 1}))
    train(config(tiny, toy_bank, split, **kw))  # resumes from step 1
    want, got = read_metrics(whole / "metrics.jsonl"), read_metrics(split / "metrics.jsonl")
    assert [h.step for h in got] == [h.step for h in want] == [1, 2]
    for a, b in zip(want, got, strict=True):
        # The entropy is taken over the sampled tokens: other draws, another entropy.
        for key in ("response_tokens", "entropy", "loss", "kl", "grad_norm"):
            assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-5, abs=1e-7), (
                a.step,
                key,
            )
    assert want[1].kl > 0  # step 2 sampled from weights step 1 had moved
    # A setting that changes the update is refused, as the SFT trainer refuses it.
    with pytest.raises(ConfigError, match="lr: checkpoint"):
        train(config(tiny, toy_bank, split, **{**kw, "steps": 3, "lr": 2e-3}))


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint(tiny, toy_bank, tmp_path):
    cfg = config(tiny, toy_bank, tmp_path, steps=4, warmup_steps=4)
    script = textwrap.dedent(
        f"""
        import torch
        from bat_gym.trainers.grpo import GRPOConfig, train
        torch.set_num_threads(1)
        train(GRPOConfig(**{ ({**cfg.__dict__, "state_ids": tuple(cfg.state_ids)})!r}))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    marker = tmp_path / "checkpoints" / "step-00000002" / "trainer_state.pt"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not marker.exists() and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert marker.exists(), "the run reached its second checkpoint before the kill"
    summary = train(cfg)
    assert summary["steps"] == 4
    assert [h["step"] for h in summary["history"]] == [1, 2, 3, 4]
    # The lr schedule continued where it stopped, not from the start of the warmup.
    assert [h["lr"] for h in summary["history"]] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]  # no step logged twice
    latest = sorted((tmp_path / "checkpoints").glob("step-*"))[-1]
    saved = torch.load(latest / "trainer_state.pt", weights_only=False)
    assert saved["sampler"]["cursor"] == 4  # the state sequence continued, not restarted
    assert len(list((tmp_path / "checkpoints").glob("step-*"))) == cfg.keep_last


@pytest.mark.slow
def test_grpo_rollouts_on_ray_actors(local_ray, tiny, toy_bank, tmp_path):
    summary = train(config(tiny, toy_bank, tmp_path, steps=1, ray="local"))
    assert summary["steps"] == 1
    assert summary["history"][0]["scored_rollouts"] == 2


def test_a_curriculum_round_feeds_the_groups_and_rewards_are_logged_per_pool(
    tiny, toy_bank, tmp_path
):
    seen = []
    cfg = config(tiny, toy_bank, tmp_path, state_ids=(), target="S2", steps=1, groups_per_step=8)
    train(cfg, on_step=seen.append)
    # One reference batch: 4 S-target, 2 S-mix and 2 E2E states, two rollouts each.
    assert seen[0]["scored_rollouts"] == 16
    assert set(seen[0]["reward_by_pool"]) == {"target", "mix", "e2e"}


@pytest.mark.slow
def test_a_vllm_generator_samples_with_the_weights_of_the_last_update(tiny, toy_bank, tmp_path):
    pytest.importorskip(
        "vllm", reason="vllm is not installed (optional extra: pip install 'bat-gym[vllm]')"
    )
    engine = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.3,
              "max_model_len": 2048}  # fmt: skip
    # An untrained model earns no reward to learn from, so weight decay moves the
    # weights (5% a step) whatever the advantages.
    cfg = config(
        tiny, toy_bank, tmp_path, steps=3, generator="vllm", vllm_kwargs=engine,
        lr=0.05, weight_decay=1.0,
    )  # fmt: skip
    history = train(cfg)["history"]
    # The trainer moved away from the starting (reference) model ...
    assert history[-1]["kl"] > 1e-4, history
    # ... and re-scores vLLM's samples as vLLM did: after each update vLLM got the new
    # weights, or the gap would be the size of that move, not float noise.
    assert all(h["sampler_logprob_gap"] < 1e-3 for h in history), history
