"""Reference checks of what tools stored on the server, played against adversaries.

One teacher episode on a hard-tier task (a mislabelled MR study and a CT study) gives a
real execution record and frozen workspace; each adversary then changes what was
stored (the record's accepted calls) or the submission, and the checks must refuse it.
Full episodes check the same through the verifier: the teacher's findings pass, and a
look-alike that stores right-shaped, wrong-valued records loses the S5 items.
"""

from __future__ import annotations

import json
import math

import pytest

from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.core.protocol import ToolCall
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.env import StageEnv
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reward import RubricReward

from .conftest import HERMES, play


@pytest.fixture(scope="module")
def episode(orthanc, radiology, tmp_path_factory):
    """The teacher's episode on seed 5: its env, task, verdict, record and workspace."""
    import bat_gym.envs.radiology.checks  # noqa: F401 - registers the checks

    store = BlobStore(tmp_path_factory.mktemp("radiology-checks") / "store")
    state = initial_state(radiology, 5, "lesion_growth", store, "hermes")
    env = RubricReward(StageEnv("E2E", benchmark=radiology, states=MemoryStates(store, [state])))
    env.reset(options={"state_id": state.state_id})
    task = radiology.task_of_state(state)
    reward, info = play(env, radiology.teacher_script(task))
    sandbox = env.unwrapped.sandbox
    workspace = FrozenWorkspace(sandbox.freeze(), sandbox.frozen_store)
    yield {
        "env": env,
        "state": state,
        "task": task,
        "reward": reward,
        "info": info,
        "workspace": workspace,
        "truth": radiology.private_answers(task)["patients"],
    }
    env.close()


def _ctx(episode, uses=None, workspace=None, radiology=None):
    record = episode["info"]["record"]
    if uses is not None:
        record = record.model_copy(update={"tool_uses": uses})
    ws = workspace or episode["workspace"]
    answers = {"patients": episode["truth"]}
    return CheckContext(
        workspace=ws, start=ws, record=record, task=TaskOracle(lambda: answers, lambda w: None)
    )


def _uses(episode, name):
    return [u for u in episode["info"]["record"].tool_uses if u.name == name]


def _edit(use, **arguments):
    return use.model_copy(update={"arguments": {**use.arguments, **arguments}})


def _findings(episode, uses):
    return run_check("radiology_findings", _ctx(episode, uses), {})


def _marks(episode, uses):
    return run_check("radiology_annotations", _ctx(episode, uses), {})


def test_the_teacher_stores_right_records_and_earns_full_reward(episode):
    verdict = episode["info"]["verdict"]
    assert episode["reward"] >= 0.95 and verdict.task_score == 1.0
    items = {i.id: i for s in verdict.stages for i in s.items}
    for item in ("findings_agree", "lesions_marked"):
        assert items[item].passed is True and items[item].evidence_complete, items[item].detail
    kinds = {e.kind for e in items["findings_agree"].evidence}
    assert kinds == {"artifact", "execution"}


def test_findings_with_the_right_shape_and_wrong_values_fail(episode):
    finds = _uses(episode, "submit_finding")
    off = [_edit(finds[0], lesion_diameter_mm=finds[0].arguments["lesion_diameter_mm"] + 0.3)]
    result = _findings(episode, [*off, *finds[1:]])
    assert result.passed is False and "disagrees with the verifier's measurement" in result.detail
    flipped = {"larger": "stable", "stable": "larger", "smaller": "stable"}
    change = [_edit(finds[0], change=flipped[finds[0].arguments["change"]])]
    assert _findings(episode, [*change, *finds[1:]]).passed is False
    # The verdict never quotes the verifier's value.
    truth = episode["truth"][next(iter(episode["truth"]))]
    assert str(truth["diameter_mm"]) not in result.detail


def test_a_finding_on_the_series_the_description_names_fails(episode):
    """The mislabelled MR study: the series called T2 is the T1; the right number there fails."""
    finds = _uses(episode, "submit_finding")
    mr = next((pid, p) for pid, p in episode["truth"].items() if len(p["current_series"]) == 2)[1]
    wrong_series = next(s for s in mr["current_series"] if s != mr["series_uid"])
    uses = [
        _edit(u, series_uid=wrong_series) if u.arguments["study_uid"] == mr["study_uid"] else u
        for u in finds
    ]
    result = _findings(episode, uses)
    assert result.passed is False and "does not measure" in result.detail


def test_a_spray_of_findings_with_one_right_among_them_fails(episode):
    finds = _uses(episode, "submit_finding")
    decoy = _edit(finds[0], lesion_diameter_mm=1.0).model_copy(update={"index": 99})
    assert _findings(episode, [*finds, decoy]).passed is False
    # A right finding stored on another study (a prior one) is a wrong record too.
    task = episode["env"].unwrapped.benchmark._patients("lesion_growth", episode["task"].seed)
    prior_uid = task[0][1].studies[0].uid
    on_prior = _edit(finds[0], study_uid=prior_uid)
    result = _findings(episode, [*finds, on_prior])
    assert result.passed is False and "no patient's current study" in result.detail


