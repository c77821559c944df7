"""The reward rests on what the sandbox observed: teacher runs count, look-alikes do not."""

from __future__ import annotations

import json
import time

import pytest

from bat_gym.core.protocol import get_protocol
from bat_gym.env import StageEnv
from bat_gym.rubrics.verifier.reward import RubricReward

FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


def call(code: str, language: str = "bash") -> str:
    args = {"language": language, "code": code}
    return f"<tool_call>{json.dumps({'name': 'execute_code', 'arguments': args})}</tool_call>"


@pytest.fixture(scope="module")
def env(toy, toy_bank):
    e = RubricReward(StageEnv("S4", benchmark=toy, states=toy_bank))
    yield e
    e.close()


def item(verdict, name):
    return next(i for s in verdict.stages for i in s.items if i.id == name)


def test_the_teachers_inference_is_an_observed_run(env, toy):
    env.reset(seed=0)
    base = env.unwrapped
    task = toy.task_of_state(base.state)
    proto = get_protocol("hermes")
    info = {}
    for turn in [t for t in toy.teacher_turns(task) if t.stage == "S4"]:
        *_, info = env.step(proto.render(turn.content, list(turn.calls)))
    *_, info = env.step(FINISH)
    ran = item(info["verdict"], "inference_ran")
    assert ran.passed is True and "ran 'python pipeline/infer.py" in ran.detail, ran.detail
    (run_call,) = [c for c in base.record.calls if c.runs]
    assert "outputs/predictions.csv" in (run_call.writes or [])
    assert "pipeline/infer.py" in (run_call.reads or [])


def test_a_shadowed_interpreter_earns_no_run(env):
    env.reset(seed=0)
    fake = (
        "python() { :; }; python pipeline/infer.py outputs/predictions.csv; "
        "mkdir -p outputs && cut -d, -f1 data/cases.csv | sed 's/$/,0/' > outputs/predictions.csv"
    )
    env.step(call(fake))
    *_, info = env.step(FINISH)
    ran = item(info["verdict"], "inference_ran")
    assert ran.passed is False and "saw no run" in ran.detail, ran.detail


def test_a_change_made_between_calls_is_unattributed_and_voided(toy, toy_bank):
    # Without caps nothing kills what a call leaves running: the late write lands
    # while no call runs, and the verifier will not credit it.
    env = RubricReward(
        StageEnv("S4", benchmark=toy, states=toy_bank, sandbox_options={"caps": "none"})
    )
    try:
        env.reset(seed=0)
        env.step(
            call(
                "(sleep 0.5; mkdir -p outputs; echo id,label > outputs/late.csv) > /dev/null 2>&1 &"
            )
        )
        time.sleep(1.5)
        env.step(call("true"))
        *_, info = env.step(FINISH)
        record = env.unwrapped.record
        assert "outputs/late.csv" in record.unattributed
        assert all("outputs/late.csv" not in (c.writes or []) for c in record.calls)
        assert info["verdict"] is not None
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_record_holds_runs_reads_and_writes_on_both_backends(request, toy, toy_bank, backend):
    if backend == "docker":
        request.getfixturevalue("docker_client")
    env = StageEnv("S4", benchmark=toy, states=toy_bank, backend=backend)
    try:
        env.reset(seed=0)
        env.step(
            call("mkdir -p outputs && head -2 data/cases.csv > outputs/head.csv && rm -f TASK.md")
        )
        (c,) = env.record.calls
        assert [r.argv[0] for r in c.runs] == ["mkdir", "head", "rm"]
        assert all(r.exit_code == 0 for r in c.runs)
        assert c.reads == ["data/cases.csv"]
        assert c.writes == ["TASK.md", "outputs", "outputs/head.csv"]
    finally:
        env.close()
