"""The Orthanc service through the env: caps at the tool boundary and at snapshot, resets
after tools that ran in worker processes, a dead server, and a sandbox that cannot reach it."""

from __future__ import annotations

import json

import pytest

from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.service import ServiceLimits, ServiceStateTooLarge, capture_service
from bat_gym.env import StageEnv
from bat_gym.envs.radiology import Radiology
from bat_gym.envs.radiology.service import OrthancService

HERMES = get_protocol("hermes")


def say(name, **arguments):
    return HERMES.render("", [ToolCall(name=name, arguments=arguments)])


class Capped(Radiology):
    """The suite with a tight service: two records per series or study."""

    def make_service(self) -> OrthancService:  # noqa: D102
        return OrthancService(max_records=2)


@pytest.fixture(scope="module")
def state(tmp_path_factory, radiology):
    store = BlobStore(tmp_path_factory.mktemp("radiology-service") / "store")
    return store, initial_state(radiology, 4, "lesion_growth", store, "hermes")


@pytest.fixture
def env(orthanc, state):
    store, st = state
    e = StageEnv("E2E", benchmark=Capped(), states=MemoryStates(store, [st]))
    e.reset(options={"state_id": st.state_id})
    yield e
    e.close()


def _target(env):
    truth = env.benchmark.private_answers(env.benchmark.task_of_state(env.state))["patients"]
    return next(iter(truth.values()))


def _mark(env, series_uid, **extra):
    args = {"series_uid": series_uid, "index": 1, "row": 3, "col": 3, "diameter_mm": 5.0,
            "label": "x", **extra}  # fmt: skip
    return env.step(say("store_annotation", **args))


def test_records_past_the_cap_are_refused_before_they_are_written(env):
    series = _target(env)["series_uid"]
    for n in (1, 2):
        obs, *_ = _mark(env, series)
        assert json.loads(obs.split("\n", 1)[1]) == {"stored": True, "annotations_on_series": n}
    obs, _, terminated, truncated, info = _mark(env, series)
    assert obs.startswith("[store_annotation: error]\n")
    assert "OrthancService.max_records" in obs and "OrthancService(max_records=...)" in obs
    assert not (terminated or truncated) and info["record"].tool_uses[-1].status == "error"
    assert len(env.service.read_records("series", series)) == 2


def test_a_record_that_would_pass_the_byte_limit_is_refused(env):
    used = env.service.usage()
    env.service.limits = ServiceLimits(max_bytes=used[1] + 100)  # the record: ~130 bytes
    series = _target(env)["series_uid"]
    obs, *_ = _mark(env, series, label="a" * 64)
    assert "ServiceLimits.max_bytes" in obs and obs.startswith("[store_annotation: error")
    assert env.service.read_records("series", series) == []


def test_a_snapshot_past_the_limits_is_refused(env, state):
    store, _ = state
    env.service.limits = ServiceLimits(max_blobs=10)
    with pytest.raises(ServiceStateTooLarge, match=r"ServiceLimits\.max_blobs"):
        capture_service(env.service, store)


def test_reset_undoes_what_tools_stored_from_their_worker_processes(env):
    target = _target(env)
    _mark(env, target["series_uid"])
    finding = {"study_uid": target["study_uid"], "series_uid": target["series_uid"],
               "lesion_diameter_mm": 1.0, "change": "stable"}  # fmt: skip
    obs, *_ = env.step(say("submit_finding", **finding))
    assert obs.startswith("[submit_finding: ok")
    assert env.service.read_records("studies", target["study_uid"])
    env.reset(options={"state_id": env.state.state_id})
    assert env.service.read_records("series", target["series_uid"]) == []
    assert env.service.read_records("studies", target["study_uid"]) == []
    assert not any(n.startswith("meta/") for n in env.service.snapshot())


def test_a_dead_server_is_started_again_on_reset(env):
    server = env.service.server
    server._proc.kill()
    server._proc.wait()
    obs, _, terminated, truncated, _ = env.step(say("find_studies"))
    assert "internal error (OrthancError)" in obs and not (terminated or truncated)
    env.reset(options={"state_id": env.state.state_id})
    obs, *_ = env.step(say("find_studies"))
    assert obs.startswith("[find_studies: ok") and env.service.server is not server


def test_the_sandbox_cannot_reach_the_server(env):
    port = env.service.server.port
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    print('REACHED')\n"
        "except OSError as exc:\n"
        "    print('refused', type(exc).__name__)\n"
    )
    obs, *_ = env.step(say("execute_code", language="python", code=code))
    assert "refused" in obs and "REACHED" not in obs


def test_a_call_killed_between_its_note_and_its_write_still_resets_clean(env):
    """The journal says a record was about to change; the server never got it."""
    target = _target(env)
    env.service._note("series", target["series_uid"])  # as a worker killed right after
    env.service.after_tool_call()
    env.reset(options={"state_id": env.state.state_id})
    assert env.service.read_records("series", target["series_uid"]) == []
    _mark(env, target["series_uid"])
    journal = env.service._journal()
    journal.write_text("not json\n")  # a journal that cannot be read: every record is read
    env.service.after_tool_call()
    env.reset(options={"state_id": env.state.state_id})
    assert env.service.read_records("series", target["series_uid"]) == []
