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

    # The defaults: cut turns end the episode; token-limited and unfinished episodes train
    # on their reward less a penalty.
    assert (
        invoke("train", "grpo", "--model", "m", "--out", tmp_path, "--state-id", "s1").exit_code
        == 0
    )
    assert seen[1].cut_turn == "end" and seen[1].overlong == "penalize"
    assert seen[1].unfinished == "penalize"
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


COMMANDS = [
    (("train", "sft"), "SFTConfig"),
    (("train", "grpo"), "GRPOConfig"),
    (("loop",), "BiCuRLConfig"),
]
# Fields a command fills itself, and options whose default the command computes.
NOT_OPTIONS = {"SFTConfig": {"data_dir"}}  # the command exports the rows to OUT/data
COMPUTED_DEFAULT = {"SFTConfig": {"warmup_steps"}}  # min(10, steps // 10): see --help


def click_command(*path):
    import typer

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


@pytest.mark.parametrize(("path", "name"), COMMANDS)
def test_every_config_field_is_an_option_with_the_configs_default_and_help(path, name):
    """One source: each field's option has the config's name, default and docstring."""
    from bat_gym.trainers import configs
    from bat_gym.trainers.config_options import config_fields, to_config

    config = getattr(configs, name)
    options = {p.name: p for p in click_command(*path).params}
    parsed = {f.name: f for f in config_fields(config)}
    fields = config.model_fields
    assert set(parsed) == set(fields)  # every field is read
    for field_name, field in fields.items():
        if field_name in NOT_OPTIONS.get(name, ()):
            assert field_name not in options
            continue
        option = options[field_name]
        assert ("--" + field_name.replace("_", "-")) in option.opts, option.opts
        assert option.help and len(option.help) > 10, f"{name}.{field_name} has no help"
        assert option.help.startswith(parsed[field_name].help[:40])
        if field_name in COMPUTED_DEFAULT.get(name, ()):
            assert option.default is None and "Default:" in option.help
            continue
        if field.is_required():
            assert option.required, f"{name}.{field_name} is required in the config"
            continue
        default = field.get_default(call_default_factory=True)
        assert to_config(parsed[field_name], option.default) == default, field_name


def test_a_config_error_is_a_usage_error_naming_the_field(tmp_path):
    result = invoke(
        "train", "grpo", "--model", "m", "--out", tmp_path, "--state-id", "s1", "--group-size", 1
    )
    assert result.exit_code == 2 and "group_size must be >= 2" in plain(result.output)
    result = invoke("train", "grpo", "--model", "m", "--out", tmp_path, "--curriculum", "[1]")
    assert result.exit_code == 2 and "is not a JSON object" in plain(result.output)


def test_the_loop_hands_its_grpo_flags_to_every_round(tmp_path, monkeypatch):
    import bat_gym.trainers.bicurl as bicurl

    loops = []
    monkeypatch.setattr(bicurl, "run_loop", lambda cfg: loops.append(cfg) or bicurl.LoopState())
    result = invoke(
        "loop", "--model", "m", "--out", tmp_path, "--lr", "1e-6", "--max-turns", 3,
        "--grpo", '{"kl_coef": 0.01}', "--eval-track", "a", "--eval-track", "b",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (cfg,) = loops
    assert cfg.grpo == {"kl_coef": 0.01, "lr": 1e-6, "max_turns": 3}
    assert cfg.eval_max_turns == 3 and cfg.eval_tracks == ("a", "b")
