"""MedBench-Lite's S3 check figures: the teacher's stated check is what the verifier recomputes.

Each track's teacher pilot (:func:`~bat_gym.envs.medbench_lite.teacher.pilot_script`)
states one domain figure of its quality check in the S3 receipt; the verifier recomputes
it outside the sandbox (:mod:`bat_gym.envs.medbench_lite.pilot_checks`) and holds the
case to the ones where the track's planted mistake shows. The pilot runs in a plain
directory, as in ``test_pilots.py``, and S3's ``pilot_checked`` items score it with the
shipped contract's arguments: no sandbox, so each case stays fast.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bat_gym.core.record import ExecutionRecord
from bat_gym.core.sandbox import BlobStore
from bat_gym.envs.medbench_lite.teacher import pilot_script
from bat_gym.envs.medbench_lite.tracks import get_track
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, CheckResult, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

from .conftest import TRACKS

RECEIPT = "validation/s3_validation.json"
PILOT = "validation/pilot.csv"
# The tracks whose check this round made real: classification and report declared
# none (an unchecked pilot earned S3's top level), vqa stated the pilot's own answer.
NEW = ("classification", "report", "vqa")


@dataclass
class Piloted:
    """The teacher's S3 pilot of a training task, run in ``ws`` with the correct pipeline."""

    task: object
    ws: Path
    check: dict


