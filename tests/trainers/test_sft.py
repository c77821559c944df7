import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from corpus import project_text  # noqa: E402

from bat_gym.core.errors import ConfigError  # noqa: E402
from bat_gym.core.protocol import ToolCall  # noqa: E402
from bat_gym.sft import IGNORE_INDEX, SFTAction, SFTRow, export_sft, render_rows, sft_rows  # noqa: E402
from bat_gym.trainers.schedule import lr_factor  # noqa: E402
from bat_gym.trainers.sft import (  # noqa: E402
    SFTConfig,
    collate,
    latest_checkpoint,
    load_sft_jsonl,
    masked_nll,
    resolve_bf16,
    target_nll,
    train,
)
from bat_gym.trainers.tiny_model import build_tiny_model  # noqa: E402

from .conftest import torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model is too small to gain from intra-op threads, and on a busy machine
    # they spin against each other (10x slower steps).
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny(toy, toy_bank, tmp_path_factory):
    """A 2-layer, 64-wide Qwen3-style model whose tokenizer learnt the toy bank's prompts."""
    from transformers import AutoTokenizer

    rows = sft_rows(toy_bank, toy)
    texts = [m.get("content") or "" for r in rows for m in r.context]
    texts += [r.target.content for r in rows] + project_text()
    path = build_tiny_model(
        tmp_path_factory.mktemp("tiny"), texts, vocab_size=512, hidden_size=64, num_heads=1
    )
    return SimpleNamespace(path=path, tokenizer=AutoTokenizer.from_pretrained(path), rows=rows)


def hand_row(k: int) -> SFTRow:
    # lengths vary with k, so micro-batches hold padding and rows differ in target count
    user = f"Task {k}: run pipeline step {k}" + " then check it" * (k % 3)
    return SFTRow(
        row_id=f"hand.t{k:03d}",
        trajectory_id=f"hand{k % 4}",
        source_state_id=f"state{k % 4}",
        benchmark="toy_pipeline",
        stage="run",
        track="a",
        outcome="success",
        turn=0,
        context=(
            {"role": "system", "content": "You run pipelines."},
            {"role": "user", "content": user},
        ),
        target=SFTAction(
            content=f"Running step {k}." + " Checking." * (k % 2),
            calls=(ToolCall(name="run", arguments={"cmd": f"step {k}"}),),
        ),
    )


@pytest.fixture(scope="module")
def examples(tiny):
    rendered, rejected = render_rows([hand_row(k) for k in range(10)], tiny.tokenizer, 512)
    assert not rejected
    return [enc for _, enc in rendered]


def config(tiny, tmp_path, **kw) -> SFTConfig:
    base = dict(
        model=str(tiny.path),
        output_dir=str(tmp_path / "run"),
        lr=3e-3,
        micro_batch_size=2,
        grad_accum_steps=2,
        max_steps=4,
        warmup_steps=1,
        eval_every=0,
        save_every=0,
        log_every=1,
        device="cpu",
    )
    return SFTConfig(**(base | kw))


def params(path) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- pure parts


def test_config_checks_and_plain_fields():
    cfg = SFTConfig(model="m", micro_batch_size=4, grad_accum_steps=8)
    assert cfg.global_batch_size == 32 and cfg.lr == 2e-5 and cfg.bf16 == "auto"
    for bad, match in (
        ({"micro_batch_size": 0}, "micro_batch_size must be > 0"),
        ({"warmup_steps": 300}, "warmup_steps"),
        ({"adam_beta2": 1.0}, "betas"),
        ({"lr_schedule": "step"}, "lr_schedule"),
        ({"bf16": "yes"}, "bf16"),
        ({"save_every": -1}, "save_every"),
    ):
        with pytest.raises(ValueError, match=match):
            SFTConfig(model="m", **bad)


def test_lr_schedule_and_bf16_choice():
    f = lr_factor
    assert [f(s, warmup_steps=2, max_steps=10, schedule="cosine") for s in (0, 1)] == [0.5, 1.0]
    assert f(2, warmup_steps=2, max_steps=10, schedule="cosine") == 1.0
    assert f(6, warmup_steps=2, max_steps=10, schedule="cosine") == pytest.approx(0.5)
    assert f(6, warmup_steps=2, max_steps=10, schedule="linear") == pytest.approx(0.5)
    assert f(9, warmup_steps=0, max_steps=10, schedule="constant") == 1.0
    cpu = torch.device("cpu")
    assert resolve_bf16("auto", cpu) is False  # CPU stays fp32 unless asked
    assert resolve_bf16("on", cpu) is True and resolve_bf16("off", cpu) is False


