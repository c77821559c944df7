"""The run configs: torch-free, strict, and their errors name the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bat_gym.core.errors import ConfigError
from bat_gym.settings import EnvSettings
from bat_gym.trainers.configs import BiCuRLConfig, EvalRunConfig, GRPOConfig, SFTConfig


def test_the_configs_import_without_torch():
    code = "import bat_gym.trainers.configs, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_field_has_its_docstring_as_help():
    for config in (GRPOConfig, SFTConfig, BiCuRLConfig, EvalRunConfig):
        for name, field in config.model_fields.items():
            assert field.description and len(field.description) > 10, f"{config.__name__}.{name}"
    assert GRPOConfig.model_fields["lr"].description.startswith("Learning rate")


def test_paths_are_kept_as_text_and_unknown_fields_are_refused(tmp_path):
    cfg = SFTConfig(model=tmp_path, data_dir=tmp_path / "data")
    assert cfg.model == str(tmp_path) and cfg.data_dir == str(tmp_path / "data")
    with pytest.raises(ConfigError, match="SFTConfig: stepz: Extra inputs are not permitted"):
        SFTConfig(model="m", stepz=3)
    # A check's own message is handed on as written.
    with pytest.raises(ConfigError, match=r"^group_size must be >= 2"):
        GRPOConfig(model="m", output_dir="o", state_ids=("s",), group_size=1)
    with pytest.raises(ConfigError, match="thresholds"):
        BiCuRLConfig(model="m", output_dir="o", thresholds={"no_such_threshold": 1})


def test_the_loop_checks_its_grpo_overrides_before_the_first_round():
    with pytest.raises(ConfigError, match="^grpo: GRPOConfig: lrr: Extra inputs"):
        BiCuRLConfig(model="m", output_dir="o", grpo={"lrr": 1e-5})
    with pytest.raises(ConfigError, match="^grpo: group_size must be >= 2"):
        BiCuRLConfig(model="m", output_dir="o", grpo={"group_size": 1})
    loop = BiCuRLConfig(model="m", output_dir="o", kl_reference="start", grpo={"steps": 3})
    block = loop.round_grpo("inc", "S2", "o/round-00/grpo", seed=5)
    assert (block.model, block.target, block.seed, block.steps) == ("inc", "S2", 5, 3)
    assert block.kl_reference == "m"  # the starting checkpoint anchors every round


def test_the_grpo_env_is_one_typed_settings_model():
    cfg = GRPOConfig(
        model="m", output_dir="o", state_ids=("s",), bank="banks/b", max_turns=3,
        env_kwargs={"budgets": {"tool_timeout_s": 30}, "sandbox_options": {"image": "x"}},
    )  # fmt: skip
    assert cfg.env == EnvSettings(
        bank="banks/b", budgets={"tool_timeout_s": 30, "max_turns": 3},
        sandbox_options={"image": "x"},
    )  # fmt: skip
    with pytest.raises(ConfigError, match="env_kwargs: budgets: .*no budget named max_turnz"):
        GRPOConfig(
            model="m", output_dir="o", state_ids=("s",), env_kwargs={"budgets": {"max_turnz": 3}}
        )
    with pytest.raises(ConfigError, match="env_kwargs: statez"):
        GRPOConfig(model="m", output_dir="o", state_ids=("s",), env_kwargs={"statez": "b"})


def test_env_settings_give_the_gym_make_arguments(toy_bank):
    plain = EnvSettings(benchmark="toy_pipeline", bank=str(toy_bank.root)).gym_kwargs()
    assert plain == {"backend": "local", "benchmark": "toy_pipeline", "states": str(toy_bank.root)}
    budgets = EnvSettings(benchmark="toy_pipeline", budgets={"max_turns": 3}).gym_kwargs()
    assert budgets["budgets"].max_turns == 3
    assert budgets["budgets"].max_tool_calls > 0  # the benchmark's own, kept


def test_the_evaluation_command_carries_every_setting():
    cfg = EvalRunConfig(
        benchmark="b", repeats=2, tracks=("t1", "t2"), max_turns=3, temperature=0.5,
        chat_template_kwargs={"enable_thinking": False}, seed=7,
    )  # fmt: skip
    cmd = cfg.command("ckpt", str(Path("out")))
    assert cmd[1:4] == ["-m", "bat_gym.cli", "eval"]
    args = " ".join(cmd[4:])
    assert "--policy hf:ckpt --out out --workers 2 --quiet --repeats 2 --benchmark b" in args
    assert "--track t1 --track t2 --max-turns 3 --temperature 0.5" in args
    assert args.endswith('--chat-template-kwargs {"enable_thinking": false} --seed 7')
    loop = BiCuRLConfig(model="m", output_dir="o", eval_tracks=("t",), seed=3)
    assert loop.evaluation.tracks == ("t",) and loop.evaluation.seed == 3
