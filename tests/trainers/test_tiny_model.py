"""`bat-gym tiny-model`: a loadable tiny model whose tokenizer knows the benchmark's text."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from bat_gym.cli import app  # noqa: E402
from bat_gym.trainers.tiny_model import benchmark_corpus  # noqa: E402


def test_the_command_builds_a_model_that_loads_and_tokenizes_the_benchmark(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny"
    result = CliRunner().invoke(
        app, ["tiny-model", str(out), "--benchmark", "toy-pipeline", "--layers", "1"]
    )
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 128
    # The benchmark's own words are few tokens each: the vocabulary was learned on them.
    text = "Write pipeline/infer.py: it reads data/cases.csv and model/model.json"
    assert len(tokenizer.encode(text)) < len(text) / 2.5
    assert tokenizer.chat_template


def test_the_corpus_holds_prompts_and_teacher_turns():
    texts = benchmark_corpus("toy_pipeline", tasks_per_track=1)
    joined = "\n".join(texts)
    assert "<tool_call>" in joined and "plan/plan.md" in joined and "execute_code" in joined


def test_a_width_that_is_not_whole_heads_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["tiny-model", str(tmp_path / "t"), "--hidden-size", "100"])
    assert result.exit_code != 0 and "multiple of 64" in result.output