def test_a_missing_patient_or_a_refused_call_does_not_count(episode):
    finds = _uses(episode, "submit_finding")
    result = _findings(episode, finds[1:])
    assert result.passed is False and result.detail.startswith("no finding for ")
    refused = finds[0].model_copy(update={"status": "error"})
    assert _findings(episode, [refused, *finds[1:]]).passed is False
    assert _findings(episode, []).passed is False


def test_right_findings_without_the_submission_behind_them_fail(episode, radiology):
    """Values typed in from elsewhere: the submission must state the same measurement."""
    env = episode["env"]
    env.reset(options={"state_id": episode["state"].state_id})
    finds = _uses(episode, "submit_finding")
    calls = [ToolCall(name="submit_finding", arguments=u.arguments) for u in finds]
    env.step(HERMES.render("", calls))
    _, _, _, _, info = env.step(
        HERMES.render("", [ToolCall(name="finish", arguments={"summary": "done"})])
    )
    sandbox = env.unwrapped.sandbox
    bare = FrozenWorkspace(sandbox.freeze(), sandbox.frozen_store)
    result = run_check(
        "radiology_findings",
        CheckContext(
            workspace=bare,
            start=bare,
            record=info["record"],
            task=TaskOracle(lambda: {"patients": episode["truth"]}, lambda w: None),
        ),
        {},
    )
    assert result.passed is False and "outputs/submission.csv is missing" in result.detail


def test_findings_copied_from_a_measure_roi_result_fail(episode):
    """An agent that reads a diameter off measure_roi's disc area instead of running the model."""
    env = episode["env"]
    env.reset(options={"state_id": episode["state"].state_id})
    copied = {}
    for pid, p in episode["truth"].items():
        k, r, c = p["lesion_voxels"][len(p["lesion_voxels"]) // 2]
        obs, *_ = env.step(
            HERMES.render(
                "",
                [
                    ToolCall(
                        name="measure_roi",
                        arguments={
                            "series_uid": p["series_uid"],
                            "index": k,
                            "row": r,
                            "col": c,
                            "radius_px": 3,
                        },
                    )  # fmt: skip
                ],
            )
        )
        area = json.loads(obs.split("\n", 1)[1])["area_mm2"]
        copied[pid] = round(2 * math.sqrt(area / math.pi), 1)
    finds = _uses(episode, "submit_finding")
    by_study = {p["study_uid"]: pid for pid, p in episode["truth"].items()}
    uses = [_edit(u, lesion_diameter_mm=copied[by_study[u.arguments["study_uid"]]]) for u in finds]
    assert any(abs(copied[pid] - p["diameter_mm"]) > 0.05 for pid, p in episode["truth"].items()), (
        "the adversary's copy happens to equal the model's number"
    )
    assert _findings(episode, uses).passed is False


def test_marks_off_the_lesion_on_the_wrong_series_or_with_the_wrong_size_fail(episode):
    marks = _uses(episode, "store_annotation")
    assert _marks(episode, marks).passed is True
    first = marks[0]
    voxels = {tuple(v) for p in episode["truth"].values() for v in p["lesion_voxels"]}
    for dr in (8, -8, 12, -12, 20):  # a point off the lesion on the same slice
        key = (
            first.arguments["index"],
            round(first.arguments["row"] + dr),
            round(first.arguments["col"]),
        )
        if key not in voxels:
            break
    off = _edit(first, row=first.arguments["row"] + dr)
    result = _marks(episode, [off, *marks[1:]])
    assert result.passed is False and "not on the lesion" in result.detail
    size = _edit(first, diameter_mm=first.arguments["diameter_mm"] + 1)
    assert _marks(episode, [size, *marks[1:]]).passed is False
    mr = next(p for p in episode["truth"].values() if len(p["current_series"]) == 2)
    wrong = next(s for s in mr["current_series"] if s != mr["series_uid"])
    mark_mr = next(m for m in marks if m.arguments["series_uid"] == mr["series_uid"])
    moved = _edit(mark_mr, series_uid=wrong)
    assert _marks(episode, [*marks, moved]).passed is False
    # A spray: the right mark plus marks all over the slice.
    spray = [_edit(first, row=float(r), col=float(c)) for r in range(0, 48, 8) for c in (0, 24)]
    assert _marks(episode, [*marks, *spray]).passed is False
    odd = _edit(first, row=math.nan)
    assert _marks(episode, [odd, *marks[1:]]).passed is False
    assert _marks(episode, marks[1:]).passed is False  # a patient left unmarked


def test_a_look_alike_episode_loses_the_server_items(episode, radiology):
    """The teacher's work with right-shaped, wrong-valued records stored on the server."""
    env = episode["env"]
    env.reset(options={"state_id": episode["state"].state_id})
    turns = radiology.teacher_script(episode["task"])
    bad = []
    for t in turns:
        calls = []
        for c in t.calls:
            args = dict(c.arguments)
            if c.name == "submit_finding":
                args["lesion_diameter_mm"] = round(args["lesion_diameter_mm"] + 0.4, 1)
            if c.name == "store_annotation":
                args["row"], args["col"] = 1.0, 1.0
            calls.append(ToolCall(name=c.name, arguments=args))
        bad.append(type(t)(t.stage, t.content, tuple(calls)))
    reward, info = play(env, bad)
    items = {i.id: i for s in info["verdict"].stages for i in s.items}
    assert items["findings_agree"].passed is False and items["lesions_marked"].passed is False
    assert reward < episode["reward"]
