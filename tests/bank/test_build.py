"""Building banks: outcomes, verifier agreement, resumable builds, and verify()."""

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from bat_gym.bank import StageBank, build_bank
from bat_gym.cli import app
from bat_gym.core.errors import BankError

runner = CliRunner()


def toy_with(turns_for):
    """A toy benchmark declaring success and failure, with a teacher of our own."""
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    class Toy(ToyPipeline):
        outcomes = ("success", "failure")

        def teacher_turns(self, task, outcome="success"):
            return turns_for(super().teacher_turns(task), outcome)

        def repair_turns(self, task, focus, outcome):
            return []  # its failure is the success pipeline relabelled: nothing to repair

    return Toy()


def test_rows_of_every_focus_track_and_outcome_carry_their_outcome(toy, tmp_path):
    outcomes = ("success", "recovery", "failure")
    assert toy.outcomes == outcomes
    bank = build_bank(toy, tmp_path / "b", tracks=["lookup"], outcomes=outcomes)
    m = bank.manifest
    # Every focus x outcome was a candidate; a row is admitted where a demonstration
    # wins it (every success row), and each refusal is counted by its reason.
    shares = m["admission"]["shares"]
    assert {(f, o) for f in shares for o in shares[f]} == {
        (f, o) for f in toy.spec.focuses for o in outcomes
    }
    assert all(shares[f]["success"] == {"admitted": 1, "rows": 1} for f in toy.spec.focuses)
    admitted = sum(c["admitted"] for f in shares.values() for c in f.values())
    assert admitted == len(bank) == m["admission"]["rows_admitted"]
    assert sum(m["rejected"].values()) == m["admission"]["rows_checked"] - len(bank)
    assert all(r.startswith("demonstration ") for r in m["rejected"])
    assert all(s.state_id.endswith(f".{s.focus}.{s.outcome}") for s in bank)
    assert m["outcomes"] == list(outcomes)


def test_an_outcome_the_benchmark_lacks_is_not_asked_for(tmp_path):
    bench = toy_with(lambda turns, outcome: turns)  # success and failure, no recovery
    bank = build_bank(bench, tmp_path / "b", outcomes=("success", "recovery"))
    assert {s.outcome for s in bank} == {"success"}
    assert bank.manifest["unsupported_outcomes"] == ["recovery"]
    with pytest.raises(ValueError, match="unknown outcome"):
        build_bank(bench, tmp_path / "c", outcomes=("sucess",))


def test_a_success_the_verifier_disagrees_with_is_rejected_and_counted(tmp_path):
    # Without the submit turn the episode cannot reach the success reward; labelled as a
    # failure the same trajectory is kept.
    bench = toy_with(lambda turns, outcome: [t for i, t in enumerate(turns) if i != 4])
    bank = build_bank(bench, tmp_path / "b", outcomes=("success", "failure"))
    assert {s.outcome for s in bank} == {"failure"}
    # The S5 rows' work is the submission, which no demonstration here makes.
    assert bank.select(focus="S5") == [] and len(bank.select(focus="S4")) == 2
    m = bank.manifest
    refused = sum(
        c["rows"] - c["admitted"] for f in m["admission"]["shares"].values() for c in f.values()
    )
    assert m["rejected"] == {
        "success below 0.95 of the reward of a correct run": 2,
        "demonstration below 0.9 of the attainable reward": refused,
    }
    assert m["trajectories"] == {"planned": 4, "kept": 2}


_KILLED_BUILD = """
import sys
from bat_gym.bank import build_bank
from bat_gym.catalog import get_benchmark
build_bank(get_benchmark("toy_pipeline"), sys.argv[1], tasks_per_track=2)
"""


def journal_keys(root):
    lines = (root / "rows.partial.jsonl").read_text().splitlines()
    return [json.loads(line)["key"] for line in lines[1:]]


