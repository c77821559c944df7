"""Checks the suites' tests run on their bank rows, written once.

* :func:`audit_unchecked_pilot` and :func:`assert_paid_for_validation`: the unchecked
  pilot, played on every S3 success row, earns at most the naive baseline's S3 reward
  plus :data:`MARGIN`, and the teacher earns 1.0.
* :func:`repair_record`: the teacher played from a failure row repairs in the open; its
  stage receipt records every earlier file it changed, with the start and final sha256s.
* :func:`row_reward`: what a policy earns played from a bank row.
"""

from __future__ import annotations

import hashlib
import json

from bat_gym.audits.reward import audit_reward
from bat_gym.bank.states import MemoryStates
from bat_gym.core.spec import E2E
from bat_gym.env import StageEnv
from bat_gym.evaluation.harness import play_episode
from bat_gym.policies.scripted import ScriptedPolicy
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.reward import RubricReward

MARGIN = 0.10
"""How far above the naive baseline's S3 reward the unchecked pilot may earn."""

RECEIPTS = {
    "S3": "validation/s3_validation.json",
    "S4": "validation/s4_completion.json",
    "S5": "validation/s5_submission.json",
}
"""The receipt of each stage that may record a repair."""

LATER = {
    "S3": ("validation/", "outputs/"),
    "S4": ("outputs/", RECEIPTS["S4"], RECEIPTS["S5"]),
    "S5": ("outputs/submission.csv", RECEIPTS["S5"]),
}
"""Per stage: new files under these are the stage's (or a later stage's) work, not a repair."""


def audit_unchecked_pilot(benchmark, bank):
    """The reward audit of the unchecked pilot on every S3 success row: (report, S3 episodes)."""
    rows = [bank.get(i) for i in bank.select(focus="S3", outcome="success")]
    report = audit_reward(
        benchmark,
        exploits=["unchecked_pilot"],
        states=MemoryStates(bank.store, rows),
        states_per_focus=len(rows),
        heldout_cells=0,
        progress=False,
    )
    return report, [e for e in report.episodes if e.stage == "S3"]


def assert_paid_for_validation(report, episodes):
    """The teacher earns 1.0 on every row; the unchecked pilot at most naive + MARGIN."""
    by_policy = {}
    for e in episodes:
        assert e.valid, e
        by_policy.setdefault(e.policy, []).append(e.reward)
    assert by_policy["teacher"] and all(r == 1.0 for r in by_policy["teacher"])
    naive = report.means["naive"]["S3"]
    for reward in by_policy["unchecked_pilot"]:
        assert reward <= naive + MARGIN and reward < 1.0


def sha256(files, path):
    """The sha256 of ``files[path]``, None when there is no such file."""
    return hashlib.sha256(files[path]).hexdigest() if path in files else None


def play_teacher(bench, bank, state):
    """The teacher from ``state``: the start workspace, and the final one as path -> bytes."""
    env = RubricReward(StageEnv(E2E, benchmark=bench, states=bank))
    try:
        play_episode(env, ScriptedPolicy("teacher"), state, bench)
        sandbox = env.unwrapped.sandbox
        final = FrozenWorkspace(sandbox.freeze(), sandbox.frozen_store)
        files = {p: final.read_bytes(p) for p in final.paths()}
    finally:
        env.close()
    return FrozenWorkspace.load(bank.store, state.snapshot), files


def repair_record(start, final, receipt, own):
    """The paths ``receipt`` records as repaired, each checked against the workspaces.

    Every record names the start and final sha256 of its file and a one-line reason;
    the recorded paths are exactly the earlier files that changed and the new files
    that are not the stage's own work (paths starting with one of ``own``).
    """
    repairs = json.loads(final[receipt]).get("repairs")
    assert repairs, f"{receipt} records no repair"
    for r in repairs:
        assert r["sha256_before"] == start.sha256(r["path"]), r
        assert r["sha256_after"] == sha256(final, r["path"]), r
        assert r["reason"] and "\n" not in r["reason"], r
    recorded = {r["path"] for r in repairs}
    changed = {p for p in start.paths() if start.sha256(p) != sha256(final, p)}
    new = {p for p in final if not start.exists(p) and not p.startswith(own)}
    assert recorded == changed | new
    return recorded


def row_reward(bench, bank, state_id, policy) -> float:
    """The reward ``policy`` earns played from the bank row ``state_id`` to its end."""
    env = RubricReward(StageEnv(E2E, benchmark=bench, states=bank))
    try:
        info, _ = play_episode(env, policy, bank.get(state_id), bench)
        return info["verdict"].reward
    finally:
        env.close()
