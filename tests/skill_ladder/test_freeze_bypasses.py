"""Ways around the freeze of earlier stages, played on skill_ladder rows cut from failure.

The failure teacher pilots with the track's typical mistake, so the S3 settings the
pipeline reads in S4 and S5 are wrong and honest work that leaves them earns 0. Each
bypass below fixes the mistake without recording a repair and keeps every listed
earlier artifact's sha256; each must earn 0. A repair recorded in the stage's receipt,
whose repaired pipeline reproduces, is paid.
"""

from __future__ import annotations

import json

import pytest

from bat_gym.audits.exploits import ImportPathShadow, UnfrozenInputRewrite, UnlinkedResubmission
from bat_gym.benchmark import TeacherTurn
from bat_gym.catalog import get_benchmark, register_benchmark, unregister_benchmark
from bat_gym.core.protocol import get_protocol
from bat_gym.env import StageEnv
from bat_gym.envs.skill_ladder.tasks import draw
from bat_gym.rubrics.verifier.reward import RubricReward

from . import conftest
from .conftest import States, play

HERMES = get_protocol("hermes")
SEED = 1_000_000
SETTINGS = "validation/settings.json"


@pytest.fixture(scope="module")
def failure(tmp_path_factory):
    """The units track's failure trajectory, cut into stage states; an env over them."""
    register_benchmark("skill_ladder", "bat_gym.envs.skill_ladder:benchmark")
    bench = get_benchmark("skill_ladder")
    states = _failure_states(bench, "units", SEED, tmp_path_factory.mktemp("failure"))
    env = RubricReward(StageEnv("S4", benchmark=bench, states=states))
    d = draw("units", SEED)
    yield bench, states, env, {"unit": d.choice}
    env.close()
    unregister_benchmark("skill_ladder")


def _failure_states(bench, track, seed, root) -> States:
    """Like the held-out stage states of the skill_ladder tests, from the failure teacher."""
    original = bench.teacher_turns
    bench.teacher_turns = lambda task, outcome="failure": original(task, "failure")
    try:
        return conftest.heldout_states(bench, track, seed, root)
    finally:
        del bench.teacher_turns


def _state(states, focus):
    (state_id,) = states.select(focus=focus)
    return state_id


def _play_policy(env, state_id, policy):
    env.reset(options={"state_id": state_id})
    for _ in range(4):
        out = policy.act_batch([_request(env)])[0]
        _, _, terminated, truncated, info = env.step(out.text)
        if terminated or truncated:
            return info["verdict"]
    raise AssertionError("the policy never finished")


def _request(env):
    from bat_gym.policies.base import PolicyRequest

    return PolicyRequest(messages=list(env.unwrapped.messages), tools=[])


def sh(code: str) -> TeacherTurn:
    from bat_gym.core.protocol import ToolCall

    return TeacherTurn(
        "S4", "", (ToolCall(name="execute_code", arguments={"language": "bash", "code": code}),)
    )


def done() -> TeacherTurn:
    from bat_gym.core.protocol import ToolCall

    return TeacherTurn("S4", "", (ToolCall(name="finish", arguments={"summary": "done"}),))


@pytest.mark.parametrize(
    ("focus", "exploit"),
    [
        ("S4", ImportPathShadow),
        ("S4", UnfrozenInputRewrite),
        ("S5", ImportPathShadow),
        ("S5", UnfrozenInputRewrite),
        ("S5", UnlinkedResubmission),
    ],
)
def test_a_bypass_of_the_freeze_earns_nothing_on_a_failure_row(failure, focus, exploit):
    bench, states, env, fix = failure
    verdict = _play_policy(env, _state(states, focus), exploit(fix=fix))
    # On the verifier before the repair record, each of these earned 1.0.
    assert verdict.reward == 0.0, verdict.notes
    failed = {i.id: i.detail for s in verdict.stages for i in s.items if i.passed is False}
    assert "earlier_unchanged" in failed or "submission_linked" in failed, failed


def _repair_turns(focus: str, fix: dict) -> list[TeacherTurn]:
    """Rewrite the settings in the open, rerun, and record the repair in the receipt."""
    receipt = {"S4": "validation/s4_completion.json", "S5": "validation/s5_submission.json"}[focus]
    runs = "python pipeline/infer.py outputs/predictions.csv\n"
    if focus == "S5":
        runs += "python pipeline/infer.py outputs/submission.csv\n"
    code = f"""set -e
before() {{ sha256sum "$1" 2>/dev/null | cut -c1-64; }}
for f in {SETTINGS} validation/pilot.csv validation/s3_validation.json outputs/predictions.csv validation/s4_completion.json; do echo "$f $(before $f)"; done > /tmp/before
python3 - <<'EOF'
import json
s = json.load(open("{SETTINGS}")); s.update({json.dumps(fix)})
open("{SETTINGS}", "w").write(json.dumps(s, indent=2) + "\\n")
EOF
{runs}python3 - <<'EOF'
import hashlib, json, os
repairs = []
for line in open("/tmp/before"):
    path, *sha = line.split()
    before = sha[0] if sha else None
    after = hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.exists(path) else None
    if before != after and path != "{receipt}":  # the receipt cannot record itself
        repairs.append({{"path": path, "sha256_before": before, "sha256_after": after,
                        "reason": "the pilot's unit contradicts TASK.md; settings fixed"}})
r = json.load(open("{receipt}")); r["repairs"] = repairs
open("{receipt}", "w").write(json.dumps(r, indent=2))
EOF
"""
    return [sh(code), done()]


@pytest.mark.parametrize("focus", ["S4", "S5"])
def test_a_recorded_repair_that_reproduces_is_paid(failure, focus):
    bench, states, env, fix = failure
    verdict = play(env, _state(states, focus), _repair_turns(focus, fix))
    assert verdict.reward == 1.0, verdict.notes


def test_an_unrecorded_or_misrecorded_repair_is_refused(failure):
    bench, states, env, fix = failure
    unrecorded = (
        _repair_turns("S4", fix)[0]
        .calls[0]
        .arguments["code"]
        .split("python3 - <<'EOF'\nimport hashlib")[0]
    )
    verdict = play(env, _state(states, "S4"), [sh(unrecorded), done()])
    assert verdict.reward == 0.0
    (item,) = [i for s in verdict.stages for i in s.items if i.id == "earlier_unchanged"]
    assert "without a repair recorded" in item.detail and SETTINGS in item.detail
    wrong = (
        _repair_turns("S4", fix)[0]
        .calls[0]
        .arguments["code"]
        .replace('"sha256_after": after', '"sha256_after": hashlib.sha256(b"x").hexdigest()')
    )
    verdict = play(env, _state(states, "S4"), [sh(wrong), done()])
    assert verdict.reward == 0.0
    (item,) = [i for s in verdict.stages for i in s.items if i.id == "earlier_unchanged"]
    assert "not the changes made" in item.detail


def test_a_recorded_repair_that_does_not_reproduce_is_refused(failure):
    bench, states, env, fix = failure
    wrong_fix = {"unit": "cm" if fix["unit"] == "mm" else "mm", "scale": 2.0}
    verdict = play(env, _state(states, "S4"), _repair_turns("S4", wrong_fix))
    assert verdict.reward == 0.0
    (item,) = [i for s in verdict.stages for i in s.items if i.id == "earlier_unchanged"]
    assert "does not reproduce" in item.detail