def test_a_killed_build_resumes_without_duplicates_or_torn_rows(toy, toy_bank, tmp_path):
    # The kill lands in a build of toy_bank's size, so its rows are what it must resume to.
    root = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED_BUILD), str(root)])
    journal = root / "rows.partial.jsonl"
    try:
        deadline = time.monotonic() + 60
        while not (journal.exists() and journal.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "build ended early"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert not (root / "manifest.json").exists(), "the build finished before it was killed"
    done = journal_keys(root)
    planned = journal_keys(toy_bank.root)
    assert 1 <= len(done) < len(planned) == 4
    # A torn last line, as a kill in the middle of a write leaves it, is never admitted.
    torn = next(k for k in planned if k not in done)
    with journal.open("a") as fh:
        fh.write(f'{{"key": "{torn}", "rows": [{{"state_')
    bank = build_bank(toy, root, tasks_per_track=2)
    ids = [s.state_id for s in bank]
    assert len(ids) == len(set(ids)) == 2 * 2 * 6
    keys = journal_keys(root)
    assert keys[: len(done)] == done and len(keys) == len(set(keys)) == len(planned)
    # Same rows in the same order; tool output carries wall times, so compare workspaces.
    assert [(s.state_id, s.snapshot) for s in bank] == [(s.state_id, s.snapshot) for s in toy_bank]


def test_a_rerun_is_idempotent_and_another_build_is_refused(toy, tmp_path):
    root = tmp_path / "b"
    build_bank(toy, root)
    before = {p: (root / p).read_bytes() for p in ("rows.jsonl", "manifest.json")}
    build_bank(toy, root)
    assert before == {p: (root / p).read_bytes() for p in before}
    lines = (root / "rows.partial.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["header"]["protocol"] = "other"
    (root / "rows.partial.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(BankError, match="unfinished build of another kind"):
        build_bank(toy, root)


def test_a_bank_built_twice_from_the_same_seeds_is_the_same_bank(toy, tmp_path):
    # Its rows are SFT data and states to replay: a second build (another machine, another
    # load) must give the same bytes, tool results included.
    first, second = build_bank(toy, tmp_path / "a"), build_bank(toy, tmp_path / "b")
    assert first.manifest["rows_sha256"] == second.manifest["rows_sha256"]
    assert (first.root / "rows.jsonl").read_bytes() == (second.root / "rows.jsonl").read_bytes()


def test_verify_passes_a_sound_bank(toy_bank):
    report = toy_bank.verify()
    assert report.ok, report.table()
    assert report.checked["replay"] == len(toy_bank)
    assert toy_bank.verify(sample=3).checked["replay"] == 3


def test_verify_names_a_corrupted_blob_and_the_rows_using_it(toy_bank, tmp_path):
    copy = tmp_path / "bank"
    shutil.copytree(toy_bank.root, copy)
    bank = StageBank(copy)
    state = bank.get(bank.select(focus="S3")[0])
    entry = next(
        e for e in bank.store.get_snapshot(state.snapshot).entries if e.path == "plan/plan.md"
    )
    blob = bank.store.blob_path(entry.digest)
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes() + b"tampered")
    report = bank.verify()
    assert not report.ok
    assert [w for w, _ in report.findings["blobs"]] == [str(blob)]
    assert state.state_id in {w for w, _ in report.findings["rows"]}
    assert report.findings["replay"] == []  # replays run on a private store
    result = runner.invoke(app, ["bank", "verify", str(copy)])
    assert result.exit_code == 1
    assert str(blob) in result.output and state.state_id in result.output


def test_cli_builds_outcomes_and_verifies(tmp_path):
    out = tmp_path / "b"
    args = ["bank", "build", "--out", str(out), "--benchmark", "toy_pipeline"]
    result = runner.invoke(app, [*args, "--outcome", "success", "--outcome", "failure"])
    assert result.exit_code == 0, result.output
    assert "S4    failure 2/2 (100%), success 2/2 (100%)" in result.output
    assert runner.invoke(app, [*args, "--outcome", "nope"]).exit_code != 0
    result = runner.invoke(app, ["bank", "verify", str(out)])
    assert result.exit_code == 0 and "verify: OK" in result.output


def test_the_success_bar_is_relative_to_what_a_correct_run_earns(toy, monkeypatch):
    from bat_gym.bank import SUCCESS_MIN_REWARD
    from bat_gym.bank.tasks import success_threshold

    track = toy.spec.tracks[0].name
    task = toy.make_task(track, 0, "train")
    assert success_threshold(toy, task) == pytest.approx(SUCCESS_MIN_REWARD)
    # An imperfect provided model: a correct run's task score is 0.8, so its E2E reward
    # (task weight 0.5, full stage credit) is 0.9, and a success needs 0.95 of that.
    monkeypatch.setattr(type(toy), "task_score", lambda self, task, ws: 0.8)
    tw = toy.spec.task_weight
    assert success_threshold(toy, task) == pytest.approx(SUCCESS_MIN_REWARD * (tw * 0.8 + (1 - tw)))
