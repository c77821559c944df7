"""MedBench-Lite 2.2: the version, and the difficulty tier every task records."""

import pytest

from bat_gym.envs.medbench_lite.tracks.base import difficulty


def test_the_suite_is_version_2_2(bench):
    assert bench.spec.version == "2.2"


@pytest.mark.parametrize("track", ["classification", "detection", "vqa"])
@pytest.mark.parametrize("split, seed", [("train", 0), ("train", 1), ("heldout", 1_000_001)])
def test_a_task_records_its_tier(bench, track, split, seed):
    task = bench.make_task(track, seed, split)
    assert task.params["difficulty"] == difficulty(seed)


@pytest.mark.parametrize("track", ["classification", "detection", "vqa"])
def test_the_hard_tiers_texture_is_fainter_than_the_easy_tiers(track):
    import importlib

    module = importlib.import_module(f"bat_gym.envs.medbench_lite.tracks.{track}")
    easy, hard = module._MODULATION["easy"], module._MODULATION["hard"]
    assert hard[1] <= easy[0]
