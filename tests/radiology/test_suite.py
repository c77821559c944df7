"""The radiology suite against a live Orthanc: tools, teacher, naive baseline, bank states."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bat_gym.bank import build_bank
from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.core.protocol import ToolCall
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.env import StageEnv
from bat_gym.rubrics.contract.checks import run_check
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reward import RubricReward

from .conftest import HERMES, play


def say(name, **arguments):
    return HERMES.render("", [ToolCall(name=name, arguments=arguments)])


@pytest.fixture(scope="module")
def states(tmp_path_factory, radiology):
    store = BlobStore(tmp_path_factory.mktemp("radiology") / "store")
    return MemoryStates(
        store, [initial_state(radiology, seed, "lesion_growth", store, "hermes") for seed in (4, 5)]
    )


@pytest.fixture
def env(orthanc, radiology, states):
    e = RubricReward(StageEnv("E2E", benchmark=radiology, states=states))
    yield e
    e.close()


def test_the_tools_answer_from_the_server(env, states, radiology):
    state = states.get(states.select()[0])
    _, info = env.reset(options={"state_id": state.state_id})
    names = [t["function"]["name"] for t in info["tools"]]
    assert {"find_studies", "get_slice", "submit_finding"} <= set(names)
    obs, *_ = env.step(say("find_studies"))
    studies = json.loads(obs.split("\n", 1)[1])
    task = radiology.task_of_state(state)
    assert len(studies) == 2 * task.params["cases"]
    study = studies[-1]["study_uid"]
    obs, *_ = env.step(say("list_series", study_uid=study))
    series = json.loads(obs.split("\n", 1)[1])[0]["series_uid"]
    obs, *_ = env.step(say("series_metadata", series_uid=series))
    meta = json.loads(obs.split("\n", 1)[1])
    assert meta["slices"] > 1 and len(meta["pixel_spacing_mm"]) == 2
    obs, *_ = env.step(say("get_slice", series_uid=series, index=1, max_size=8))
    pixels = json.loads(obs.split("\n", 1)[1])["pixels"]
    assert len(pixels) <= 8 and all(0 <= v <= 255 for row in pixels for v in row)
    obs, *_ = env.step(say("measure_roi", series_uid=series, index=1, row=10, col=10, radius_px=3))
    assert '"area_mm2"' in obs
    obs, _, terminated, truncated, info = env.step(say("get_slice", series_uid=series, index=999))
    assert "[get_slice: error" in obs and "past it" in obs and not (terminated or truncated)
    obs, *_ = env.step(say("list_series", study_uid="1.2.3"))
    assert "no study 1.2.3" in obs
    obs, *_ = env.step(say("list_series", study_uid="not a uid"))
    assert obs.startswith("[tool call error] list_series: invalid arguments (study_uid:")


def test_the_teacher_earns_full_reward_and_the_naive_baseline_does_not(env, states, radiology):
    # The hard tier (odd seed: mislabelled MR) with a CT patient: both traps at once.
    for state_id in [i for i in states.select() if states.get(i).provenance["seed"] == 5]:
        state = states.get(state_id)
        task = radiology.task_of_state(state)
        env.reset(options={"state_id": state_id})
        reward, info = play(env, radiology.teacher_script(task))
        assert reward >= 0.95 and info["verdict"].task_score == 1.0
        finds = [u for u in info["record"].tool_uses if u.name == "submit_finding"]
        assert len(finds) == task.params["cases"] and all(u.status == "ok" for u in finds)
        # The server's own record holds the findings; the tool_called check rests on the calls.
        ws = FrozenWorkspace.__new__(FrozenWorkspace)
        ctx = CheckContext(
            workspace=ws,
            start=ws,
            record=info["record"],
            task=TaskOracle(lambda: {}, lambda w: None),
        )
        assert run_check(
            "tool_called", ctx, {"name": "submit_finding", "min_calls": task.params["cases"]}
        ).passed
        env.reset(options={"state_id": state_id})
        naive, info = play(env, radiology.naive_turns(task))
        assert naive <= 0.6 and info["verdict"].task_score < 0.7


@pytest.mark.slow
def test_a_validate_state_starts_with_the_server_as_setup_left_it(orthanc, radiology, tmp_path):
    bank = build_bank(radiology, tmp_path / "bank", tasks_per_track=1)
    s3 = bank.select(focus="S3")[0]  # one per track
    env = gym.make("bat/Validate-v0", benchmark=radiology, states=bank)
    try:
        _, info = env.reset(options={"state_id": s3})
        obs, *_ = env.unwrapped.step(say("find_studies"))
        assert obs.startswith("[find_studies: ok")
        assert bank.get(s3).service is not None
    finally:
        env.close()


_values = (
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats() | st.text(max_size=30)
)
_TOOLS = ["find_studies", "list_series", "series_metadata", "get_slice", "measure_roi",
          "store_annotation", "submit_finding"]  # fmt: skip
_KEYS = ["study_uid", "series_uid", "index", "row", "col", "radius_px", "window_center",
         "window_width", "max_size", "diameter_mm", "label", "lesion_diameter_mm", "change",
         "patient_id", "modality", "note"]  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(_TOOLS),
    arguments=st.dictionaries(st.sampled_from(_KEYS), _values | st.just("1.2.3"), max_size=6),
)
def test_hostile_arguments_to_the_dicom_tools_never_make_step_raise(env, states, name, arguments):
    base = env.unwrapped
    if base._done or base.tool_calls >= base.budgets.max_tool_calls - 1:
        env.reset(options={"state_id": states.select()[0]})
    try:
        text = say(name, **arguments)
    except (TypeError, ValueError):  # not JSON-writable: nothing to send
        return
    obs, reward, *_ = env.step(text)
    assert isinstance(obs, str) and "Traceback" not in obs


@pytest.mark.parametrize("seed", [2_000_000, 2_000_001])
def test_the_radiograph_track_on_held_out_cells(orthanc, radiology, tmp_path, seed):
    """Both tiers (odd: MONOCHROME1 current radiographs); magnification in every study."""
    store = BlobStore(tmp_path / "store")
    state = initial_state(radiology, seed, "nodule_dx", store, "hermes", "heldout")
    env = RubricReward(StageEnv("E2E", benchmark=radiology, states=MemoryStates(store, [state])))
    try:
        task = radiology.task_of_state(state)
        env.reset(options={"state_id": state.state_id})
        reward, info = play(env, radiology.teacher_script(task))
        assert reward >= 0.95 and info["verdict"].task_score == 1.0
        items = {i.id: i.passed for s in info["verdict"].stages for i in s.items}
        assert items["findings_agree"] and items["lesions_marked"]
        env.reset(options={"state_id": state.state_id})
        naive, info = play(env, radiology.naive_turns(task))
        assert naive <= 0.5 and info["verdict"].task_score == 0.0
        obs, *_ = env.reset(options={"state_id": state.state_id})
        obs, *_ = env.step(say("find_studies", modality="DX"))
        studies = json.loads(obs.split("\n", 1)[1])
        assert len(studies) == 2 * task.params["cases"]
        obs, *_ = env.step(say("list_series", study_uid=studies[-1]["study_uid"]))
        series = json.loads(obs.split("\n", 1)[1])[0]["series_uid"]
        obs, *_ = env.step(say("series_metadata", series_uid=series))
        meta = json.loads(obs.split("\n", 1)[1])
        assert meta["pixel_spacing_mm"] is None and meta["magnification_factor"] > 1
        assert meta["photometric_interpretation"] in ("MONOCHROME1", "MONOCHROME2")
        obs, *_ = env.step(say("measure_roi", series_uid=series, index=1, row=48, col=48,
                               radius_px=2))  # fmt: skip
        assert obs.startswith("[measure_roi: ok")
    finally:
        env.close()
