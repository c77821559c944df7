"""E2E surrogates: reduced MedBench-Lite tasks and the bank rows built from them."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bat_gym.bank import SUCCESS_MIN_REWARD, StageBank, build_bank
from bat_gym.bank.replay import replay_teacher
from bat_gym.bank.states import initial_state
from bat_gym.catalog import get_benchmark
from bat_gym.cli import app
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.spec import E2E


@pytest.fixture(scope="module")
def med():
    """The MedBench-Lite benchmark."""
    return get_benchmark("medbench_lite")


@pytest.mark.parametrize("track", ["classification", "vqa", "synthesis"])
@pytest.mark.parametrize("k", [1, 2])
def test_reduced_task_has_exactly_k_cases_everywhere(med, track, k, tmp_path):
    full = med.make_task(track, 0, "train")
    task = med.reduce_task(full, max_cases=k)
    assert task is not None
    assert task.task_id != full.task_id
    assert task.tier == 1
    assert task.params["reduction"] == {"max_cases": k}
    assert task.params["cases"] == k
    full_ids = json.loads(_task_json(med, full, tmp_path / "full"))["submission"]["case_ids"]
    ids = json.loads(_task_json(med, task, tmp_path / "red"))["submission"]["case_ids"]
    assert ids == full_ids[:k]
    dropped = set(full_ids) - set(ids)
    # No public file, and no line of one, names a dropped case.
    for path in (tmp_path / "red" / "data").rglob("*"):
        if path.is_file():
            assert not any(d in path.name for d in dropped)
            if path.suffix in (".json", ".jsonl", ".csv"):
                assert not any(d in path.read_text() for d in dropped)
    # The private answers hold the kept cases' truth and nothing of the dropped ones.
    answers = med.private_answers(task)
    assert not any(d in repr(_keys(answers)) for d in dropped)
    assert all(i in repr(_keys(answers)) for i in ids)


def _task_json(med, task, dest: Path) -> str:
    dest.mkdir()
    med.write_public_files(task, dest)
    return (dest / "task.json").read_text()


def _keys(value):
    """Every dict key in a nested structure."""
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    return []


def test_reduce_task_default_is_none_and_bad_sizes_are_refused(med):
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    toy = ToyPipeline()
    track = toy.spec.tracks[0].name
    assert toy.reduce_task(toy.make_task(track, 0, "train"), max_cases=1) is None
    task = med.make_task("classification", 0, "train")
    with pytest.raises(ValueError):
        med.reduce_task(task, max_cases=0)
    with pytest.raises(ValueError):
        med.reduce_task(med.reduce_task(task, max_cases=1), max_cases=1)


@pytest.mark.parametrize("track", ["classification", "vqa"])
def test_teacher_episode_on_a_reduced_task_scores_as_a_success(med, track):
    reduction = {"max_cases": 1}
    with tempfile.TemporaryDirectory() as tmp:
        store = BlobStore(Path(tmp) / "store")
        start = initial_state(med, 0, track, store, "hermes", reduction=reduction)
        task = med.task_of(track, 0, "train", reduction)
        reason, reward = replay_teacher(
            med,
            task,
            "success",
            start,
            store,
            backend="local",
            protocol="hermes",
            on_boundary=lambda stage, env: None,
            score=True,
        )
    assert reason is None
    assert reward is not None and reward >= SUCCESS_MIN_REWARD


def test_bank_with_surrogates_holds_a_verified_surrogate_e2e_row(med, tmp_path):
    bank = build_bank(med, tmp_path / "b", tracks=["classification"], surrogates=1)
    rows = [s for s in bank if s.state_id.endswith(".surrogate")]
    assert len(rows) == 1
    row = rows[0]
    assert row.focus == E2E and row.outcome == "success"
    # The reduction grid: one case, and at most one validation pass (the teacher's one).
    assert row.provenance["reduction"] == {"max_cases": 1, "validation_passes": 1}
    assert row.provenance["pilot_runs"] == 1
    assert row.provenance["tier"] == 1
    full = med.make_task("classification", 0, "train")
    assert row.task_id == med.reduce_task(full, max_cases=1).task_id != full.task_id
    sur = bank.manifest["surrogates"]
    assert (sur["planned"], sur["kept"], sur["rejected"]) == (1, 1, {})
    assert bank.manifest["reduction_grid"] == [{"max_cases": 1, "validation_passes": 1}]
    # The normal rows are still all there, and the whole bank replays.
    assert len(bank) == 1 + len(med.spec.focuses)
    assert StageBank(bank.root).verify(bench=med).ok


def test_surrogates_of_a_benchmark_without_a_reduced_form_are_counted_as_rejected(tmp_path):
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    toy = ToyPipeline()
    track = toy.spec.tracks[0].name
    bank = build_bank(toy, tmp_path / "b", tracks=[track], surrogates=1)
    assert not any(s.state_id.endswith(".surrogate") for s in bank)
    assert bank.manifest["surrogates"]["rejected"] == {"no reduced form": 1}


def test_cli_builds_surrogates(tmp_path):
    out = tmp_path / "b"
    result = CliRunner().invoke(
        app,
        ["bank", "build", "--out", str(out), "--benchmark", "toy_pipeline", "--surrogates", "1"],
    )
    assert result.exit_code == 0, result.output
    assert "surrogates: 0 of" in result.output
    assert "surrogates" in json.loads((out / "manifest.json").read_text())
