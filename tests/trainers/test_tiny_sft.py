"""The tiny SFT set-up of the learnability checks: built once, reused on a rerun."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bat_gym.trainers.tiny_sft import (  # noqa: E402
    build_tiny_setup,
    state_rewards,
    tiny_sft_config,
    train_tiny_sft,
)


def test_the_setup_trains_and_a_rerun_reuses_every_part(tmp_path):
    setup = build_tiny_setup(tmp_path, "skill_ladder", tasks_per_track=1)
    assert (setup.init / "config.json").is_file()
    assert (setup.sft_data / "train.jsonl").is_file()
    cfg = tiny_sft_config(setup, tmp_path / "run", steps=2, keep_last=1)
    assert (cfg.lr, cfg.micro_batch_size, cfg.max_steps, cfg.keep_last) == (2e-3, 4, 2, 1)
    final = train_tiny_sft(setup, tmp_path / "run", steps=2)
    assert (final / "config.json").is_file()

    weights = (setup.init / "model.safetensors").stat().st_mtime_ns
    again = build_tiny_setup(tmp_path, "skill_ladder", tasks_per_track=1)
    assert (setup.init / "model.safetensors").stat().st_mtime_ns == weights
    assert train_tiny_sft(again, tmp_path / "run", steps=2) == final

    state_id = next(iter(setup.bank.select("E2E", "units")))
    budgets = setup.bench.spec.budgets.model_copy(update={"max_turns": 1})
    rewards = state_rewards(
        setup.bank, final, state_id, 2, seed=0, budgets=budgets, temperature=1.0,
        max_new_tokens=8,
    )  # fmt: skip
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
