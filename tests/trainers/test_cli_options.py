"""The trainer commands hand their options to the trainers' configs (trainers stubbed)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from bat_gym.cli import app  # noqa: E402

TEMPLATE = '{"enable_thinking": false}'


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def plain(output: str) -> str:
    """The command's output without the error box's borders and line breaks."""
    return " ".join(output.replace("│", " ").split())


def test_grpo_options_reach_the_config(tmp_path, monkeypatch):
    import bat_gym.trainers.grpo as grpo

    seen = []

    def train(cfg, on_step=None):
        seen.append(cfg)
        return {"steps": 0, "final": str(tmp_path / "final"), "history": []}

    monkeypatch.setattr(grpo, "train", train)
    result = invoke(
        "train", "grpo", "--model", "m", "--out", tmp_path, "--state-id", "s1",
        "--max-total-tokens", 4096, "--cut-turn", "act", "--overlong", "penalize",
        "--overlong-penalty", 0.5, "--chat-template-kwargs", TEMPLATE,
        "--no-gradient-checkpointing",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (cfg,) = seen
    assert cfg.max_total_tokens == 4096 and cfg.cut_turn == "act"
    assert cfg.overlong == "penalize" and cfg.overlong_penalty == 0.5
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.gradient_checkpointing is False

    # The defaults: cut turns end the episode, token-limited episodes are masked.
    assert (
        invoke("train", "grpo", "--model", "m", "--out", tmp_path, "--state-id", "s1").exit_code
        == 0
    )
    assert seen[1].cut_turn == "end" and seen[1].overlong == "mask"
    assert seen[1].max_total_tokens is None and seen[1].chat_template_kwargs == {}
    assert seen[1].gradient_checkpointing is True


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--cut-turn", "run", "use one of end, act"),
        ("--overlong", "drop", "use one of mask, keep, penalize"),
        ("--chat-template-kwargs", "enable_thinking=false", "is not JSON"),
        ("--chat-template-kwargs", "[1]", "is not a JSON object"),
    ],
)
def test_bad_grpo_options_are_named(tmp_path, flag, value, message):
    result = invoke(
        "train", "grpo", "--model", "m", "--out", tmp_path, "--state-id", "s1", flag, value
    )
    assert result.exit_code == 2 and message in plain(result.output)


def test_sft_renders_and_trains_with_the_chat_template_kwargs(tmp_path, toy_bank, monkeypatch):
    import transformers

    import bat_gym.sft as sft_view
    import bat_gym.trainers.sft as sft

    exported, trained = [], []

    def export_sft(states, bench, tokenizer, out, max_length, **kwargs):
        exported.append(kwargs)
        return {"rows": 0, "rejected": 0}

    def train(cfg):
        trained.append(cfg)
        return {"step": 1, "train_loss": [0.5]}

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(sft_view, "export_sft", export_sft)
    monkeypatch.setattr(sft, "train", train)
    result = invoke(
        "train", "sft", "--model", "m", "--out", tmp_path, "--benchmark", "toy_pipeline",
        "--bank", toy_bank.root, "--chat-template-kwargs", TEMPLATE,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert exported == [{"chat_template_kwargs": {"enable_thinking": False}}]
    assert trained[0].chat_template_kwargs == {"enable_thinking": False}


def test_the_loop_trains_and_evaluates_with_the_same_chat_template_kwargs(tmp_path, monkeypatch):
    import subprocess

    import bat_gym.trainers.bicurl as bicurl
    import bat_gym.trainers.grpo as grpo

    loops = []
    monkeypatch.setattr(bicurl, "run_loop", lambda cfg: loops.append(cfg) or bicurl.LoopState())
    result = invoke("loop", "--model", "m", "--out", tmp_path, "--chat-template-kwargs", TEMPLATE)
    assert result.exit_code == 0, result.output
    (cfg,) = loops
    assert cfg.chat_template_kwargs == {"enable_thinking": False}

    # The evaluation child gets the same option ...
    commands = []

    def run(cmd, **kwargs):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(bicurl.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="exited with status 1"):
        bicurl.evaluate_checkpoint("m", tmp_path / "eval", cfg)
    flag = commands[0].index("--chat-template-kwargs")
    assert json.loads(commands[0][flag + 1]) == {"enable_thinking": False}
    # ... and so does every GRPO round.
    rounds = []
    monkeypatch.setattr(grpo, "train", lambda c: rounds.append(c) or {"final": "f"})
    bicurl._grpo_block("m", "S3", tmp_path / "grpo", cfg, seed=bicurl.round_seed(cfg.seed, 0))
    assert rounds[0].chat_template_kwargs == {"enable_thinking": False}
