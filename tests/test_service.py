"""Service state: snapshot and exact restore, content-addressed, through the env and the bank."""

from __future__ import annotations

import json
import time
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field
from tool_bench import ToolBench

from bat_gym.bank import build_bank
from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.benchmark import TeacherTurn
from bat_gym.core.errors import BatGymError, ConfigError, EnvNotCopyable
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.core.service import (
    ServiceBlobs,
    ServiceLimits,
    ServiceState,
    ServiceStateTooLarge,
    capture_service,
    load_service_snapshot,
    put_service_blobs,
    restore_service,
)
from bat_gym.core.tools import Tool, ToolContext, ToolError
from bat_gym.env import StageEnv


class KVService(ServiceState):
    """A tiny in-process key-value service that restores only the keys that differ."""

    IN_PROCESS = True  # its state is this object: handlers must run in this process

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.digests: dict[str, str] = {}
        self.loaded = 0
        self.closed = False

    def snapshot(self) -> dict[str, bytes]:
        return {f"kv/{k}": v for k, v in self.data.items()}

    def restore(self, blobs: ServiceBlobs) -> None:
        data, digests = {}, {}
        for name in blobs:
            key, digest = name.removeprefix("kv/"), blobs.digest(name)
            if self.digests.get(key) == digest:
                data[key] = self.data[key]
            else:
                data[key] = blobs[name]
                self.loaded += 1
            digests[key] = digest
        self.data, self.digests = data, digests

    def put(self, key: str, value: bytes) -> None:
        # The tool boundary: refuse a write that would take the state past its limits.
        after = {**self.data, key: value}
        self.limits.check(len(after), sum(len(v) for v in after.values()))
        self.data[key] = value
        self.digests.pop(key, None)  # no longer what any stored blob holds

    def close(self) -> None:
        self.closed = True


class KeyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: Annotated[str, Field(pattern=r"^[a-z_]{1,32}$")]


class PutArgs(KeyArgs):
    value: Annotated[str, Field(max_length=1000)]


def kv_get(args: KeyArgs, ctx: ToolContext) -> str:
    if args.key not in ctx.service.data:
        raise ToolError(f"no key {args.key}")
    return ctx.service.data[args.key].decode()


def kv_put(args: PutArgs, ctx: ToolContext) -> str:
    ctx.service.put(args.key, args.value.encode())
    return "stored"


class ServiceBench(ToolBench):
    """The tool benchmark with a key-value service; its teacher stores a note in S2."""

    spec = ToolBench.spec.model_copy(update={"name": "toy_service"})

    def make_service(self) -> KVService:  # noqa: D102
        return KVService()

    def service_blobs(self, task) -> dict[str, bytes]:  # noqa: D102
        return {"kv/cases": json.dumps(sorted(self._rows(task))).encode()}

    def tools(self) -> tuple[Tool, ...]:  # noqa: D102
        return (
            *super().tools(),
            Tool("kv_get", "Read a key.", KeyArgs, kv_get),
            Tool("kv_put", "Store a key.", PutArgs, kv_put),
        )

    def teacher_turns(self, task) -> list[TeacherTurn]:  # noqa: D102
        turns = super().teacher_turns(task)
        note = ToolCall(name="kv_put", arguments={"key": "pipeline", "value": "written"})
        i = next(i for i, t in enumerate(turns) if t.stage == "S2")
        turns[i] = TeacherTurn("S2", turns[i].content, (*turns[i].calls, note))
        return turns


def say(name, **arguments):
    return get_protocol("hermes").render("", [ToolCall(name=name, arguments=arguments)])


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "store")


def test_a_state_round_trips_exactly_and_is_content_addressed(store):
    a = put_service_blobs(store, {"kv/x": b"1", "kv/y": b"2"})
    b = put_service_blobs(store, {"kv/y": b"2", "kv/x": b"1"})
    assert a == b and a != put_service_blobs(store, {"kv/x": b"1"})
    service = KVService()
    service.put("stale", b"old")
    restore_service(service, store, a)
    assert service.snapshot() == {"kv/x": b"1", "kv/y": b"2"}
    assert capture_service(service, store) == a
    restore_service(service, store, None)
    assert service.snapshot() == {}


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "a//b", "./a", "a\x00b"])
def test_blob_names_are_clean_relative_paths(store, name):
    with pytest.raises(ConfigError, match="service blob name"):
        put_service_blobs(store, {name: b""})


def test_restore_loads_only_what_differs(store):
    base = {f"kv/k{i}": str(i).encode() for i in range(50)}
    a = put_service_blobs(store, base)
    b = put_service_blobs(store, {**base, "kv/k7": b"changed"})
    service = KVService()
    restore_service(service, store, a)
    assert service.loaded == 50
    restore_service(service, store, b)
    restore_service(service, store, a)
    assert service.loaded == 52


@pytest.fixture
def bench():
    return ServiceBench()


def test_reset_restores_the_service_a_call_changed(bench, store):
    states = MemoryStates(store, [initial_state(bench, 2, "lookup", store, "hermes")])
    (state_id,) = states.select()
    assert states.get(state_id).service is not None
    env = StageEnv("E2E", benchmark=bench, states=states)
    try:
        env.reset(options={"state_id": state_id})
        obs, *_ = env.step(say("kv_get", key="cases"))
        assert '["case' in obs
        env.step(say("kv_put", key="cases", value="overwritten"))
        env.step(say("kv_put", key="extra", value="x"))
        with pytest.raises(EnvNotCopyable):
            env.__getstate__()
        env.reset(options={"state_id": state_id})
        assert set(env.service.data) == {"cases"}
        obs, *_ = env.step(say("kv_get", key="cases"))
        assert '["case' in obs
        service = env.service
    finally:
        env.close()
    assert service.closed and env.service is None


