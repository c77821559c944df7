"""A GRPO step with a tiny model on radiology states (live Orthanc per env)."""

from __future__ import annotations

import pytest
from corpus import project_text


@pytest.mark.slow
def test_a_grpo_step_runs_on_radiology(orthanc, radiology, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bat_gym.bank import build_bank
    from bat_gym.trainers.grpo import GRPOConfig, train
    from bat_gym.trainers.tiny_model import build_tiny_model

    bank = build_bank(radiology, tmp_path / "bank", tasks_per_track=1)
    # Room for the prompt: its DICOM tool schemas make it long in a tiny vocabulary.
    tiny = build_tiny_model(
        tmp_path / "m",
        project_text(),
        vocab_size=600,
        hidden_size=64,
        max_position_embeddings=32768,
    )
    cfg = GRPOConfig(
        model=str(tiny), output_dir=str(tmp_path / "out"), benchmark="radiology",
        bank=str(bank.root), state_ids=tuple(bank.select(focus="S3")[:1]), steps=1,
        groups_per_step=1, group_size=2, max_new_tokens=12, max_turns=2, num_envs=2, lr=1e-3,
        save_every=1, seed=0, overlong="keep",
    )  # fmt: skip
    seen: list[dict] = []
    summary = train(cfg, on_step=seen.append)
    assert summary["steps"] == 1 and seen[0]["scored_rollouts"] == 2
    assert seen[0]["response_tokens"] > 0