def _pilot(bench, track: str, seed: int, ws: Path) -> Piloted:
    task = bench.make_task(track, seed, "train")
    recipe = get_track(track).recipe()
    bench.write_public_files(task, ws)
    (ws / "pipeline").mkdir(exist_ok=True)
    (ws / "pipeline" / "infer.py").write_text(recipe.pipeline)
    res = subprocess.run(
        [sys.executable, "-c", pilot_script(recipe)],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (track, seed, res.stdout[-1500:], res.stderr[-1500:])
    return Piloted(task, ws, json.loads((ws / RECEIPT).read_text())["check"])


@pytest.fixture(scope="module")
def piloted(bench) -> Iterator:
    """``(track, seed)`` -> the teacher's pilot of that training task, run once."""
    done: dict[tuple[str, int], Piloted] = {}
    root = Path(tempfile.mkdtemp(prefix="bat-gym-figures-"))

    def get(track: str, seed: int = 0) -> Piloted:
        if (track, seed) not in done:
            ws = root / f"{track}-{seed}"
            ws.mkdir()
            done[track, seed] = _pilot(bench, track, seed, ws)
        return done[track, seed]

    yield get
    shutil.rmtree(root, ignore_errors=True)


def _restate(ws: Path, check: dict) -> None:
    """Rewrite the receipt's stated check (the pilot and its sha256 stay)."""
    body = json.loads((ws / RECEIPT).read_text())
    body["check"] = check
    (ws / RECEIPT).write_text(json.dumps(body))


def frozen(ws: Path) -> FrozenWorkspace:
    """The directory ``ws`` as the verifier sees a workspace."""
    files = {str(p.relative_to(ws)): p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    return FrozenWorkspace.from_files(BlobStore(ws.parent / f".{ws.name}-store"), files)


def pilot_checked(bench, task, ws: Path, where: str) -> CheckResult:
    """S3's ``pilot_checked`` item (``where``: any or risky) on the directory ``ws``."""
    workspace = frozen(ws)
    oracle = TaskOracle(
        lambda: bench.private_answers(task),
        lambda w: None,
        lambda w, path: None,
        risky_cases=lambda: bench.risky_cases(task),
        pilot_figure=lambda w, path, case: bench.pilot_figure(task, w, path, case),
    )
    ctx = CheckContext(
        workspace=workspace,
        start=workspace,
        record=ExecutionRecord(start_digest=workspace.digest),
        task=oracle,
    )
    items = {i.id: i for i in bench.contract_library().for_focus("S3").items}
    item = items["pilot_check_risky" if where == "risky" else "pilot_check_confirmed"]
    return run_check(item.check, ctx, item.args)


@pytest.fixture
def copy_of(piloted, tmp_path):
    """A writable copy of a track's teacher pilot, to restate its check in."""

    def get(track: str, seed: int = 0) -> Piloted:
        p = piloted(track, seed)
        ws = tmp_path / track
        shutil.copytree(p.ws, ws)
        return Piloted(p.task, ws, dict(p.check))

    return get


@pytest.mark.parametrize("track", TRACKS)
def test_the_teachers_stated_check_is_confirmed_on_a_risky_case(bench, piloted, track):
    p = piloted(track)
    figure = bench.pilot_figure(p.task, frozen(p.ws), PILOT, p.check["case"])
    assert figure is not None, f"{track} declares no check figure"
    assert p.check["name"] == figure.name
    assert isinstance(figure.value, float | str) and figure.passed is True
    if isinstance(figure.value, float):
        assert abs(p.check["value"] - figure.value) <= figure.tolerance, (p.check, figure)
    risky = bench.risky_cases(p.task)  # None: the trap shows on every case
    assert risky is None or p.check["case"] in risky
    res = pilot_checked(bench, p.task, p.ws, "risky")
    assert res.passed is True, res.detail


@pytest.mark.parametrize("track", NEW)
def test_an_unchecked_pilot_earns_no_check_on_the_new_tracks(bench, copy_of, track):
    """A receipt that states no check fails both check items, it is not left unscored."""
    p = copy_of(track)
    body = json.loads((p.ws / RECEIPT).read_text())
    del body["check"]
    (p.ws / RECEIPT).write_text(json.dumps(body))
    for where in ("any", "risky"):
        res = pilot_checked(bench, p.task, p.ws, where)
        assert res.passed is False, (where, res.detail)
        assert "states no check" in res.detail


@pytest.mark.parametrize("track", NEW)
def test_a_wrong_stated_figure_is_refused(bench, copy_of, track):
    p = copy_of(track)
    figure = bench.pilot_figure(p.task, frozen(p.ws), PILOT, p.check["case"])
    off = figure.value + max(10 * figure.tolerance, 0.05 * abs(figure.value))
    for wrong in ({"value": off}, {"passed": False}, {"name": "answer"}):
        _restate(p.ws, {**p.check, **wrong})
        res = pilot_checked(bench, p.task, p.ws, "any")
        assert res.passed is False, (wrong, res.detail)


def test_vqa_the_pilots_own_answer_is_not_the_figure(bench, copy_of):
    """Copying the pilot's answer (or the worked one) states no check of the image."""
    p = copy_of("vqa")
    answer = (p.ws / PILOT).read_text().splitlines()[1].split(",")[1]
    for name in ("answer", "nodule_col_px"):
        _restate(p.ws, {**p.check, "name": name, "value": answer})
        res = pilot_checked(bench, p.task, p.ws, "any")
        assert res.passed is False, (name, res.detail)


def test_vqa_a_mirrored_answer_fails_its_check(bench, copy_of):
    """The pipeline's mistake (a side answer on a radiological image mirrored) does not pass."""
    p = copy_of("vqa")
    header, row = (p.ws / PILOT).read_text().splitlines()
    qid, answer = row.split(",")
    mirrored = {"left": "right", "right": "left"}[answer]
    (p.ws / PILOT).write_text(f"{header}\n{qid},{mirrored}\n")
    figure = bench.pilot_figure(p.task, frozen(p.ws), PILOT, qid)
    assert figure.passed is False
    _restate(p.ws, {**p.check, "passed": True})
    assert pilot_checked(bench, p.task, p.ws, "any").passed is False


@pytest.mark.parametrize("track", NEW)
def test_a_check_on_a_case_where_the_mistake_does_not_show_does_not_count(bench, copy_of, track):
    """Piloted on a case outside ``risky_cases``, a true check is confirmed but not risky."""
    p = copy_of(track)
    d = bench.draw(track, 0, "train")
    risky = bench.risky_cases(p.task)
    if track == "vqa":
        candidates = sorted(set(d.answers["worked"]) - risky)
    else:
        candidates = [c for c in d.case_ids if c not in risky]
    if not candidates:
        pytest.skip(f"{track} seed 0 has no case outside its risky ones")
    case = candidates[0]
    subprocess.run(
        [sys.executable, "pipeline/infer.py", PILOT, "validation/pilot", case],
        cwd=p.ws,
        check=True,
        capture_output=True,
        timeout=300,
    )
    figure = bench.pilot_figure(p.task, frozen(p.ws), PILOT, case)
    _restate(p.ws, {"case": case, "name": figure.name, "value": figure.value, "passed": True})
    res = pilot_checked(bench, p.task, p.ws, "risky")
    assert res.passed is False, res.detail
    if figure.value is not None:  # a report without a nodule has no size to measure
        _restate(
            p.ws,
            {"case": case, "name": figure.name, "value": figure.value, "passed": figure.passed},
        )
        assert pilot_checked(bench, p.task, p.ws, "any").passed is True
        res = pilot_checked(bench, p.task, p.ws, "risky")
        assert res.passed is False and "pitfall" in res.detail, res.detail