def test_masked_nll_matches_hand_computation():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, IGNORE_INDEX, 4], [IGNORE_INDEX, IGNORE_INDEX, 0]])
    nll, n = masked_nll(logits, targets)
    lp = torch.log_softmax(logits, -1)
    assert int(n) == 3
    assert float(nll) == pytest.approx(-float(lp[0, 0, 1] + lp[0, 2, 4] + lp[1, 2, 0]), rel=1e-6)


def test_collate_right_pads_and_masks(examples):
    batch = collate(examples[:3], pad_id=7)
    lengths = [len(e["input_ids"]) for e in examples[:3]]
    assert batch["input_ids"].shape == (3, max(lengths))
    for i, n in enumerate(lengths):
        assert batch["input_ids"][i, :n].tolist() == examples[i]["input_ids"]
        assert set(batch["input_ids"][i, n:].tolist()) <= {7}
        assert set(batch["labels"][i, n:].tolist()) <= {IGNORE_INDEX}
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (max(lengths) - n)


def test_only_target_tokens_count_and_padding_does_not_bias(tiny, examples):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.path, dtype=torch.float32).eval()
    batch = collate(examples[:3], tiny.tokenizer.pad_token_id)
    with torch.no_grad():
        nll, n = target_nll(model, batch)
        # by hand: full logits, shift by one, keep positions whose label is a target
        lp = torch.log_softmax(model(**batch).logits.float(), -1)
        want, count = 0.0, 0
        for b, e in enumerate(examples[:3]):
            for t in range(1, len(e["labels"])):
                if e["labels"][t] != IGNORE_INDEX:
                    want -= float(lp[b, t - 1, e["labels"][t]])
                    count += 1
        assert int(n) == count and float(nll) == pytest.approx(want, rel=1e-5)
        # each row alone (no padding) sums to the same
        alone = sum(float(target_nll(model, collate([e], 0))[0]) for e in examples[:3])
        assert alone == pytest.approx(float(nll), rel=1e-5)
        # the labels alone decide: ignoring one target token removes exactly its NLL
        labels = list(examples[0]["labels"])
        t = next(i for i, x in enumerate(labels) if x != IGNORE_INDEX)
        labels[t] = IGNORE_INDEX
        fewer = [dict(examples[0], labels=labels), *examples[1:3]]
        nll2, n2 = target_nll(model, collate(fewer, 0))
        assert int(n2) == count - 1
        assert float(nll2) == pytest.approx(
            want + float(lp[0, t - 1, examples[0]["labels"][t]]), rel=1e-5
        )