def test_a_bank_captures_the_service_at_every_boundary(bench, tmp_path):
    bank = build_bank(bench, tmp_path / "bank", tasks_per_track=1, tracks=["lookup"])
    by_focus = {bank.get(i).focus: bank.get(i) for i in bank.select()}
    assert set(by_focus) >= {"E2E", "S1", "S2", "S3", "S4", "S5"}
    services = {}
    for focus, state in by_focus.items():
        service = KVService()
        restore_service(service, bank.store, state.service)
        services[focus] = service.data
    # The teacher stores the note during S2: states before it lack it, later ones hold it.
    assert "pipeline" not in services["S2"] and "pipeline" not in services["E2E"]
    assert services["S3"]["pipeline"] == b"written" == services["S5"]["pipeline"]
    assert by_focus["S1"].service == by_focus["E2E"].service
    env = StageEnv("Validate", benchmark=bench, states=bank)
    try:
        env.reset(options={"state_id": by_focus["S3"].state_id})
        obs, *_ = env.step(say("kv_get", key="pipeline"))
        assert obs.endswith("\nwritten")
    finally:
        env.close()
    report = bank.verify(sample=0, bench=bench)
    assert not report.findings.get("rows"), report.findings
    manifest = json.loads(bank.store.read_blob(by_focus["S3"].service))
    bank.store.blob_path(manifest["blobs"]["kv/pipeline"]).unlink()
    report = bank.verify(sample=0, bench=bench)
    assert any("service blob kv/pipeline" in what for _, what in report.findings["rows"])


def test_reset_with_a_service_stays_fast(bench, store):
    """Reset p50 with the service state next to the same benchmark's workspace-only reset."""
    state = initial_state(bench, 2, "lookup", store, "hermes")
    bare = state.model_copy(update={"service": None})
    times = {}
    for label, st in (("workspace", bare), ("workspace+service", state)):
        env = StageEnv("E2E", benchmark=bench, states=MemoryStates(store, [st]))
        try:
            env.reset(options={"state_id": st.state_id})
            samples = []
            for _ in range(15):
                env.step(say("kv_put", key="extra", value="x"))
                t0 = time.perf_counter()
                env.reset(options={"state_id": st.state_id})
                samples.append(time.perf_counter() - t0)
            times[label] = sorted(samples)[len(samples) // 2]
        finally:
            env.close()
    print({k: f"{v * 1000:.2f} ms" for k, v in times.items()})
    assert times["workspace+service"] < times["workspace"] + 0.05


def _stored(store):
    return sorted(p for p in store.root.rglob("*") if p.is_file()) if store.root.exists() else []


def test_a_state_past_its_limits_is_refused_before_anything_is_stored(store):
    service = KVService()
    service.limits = ServiceLimits(max_blobs=3, max_bytes=100)
    service.data = {f"k{i}": b"x" for i in range(4)}
    before = _stored(store)
    with pytest.raises(ServiceStateTooLarge) as caught:
        capture_service(service, store)
    exc = caught.value
    assert isinstance(exc, BatGymError)
    assert (exc.limit, exc.value, exc.maximum) == ("ServiceLimits.max_blobs", 4, 3)
    assert "ServiceLimits(max_blobs=...)" in str(exc)
    service.data = {"k": b"x" * 101}
    with pytest.raises(ServiceStateTooLarge, match=r"101 bytes.*ServiceLimits\.max_bytes"):
        capture_service(service, store)
    assert _stored(store) == before
    service.data = {"a": b"x" * 50, "b": b"y" * 50}  # exactly at the limits: taken
    assert load_service_snapshot(store, capture_service(service, store)).blobs.keys() == {
        "kv/a",
        "kv/b",
    }


def test_the_default_limits_hold_and_a_benchmarks_own_start_is_not_capped(store):
    limits = ServiceLimits()
    assert (limits.max_blobs, limits.max_bytes) == (4096, 256 * 2**20)
    big = {f"kv/k{i}": b"x" for i in range(limits.max_blobs + 1)}
    put_service_blobs(store, big)  # the benchmark's own starting content
    with pytest.raises(ServiceStateTooLarge, match="max_blobs"):
        put_service_blobs(store, big, limits=limits)


def test_a_tool_write_past_the_limits_is_an_error_the_agent_sees(bench, store):
    states = MemoryStates(store, [initial_state(bench, 2, "lookup", store, "hermes")])
    (state_id,) = states.select()
    env = StageEnv("E2E", benchmark=bench, states=states)
    try:
        env.reset(options={"state_id": state_id})
        env.service.limits = ServiceLimits(max_blobs=2, max_bytes=2000)
        obs, *_ = env.step(say("kv_put", key="one", value="x" * 10))
        assert obs.endswith("\nstored")
        obs, _, terminated, truncated, info = env.step(say("kv_put", key="two", value="x"))
        assert obs.startswith("[kv_put: error]\n") and "ServiceLimits.max_blobs" in obs
        assert not (terminated or truncated) and info["record"].tool_uses[-1].status == "error"
        assert set(env.service.data) == {"cases", "one"}
    finally:
        env.close()
