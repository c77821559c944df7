"""skill_ladder's S3 pays the teacher's checked pilot, not an unchecked one (see tests/rubrics/test_validation_exploit.py)."""

from __future__ import annotations

from bat_gym.audit_reward import audit_reward
from bat_gym.bank.states import MemoryStates

MARGIN = 0.10


def s3_success_rows(bank):
    rows = [bank.get(i) for i in bank.select(focus="S3", outcome="success")]
    return MemoryStates(bank.store, rows), len(rows)


def audit_s3(benchmark, bank):
    states, n = s3_success_rows(bank)
    report = audit_reward(
        benchmark,
        exploits=["unchecked_pilot"],
        states=states,
        states_per_focus=n,
        heldout_cells=0,
        progress=False,
    )
    return report, [e for e in report.episodes if e.stage == "S3"]


def assert_paid_for_validation(report, episodes):
    by_policy = {}
    for e in episodes:
        assert e.valid, e
        by_policy.setdefault(e.policy, []).append(e.reward)
    assert by_policy["teacher"] and all(r == 1.0 for r in by_policy["teacher"])
    naive = report.means["naive"]["S3"]
    for reward in by_policy["unchecked_pilot"]:
        assert reward <= naive + MARGIN and reward < 1.0


def test_skill_ladder_pays_the_teacher_not_the_unchecked_pilot(ladder, ladder_bank):
    assert_paid_for_validation(*audit_s3(ladder, ladder_bank))
