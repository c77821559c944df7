"""Radiology's S3 pays for validation, and its contracts are the reference ones plus S5's server items.

The pilot's check (the S3 receipt's ``check``) is recomputed by the verifier: the
lesion's size on the current study as the model card reads it, on a patient whose
study a careless reading measures wrong. The tests that run the pipelines need numpy
and pydicom only; those that play episodes need Orthanc and skip without it.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bat_gym.benchmark import Tolerance
from bat_gym.core.record import ExecutionRecord
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.envs.radiology import agreement, sandbox_code, suite
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext
from bat_gym.rubrics.contract.model import ContractLibrary
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reference import task_oracle

# (track, task seed): both tiers of both tracks; odd seeds are the hard tier.
CELLS = [(t, s) for t in ("lesion_growth", "nodule_dx") for s in (0, 1)]
PILOT, RECEIPT = "validation/pilot.csv", "validation/s3_validation.json"


def _workspace(bench, task, tmp_path, pipeline: str) -> Path:
    """The task's files with ``pipeline`` as pipeline/infer.py and the teacher's S3 run there."""
    root = tmp_path / "ws"
    bench.write_public_files(task, root)
    (root / "pipeline").mkdir()
    (root / "pipeline" / "infer.py").write_text(pipeline)
    (s3,) = [
        c.arguments["code"]
        for turn in bench.teacher_turns(task)
        if turn.stage == "S3"
        for c in turn.calls
        if c.name == "execute_code"
    ]
    # The script runs `python pipeline/infer.py`: this interpreter, which has pydicom.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-c", s3], cwd=root, env=env, check=True, timeout=120)
    return root


def _frozen(root: Path, store: BlobStore) -> FrozenWorkspace:
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return FrozenWorkspace.from_files(store, files)


def _pilot_checked(bench, task, ws: FrozenWorkspace, where: str):
    ctx = CheckContext(
        workspace=ws,
        start=ws,
        record=ExecutionRecord(start_digest=ws.digest, calls=[]),
        task=task_oracle(bench, task),
    )
    return run_check("pilot_checked", ctx, {"path": PILOT, "receipt": RECEIPT, "where": where})


def _run(pipeline: str, root: Path) -> dict[str, dict[str, str]]:
    (root / "p.py").write_text(pipeline)
    subprocess.run([sys.executable, "p.py", "out.csv"], cwd=root, check=True, timeout=120)
    with open(root / "out.csv", newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize(("track", "seed"), CELLS)
def test_the_risky_patients_are_those_the_naive_pipeline_measures_wrong(track, seed, tmp_path):
    bench = suite.Radiology()
    task = bench.make_task(track, seed, "train")
    bench.write_public_files(task, tmp_path)
    truth = bench.private_answers(task)["patients"]
    naive = _run(sandbox_code.naive_pipeline(), tmp_path)
    wrong = {pid for pid, want in truth.items() if not agreement.row_agrees(naive[pid], want)}
    assert bench.risky_cases(task) == wrong
    if (track, seed) == ("lesion_growth", 0):
        # The easy tier's MR study is labelled right: a careless pipeline measures it right.
        assert wrong != set(truth)


@pytest.mark.parametrize(("track", "seed"), CELLS)
def test_the_teachers_check_is_confirmed_on_a_risky_patient(track, seed, tmp_path):
    bench = suite.Radiology()
    task = bench.make_task(track, seed, "train")
    root = _workspace(bench, task, tmp_path, sandbox_code.pipeline())
    check = json.loads((root / RECEIPT).read_text())["check"]
    assert check["case"] in bench.risky_cases(task) and check["passed"] is True
    assert check["name"] == ("area_mm2" if track == "nodule_dx" else "volume_mm3")
    ws = _frozen(root, BlobStore(tmp_path / "store"))
    verdict = _pilot_checked(bench, task, ws, "risky")
    assert verdict.passed, verdict.detail


def test_the_check_catches_the_naive_pipeline_and_a_made_up_figure_fails(tmp_path):
    # Hard tier: every trap of the track shows, so the pilot of the careless pipeline
    # is wrong on the patient the check picks, and the check says so.
    bench = suite.Radiology()
    task = bench.make_task("lesion_growth", 1, "train")
    root = _workspace(bench, task, tmp_path, sandbox_code.naive_pipeline())
    check = json.loads((root / RECEIPT).read_text())["check"]
    assert check["passed"] is False
    store = BlobStore(tmp_path / "store")
    ws = _frozen(root, store)
    assert _pilot_checked(bench, task, ws, "any").passed  # an honest "failed" is confirmed
    assert not _pilot_checked(bench, task, ws, "risky").passed  # but earns no upper level
    # A figure stated without reading the study (the pilot "passed", a round number) fails.
    receipt = json.loads((root / RECEIPT).read_text())
    receipt["check"] = {**check, "value": 1000.0, "passed": True}
    (root / RECEIPT).write_text(json.dumps(receipt))
    verdict = _pilot_checked(bench, task, _frozen(root, store), "any")
    assert not verdict.passed and "not what the task's check computes" in verdict.detail


def test_s1_to_s4_are_the_reference_contracts_and_s5_adds_the_server_items():
    bench = suite.Radiology()
    library, reference = bench.contract_library(), ContractLibrary.reference()
    for cid in ("s1_plan", "s2_setup", "s3_validate", "s4_infer"):
        assert library.by_id(cid).sha256 == reference.by_id(cid).sha256, cid
    mine, ref = library.by_id("s5_submit"), reference.by_id("s5_submit")
    assert mine.version.startswith(f"{ref.version}-radiology.")
    items = {i.id: i for i in mine.items}
    for item in ref.items:  # every reference item, as it is there
        assert items.pop(item.id) == item, item.id
    assert set(items) == {"findings_agree", "lesions_marked"}
    assert (mine.aggregation, mine.gates, mine.levels) == (ref.aggregation, ref.gates, ref.levels)
    e2e, ref_e2e = library.by_id("e2e"), reference.by_id("e2e")
    assert e2e.version.startswith(f"{ref_e2e.version}-radiology.")
    assert {c.contract: c.version for c in e2e.components} == {
        **{c.contract: c.version for c in ref_e2e.components},
        "s5_submit": mine.version,
    }
    assert e2e.model_dump(exclude={"version", "components", "description"}) == ref_e2e.model_dump(
        exclude={"version", "components", "description"}
    )


def test_diameters_agree_within_the_task_metrics_tolerance():
    bench = suite.Radiology()
    task = bench.make_task("lesion_growth", 0, "train")
    tolerance = Tolerance(atol=agreement.AGREEMENT_MM)
    assert bench.numeric_tolerance(task) == {"diameter_mm": tolerance, "prior_mm": tolerance}
    want = {"diameter_mm": 15.3, "prior_mm": 12.1, "change": "larger"}
    row = {"diameter_mm": "15.34", "prior_mm": "12.06", "change": "larger"}
    assert agreement.row_agrees(row, want)
    assert not agreement.row_agrees({**row, "diameter_mm": "15.4"}, want)


@pytest.mark.slow
def test_an_unchecked_pilot_earns_nothing_and_the_teacher_wins_every_row(orthanc, radiology):
    # Every S3-S5 row of the default bank (one per track): a pilot run and receipted
    # with no check, and a submission not linked to S4's predictions, earn at most the
    # naive baseline; the teacher earns everything, its check confirmed on a risky
    # patient, its earlier files unchanged, nothing to repair, its stages linked.
    from bat_gym.audits.reward import audit_reward

    report = audit_reward(
        radiology,
        exploits=["unchecked_pilot", "unlinked_resubmission"],
        states_per_focus=2,
        heldout_cells=0,
        progress=False,
    )
    for stage in ("S3", "S4", "S5"):
        naive = report.means["naive"][stage]
        for name in report.exploits:
            assert report.means[name][stage] <= naive + 0.10, (name, stage)
    assert report.means["unchecked_pilot"]["S3"] == 0.0
    teacher = [e for e in report.episodes if e.policy == "teacher"]
    assert len(teacher) == 10 and all(e.reward == 1.0 for e in teacher)
    for e in teacher:
        want = {
            "S3": {"S3.pilot_check_confirmed": True, "S3.pilot_check_risky": True},
            "S4": {"S4.earlier_unchanged": True, "S4.upstream_repaired": None},
            "S5": {
                "S5.earlier_unchanged": True,
                "S5.upstream_repaired": None,
                "S5.submission_linked": True,
            },
        }.get(e.stage, {})
        assert {k: e.items.get(k) for k in want} == want, (e.stage, e.where)
