"""The evaluation manifest: a checked record with the keys it has always had."""

import json

import pytest

from bat_gym.core.errors import BatGymError
from bat_gym.evaluation import EvalConfig, evaluate
from bat_gym.evaluation.manifest import EvalManifest, read_manifest
from bat_gym.policies import make_policy

CFG = EvalConfig(repeats=1, workers=2, progress=False)


def test_the_manifest_reads_back_checked_and_a_bad_one_is_named(toy, tmp_path):
    report = evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    path = tmp_path / "manifest.json"
    raw = json.loads(path.read_text())
    assert set(raw) == {"policy", "benchmark", "cells", "settings", "versions", "timing"}
    assert set(raw["timing"]) == {"started", "wall_s", "invocations", "episode_wall_s_total"}
    manifest = read_manifest(path)
    assert manifest.timing.wall_s == raw["timing"]["wall_s"] > 0
    assert [c.task_id for c in manifest.cells] == [c["task_id"] for c in raw["cells"]]
    assert report.manifest == raw  # the report carries what the file holds
    assert json.loads(manifest.to_json()) == raw

    raw["timing"]["wall_s"] = "long"
    path.write_text(json.dumps(raw))
    with pytest.raises(BatGymError, match=r"not an evaluation manifest: timing.wall_s"):
        read_manifest(path)
    # A rerun does not trust it: the run's time is counted from this invocation.
    evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    assert read_manifest(path).timing.invocations == 1


def test_a_missing_manifest_is_named(tmp_path):
    with pytest.raises(BatGymError, match="cannot read the evaluation manifest"):
        read_manifest(tmp_path / "manifest.json")
    with pytest.raises(Exception, match="extra"):
        EvalManifest.model_validate({"surprise": 1})
