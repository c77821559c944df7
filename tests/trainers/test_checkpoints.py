"""The resume helper every trainer uses: a safe load, and the saved settings checked."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bat_gym.core.errors import BatGymError, ConfigError  # noqa: E402
from bat_gym.trainers.checkpoints import (  # noqa: E402
    check_resumable,
    load_resume_state,
    rng_state,
)

FREE = frozenset({"output_dir", "steps"})


def save(tmp_path: Path, state: object) -> Path:
    checkpoint = tmp_path / "step-00000001"
    checkpoint.mkdir()
    torch.save(state, checkpoint / "trainer_state.pt")
    return checkpoint


def test_a_checkpoint_of_the_same_settings_loads_with_its_tensors_and_rng(tmp_path):
    config = {"lr": 1e-3, "output_dir": "a", "steps": 2, "ids": ("s1", "s2")}
    state = {"config": config, "optimizer": {"m": torch.ones(3)}, "rng": rng_state()}
    checkpoint = save(tmp_path, state)
    now = {**config, "output_dir": "b", "steps": 4}  # free fields may change
    saved = load_resume_state(checkpoint, "trainer_state.pt", now, free=FREE, map_location="cpu")
    assert torch.equal(saved["optimizer"]["m"], torch.ones(3))
    assert saved["config"] == config


def test_a_changed_setting_is_refused_naming_both_values_and_the_fix(tmp_path):
    checkpoint = save(tmp_path, {"config": {"lr": 1e-3, "steps": 2}})
    with pytest.raises(ConfigError) as caught:
        load_resume_state(checkpoint, "trainer_state.pt", {"lr": 2e-3, "steps": 2}, free=FREE)
    message = str(caught.value)
    assert "lr: checkpoint 0.001 vs now 0.002" in message and "new output_dir" in message
    assert "steps" not in message


def test_a_field_new_since_the_checkpoint_counts_as_changed(tmp_path):
    with pytest.raises(ConfigError, match="kl_coef: checkpoint None vs now 0.1"):
        check_resumable({}, {"kl_coef": 0.1}, free=FREE, checkpoint=tmp_path)


class Payload:
    """Anything but plain data and tensors: a weights-only load must refuse to run it."""


def test_a_pickled_object_is_never_unpickled(tmp_path):
    checkpoint = save(tmp_path, {"config": {}, "payload": Payload()})
    with pytest.raises(BatGymError, match="does not load as plain data"):
        load_resume_state(checkpoint, "trainer_state.pt", {}, free=FREE)


def test_a_state_without_its_settings_is_refused(tmp_path):
    checkpoint = save(tmp_path, {"optimizer": {}})
    with pytest.raises(ConfigError, match="holds no saved configuration"):
        load_resume_state(checkpoint, "trainer_state.pt", {}, free=FREE)
    (checkpoint / "trainer_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="does not load"):
        load_resume_state(checkpoint, "trainer_state.pt", {}, free=FREE)
