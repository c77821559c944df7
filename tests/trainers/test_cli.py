"""`bat-gym train sft`, `train grpo` and `loop` end to end on MedBench-Lite, tiny budgets.

A tiny random-init model cannot solve MedBench-Lite; what is checked is that each
command runs the whole way (bank -> SFT view -> SFT -> GRPO on a curriculum -> the
loop's evaluations, gate and report) and leaves the files a user looks for.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from bat_gym.bank import build_bank  # noqa: E402
from bat_gym.catalog import get_benchmark  # noqa: E402
from bat_gym.cli import app  # noqa: E402
from bat_gym.trainers.tiny_model import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.slow


def bat_gym(*args: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_sft_then_grpo_then_the_loop_on_medbench_lite(tmp_path):
    bench = get_benchmark("medbench_lite")
    built = build_bank(bench, tmp_path / "bank", tasks_per_track=1)
    bank = built.root
    # The tokenizer learns from the states' own conversations, with a vocabulary that can
    # hold their words, as a real one has seen code: one of 500 tokens learned from the
    # skill texts alone spends a token on every character or two of a script, and the
    # longest prompts (10k tokens) would not fit the model's 8,192 positions.
    texts = [bench.spec.description, *(s.skill for s in bench.spec.stages)]
    texts += [m.get("content") or "" for i in built.select() for m in built.get(i).messages]
    model = build_tiny_model(tmp_path / "tiny", texts, vocab_size=4000)
    small = ["--benchmark", "medbench_lite", "--bank", bank, "--device", "cpu"]

    out = bat_gym("train", "sft", "--model", model, "--out", tmp_path / "sft", *small,
                  "--steps", 2, "--grad-accum", 1, "--eval-every", 0, "--save-every", 0)  # fmt: skip
    assert "SFT: step 2" in out
    sft = tmp_path / "sft" / "final"

    out = bat_gym("train", "grpo", "--model", sft, "--out", tmp_path / "grpo", *small,
                  "--target", "S3", "--steps", 1, "--group-size", 2, "--max-new-tokens", 16,
                  "--max-turns", 2, "--num-envs", 4, "--lr", 1e-4)  # fmt: skip
    assert "GRPO: 1 steps" in out and "target" in out  # per-pool rewards are printed
    assert (tmp_path / "grpo" / "final" / "config.json").is_file()

    out = bat_gym("loop", "--model", sft, "--out", tmp_path / "loop",
                  "--benchmark", "medbench_lite", "--bank", bank, "--rounds", 1,
                  "--steps-per-round", 1, "--eval-repeats", 1, "--max-turns", 2,
                  "--max-new-tokens", 16, "--group-size", 2, "--num-envs", 4)  # fmt: skip
    assert "best eligible checkpoint" in out
    state = json.loads((tmp_path / "loop" / "loop_state.json").read_text())
    assert len(state["rounds"]) == 1 and state["rounds"][0]["decision"]
    assert (tmp_path / "loop" / "report.md").is_file()