def test_load_sft_jsonl_reads_the_export(tiny, toy, toy_bank, tmp_path):
    manifest = export_sft(toy_bank, toy, tiny.tokenizer, tmp_path, 4096, rows=tiny.rows)
    train_rows = load_sft_jsonl(tmp_path / "train.jsonl")
    assert len(train_rows) == manifest["splits"]["train"]["rows"]
    assert sum(len(e["input_ids"]) for e in train_rows) == manifest["splits"]["train"]["tokens"]
    assert (
        sum(sum(lab != IGNORE_INDEX for lab in e["labels"]) for e in train_rows)
        == manifest["splits"]["train"]["target_tokens"]
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input_ids": [1, 2], "labels": [1, 5]}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_sft_jsonl(bad)


# --------------------------------------------------------------------------- training


def test_train_on_the_export_one_step(tiny, toy, toy_bank, tmp_path):
    manifest = export_sft(toy_bank, toy, tiny.tokenizer, tmp_path / "data", 8192, rows=tiny.rows)
    assert manifest["splits"]["train"]["rows"] and manifest["splits"]["validation"]["rows"]
    cfg = config(
        tiny,
        tmp_path,
        data_dir=str(tmp_path / "data"),
        max_steps=1,
        micro_batch_size=1,
        grad_accum_steps=1,
    )
    summary = train(cfg)
    assert summary["step"] == 1 and len(summary["train_loss"]) == 1
    assert list(summary["eval_loss"]) == [1]  # validation.jsonl is read and scored at the end
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_training_refuses_rows_rendered_with_other_chat_template_kwargs(
    tiny, toy, toy_bank, tmp_path
):
    data = tmp_path / "data"
    export_sft(toy_bank, toy, tiny.tokenizer, data, 8192, rows=tiny.rows[:4])
    wanted = {"enable_thinking": False}
    with pytest.raises(ConfigError, match="rendered with chat_template_kwargs=\\{\\}"):
        train(config(tiny, tmp_path, data_dir=str(data), chat_template_kwargs=wanted))
    (data / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="no manifest.json"):
        train(config(tiny, tmp_path, data_dir=str(data), chat_template_kwargs=wanted))


def test_loss_decreases_when_overfitting(tiny, examples, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = config(tiny, tmp_path, max_steps=20, lr_schedule="constant", eval_every=10)
    summary = train(cfg, train_rows=examples[:4], validation_rows=examples[:4])
    losses = summary["train_loss"]
    assert len(losses) == 20 and losses[-1] < 0.5 * losses[0]
    assert sorted(summary["eval_loss"]) == [10, 20]
    assert summary["eval_loss"][20] < summary["eval_loss"][10] < losses[0]
    assert summary["bf16"] is False and summary["device"] == "cpu"
    model = AutoModelForCausalLM.from_pretrained(summary["final_dir"])
    assert model.config.num_hidden_layers == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == list(range(1, 21))


def test_checkpoint_rotation_keeps_the_last_k(tiny, examples, tmp_path):
    cfg = config(tiny, tmp_path, max_steps=5, save_every=1, keep_last=2)
    train(cfg, train_rows=examples)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000004", "step-00000005"]
    latest = latest_checkpoint(tmp_path / "run")
    assert latest == root / "step-00000005"
    assert {"trainer_state.pt", "config.json", "tokenizer.json"} <= {
        p.name for p in latest.iterdir()
    }
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["step"] == 5 and state["samples_seen"] == 5 * cfg.global_batch_size
    assert (state["epoch"], state["offset"]) == divmod(20, len(examples))


def test_resume_continues_exactly(tiny, examples, tmp_path):
    kw = dict(max_steps=6, eval_every=3, save_every=2)
    straight = train(
        config(tiny, tmp_path / "a", **kw), train_rows=examples, validation_rows=examples[:2]
    )
    cfg = config(tiny, tmp_path / "b", **kw)
    first = train(cfg, train_rows=examples, validation_rows=examples[:2], stop_at=3)
    assert first["stopped_early"] and first["final_dir"] is None and first["step"] == 3
    assert latest_checkpoint(cfg.output_dir).name == "step-00000003"
    second = train(cfg, train_rows=examples, validation_rows=examples[:2])
    assert second["resumed_from"] == 3 and second["step"] == 6
    assert second["train_loss"] == straight["train_loss"]
    assert second["eval_loss"] == straight["eval_loss"]
    a, b = params(straight["final_dir"]), params(second["final_dir"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == list(range(1, 7))


def test_resume_refuses_changed_math_or_data(tiny, examples, tmp_path):
    cfg = config(tiny, tmp_path, max_steps=4)
    train(cfg, train_rows=examples, stop_at=1)
    with pytest.raises(ValueError, match="lr: checkpoint 0.003 vs now 0.001"):
        train(config(tiny, tmp_path, max_steps=4, lr=1e-3), train_rows=examples)
    with pytest.raises(ValueError, match="training rows differ"):
        train(cfg, train_rows=examples[:-1])
    with pytest.raises(ValueError, match="resume=True"):
        train(config(tiny, tmp_path, max_steps=4, resume=False), train_rows=examples)


def test_gradient_accumulation_is_invariant(tiny, examples, tmp_path):
    # Same global batch of 4 rows (with padding when 4 share a micro-batch): the loss
    # is a token-weighted mean over the global batch either way.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.path, dtype=torch.float32)
    rows = examples[2:6]
    n = sum(int((torch.tensor(e["labels"][1:]) != IGNORE_INDEX).sum()) for e in rows)
    grads = []
    for size in (4, 1):
        model.zero_grad()
        for i in range(0, 4, size):
            (target_nll(model, collate(rows[i : i + size], 0))[0] / n).backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    assert all(torch.allclose(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-4) for k in grads[0])

    kw = dict(max_steps=3, lr_schedule="constant", warmup_steps=0)
    big = train(
        config(tiny, tmp_path / "a", micro_batch_size=4, grad_accum_steps=1, **kw),
        train_rows=examples,
    )
    small = train(
        config(tiny, tmp_path / "b", micro_batch_size=1, grad_accum_steps=4, **kw),
        train_rows=examples,
    )
    assert big["train_loss"] == pytest.approx(small["train_loss"], rel=1e-5)
    a, b = params(big["final_dir"]), params(small["final_dir"])
    # Adam divides by sqrt(v), which magnifies last-bit gradient noise on near-zero
    # entries; compare the updates as a whole: they agree to better than 0.1 %.
    init = params(tiny.path)
    for k in a:
        update = (a[k] - init[k]).norm()
        assert (a[k] - b[k]).norm() <= 1e-3 * update + 1e-7, k


def test_activation_checkpointing_changes_memory_not_the_math(tiny, examples, tmp_path):
    # The layers are recomputed in the backward; the losses and the weights they lead
    # to are those of the run that kept every activation.
    kw = dict(max_steps=3, lr_schedule="constant", warmup_steps=0)
    plain = train(config(tiny, tmp_path / "a", **kw), train_rows=examples)
    ckpt = train(
        config(tiny, tmp_path / "b", gradient_checkpointing=True, **kw), train_rows=examples
    )
    assert ckpt["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-5)
    a, b = params(plain["final_dir"]), params(ckpt["final_dir"])
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_tiled_mlps_change_memory_not_the_math(tiny, examples, tmp_path):
    # Three tokens per MLP tile: every micro-batch is many tiles, formed and recomputed
    # one at a time; the losses and weights are the untiled run's.
    kw = dict(max_steps=3, lr_schedule="constant", warmup_steps=0)
    plain = train(config(tiny, tmp_path / "a", mlp_chunk_size=None, **kw), train_rows=examples)
    tiled = train(config(tiny, tmp_path / "b", mlp_chunk_size=3, **kw), train_rows=examples)
    assert tiled["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-5)
    a, b = params(plain["final_dir"]), params(tiled["final_dir"])
    # Tiles sum the weight gradients in another order; AdamW divides each gradient by
    # its own scale, so float noise on a near-zero one moves a weight by a fraction of
    # lr (3e-3 here): at most 3e-5 measured, where a wrong gradient moves most by ~lr.
    assert all(torch.allclose(a[k], b[k], atol=1e-4, rtol=0) for k in a)


def test_bf16_autocast_when_asked_on_cpu(tiny, examples, tmp_path):
    summary = train(config(tiny, tmp_path, max_steps=2, bf16="on"), train_rows=examples)
    assert summary["bf16"] is True and all(0 < x < 20 for x in summary["train_loss"])
    # weights stay fp32 masters; autocast only changes the matmul precision
    assert all(v.dtype == torch.float32 for v in params(summary["final_dir"]).values())


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tiny, examples, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    # 30 steps with a checkpoint after each: the child is killed soon after its second
    # checkpoint, long before it could finish, at whatever point of a step it is in.
    kw = dict(max_steps=30, keep_last=2, data_dir=str(data))
    straight = train(config(tiny, tmp_path / "a", **kw))
    cfg = config(tiny, tmp_path / "b", save_every=1, **kw)
    script = (
        "import json\nfrom bat_gym.trainers.sft import SFTConfig, train\n"
        f"train(SFTConfig(**json.loads({json.dumps(json.dumps(vars(cfg)))})))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    ckpts = Path(cfg.output_dir) / "checkpoints"
    deadline = time.monotonic() + 120
    while not (ckpts / "step-00000002").exists():
        assert proc.poll() is None, "the training process ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = latest_checkpoint(cfg.output_dir)
    assert killed_at is not None and not (Path(cfg.output_dir) / "final").exists()
    resumed = train(cfg)
    assert resumed["resumed_from"] == int(killed_at.name.split("-")[1]) < 30
    assert resumed["train_loss"] == straight["train_loss"]
    a, b = params(straight["final_dir"]), params(resumed["final_dir"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]
