"""Admission gates: every row passes them, and each one stops its planted failure."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from unittest.mock import ANY

from bat_gym.bank import GATES, Admission, StageBank, build_bank
from bat_gym.core.protocol import ToolCall
from bat_gym.core.spec import Budgets, ContractRef
from bat_gym.envs.toy_pipeline.suite import ToyPipeline


def planted(**overrides):
    """A toy benchmark with some methods or its spec replaced; its teacher plays success only."""
    return type("Planted", (ToyPipeline,), {"outcomes": ("success",), **overrides})()


def row_of(bank, focus="S3"):
    return bank.get(bank.select(focus=focus)[0])


def test_a_clean_build_admits_every_row_and_records_its_provenance(toy, toy_bank):
    m = toy_bank.manifest
    admission = {k: v for k, v in m["admission"].items() if k != "shares"}
    assert admission == {
        "gates": list(GATES),
        "rows_checked": len(toy_bank),
        "rows_admitted": len(toy_bank),
        "demonstration_min_share": 0.9,
    }
    assert m["rejected"] == {}
    assert m["teacher"] == "scripted"
    assert m["generator"]["version"] == toy.spec.version
    assert m["seeds"]["tasks"] == {t.name: [0, 1] for t in toy.spec.tracks}
    assert m["contracts"] == {c.id: c.sha256 for c in toy.contract_library()}
    assert m["reduction_grid"] == []
    gates = Admission(toy, toy_bank.store)
    try:
        assert all(gates.check(row) is None for row in toy_bank)
    finally:
        gates.close()
    s3 = row_of(toy_bank)
    assert s3.provenance["upstream"] == {"turns": 2, "tool_calls": 2}


def test_sandbox_init_fails_on_a_corrupted_or_missing_snapshot(toy, toy_bank, tmp_path):
    copy = tmp_path / "bank"
    shutil.copytree(toy_bank.root, copy)
    bank = StageBank(copy)
    row = row_of(bank)
    entry = next(e for e in bank.store.get_snapshot(row.snapshot).entries if e.kind == "f")
    blob = bank.store.blob_path(entry.digest)
    blob.chmod(0o644)
    # Same size, other bytes: the restore checks the blob's sha256 and refuses it.
    blob.write_bytes(b"x" * entry.size)
    gates = Admission(toy, bank.store)
    try:
        gate, what = gates.check(row)
        assert gate == "sandbox init" and "corrupted" in what
        blob.write_bytes(b"short")
        assert gates.check(row) == ("sandbox init", ANY)
        missing = row.model_copy(update={"snapshot": "0" * 64})
        assert gates.check(missing)[0] == "sandbox init"
    finally:
        gates.close()


def test_rollout_limits_fail_on_a_long_history_and_an_oversized_prompt(toy, toy_bank, tmp_path):
    row = row_of(toy_bank)
    long = row.model_copy(
        update={"provenance": {**row.provenance, "upstream": {"turns": 99, "tool_calls": 1}}}
    )
    gates = Admission(toy, toy_bank.store)
    try:
        assert gates.check(long) == ("rollout limits", "history has 99 turns, the budget is 24")
    finally:
        gates.close()
    # A prompt budget smaller than any prompt: every row is refused, none is clipped.
    small = ToyPipeline.spec.model_copy(update={"budgets": Budgets(max_prompt_chars=300)})
    bank = build_bank(planted(spec=small), tmp_path / "b", tracks=["lookup"])
    assert len(bank) == 0
    assert bank.manifest["rejected"] == {"gate rollout limits": 6}
    assert bank.manifest["admission"]["rows_checked"] == 6
    assert bank.manifest["trajectories"] == {"planned": 1, "kept": 1}


def test_a_row_pinning_a_contract_the_library_does_not_hold_is_refused(toy, tmp_path):
    def contract_ref(self, focus):
        ref = ToyPipeline.contract_ref(self, focus)
        if focus == "S3":
            return ContractRef(id=ref.id, version=ref.version, sha256="0" * 64)
        return ref

    bank = build_bank(planted(contract_ref=contract_ref), tmp_path / "b")
    assert bank.manifest["rejected"] == {"gate contracts": 2}
    assert bank.select(focus="S3") == [] and len(bank) == 2 * 5


def test_leakage_fails_on_a_heldout_seed_and_on_heldout_content(toy, toy_bank, tmp_path):
    row = row_of(toy_bank)
    seed = toy.seeds("heldout")[0]
    heldout = row.model_copy(update={"provenance": {**row.provenance, "seed": seed}})
    gates = Admission(toy, toy_bank.store)
    try:
        assert gates.check(heldout)[0] == "leakage"
    finally:
        gates.close()
    # A teacher that writes out a held-out task's data it has seen (as a policy that
    # memorized it would): every row from the boundary after that turn is refused.
    held = toy.make_task("threshold", seed, "heldout")
    with tempfile.TemporaryDirectory() as tmp:
        toy.write_public_files(held, Path(tmp))
        leaked = (Path(tmp) / "data/cases.csv").read_bytes()

    def teacher_turns(self, task):
        turns = ToyPipeline.teacher_turns(self, task)
        if task.track != "threshold":
            return turns
        code = f"import os\nos.makedirs('notes')\nopen('notes/seen.csv', 'wb').write({leaked!r})\n"
        call = ToolCall(name="execute_code", arguments={"language": "python", "code": code})
        first = turns[0]
        return [first._replace(calls=(*first.calls, call)), *turns[1:]]

    bank = build_bank(planted(teacher_turns=teacher_turns), tmp_path / "b")
    # E2E and S1 start before the write; S2..S5 hold notes/seen.csv.
    assert bank.manifest["rejected"] == {"gate leakage": 4}
    assert sorted(s.focus for s in bank if s.track == "threshold") == ["E2E", "S1"]
    # The same bytes as the task's own file are shared by design, never a leak.
    assert len([s for s in toy_bank if s.track == "threshold"]) == 2 * 6


def test_a_surrogate_over_its_validation_passes_is_refused(tmp_path):
    from bat_gym.envs.skill_ladder import SkillLadder

    class TwoPilots(SkillLadder):
        def teacher_turns(self, task, outcome="success"):
            # A recovery pilots twice (the mistaken flag, then the right one) and still
            # succeeds: one pass more than a surrogate allows.
            return super().teacher_turns(task, "recovery")

    bench = TwoPilots()
    kw = {"tracks": ["units"], "tasks_per_track": 0, "surrogates": 1}
    bank = build_bank(bench, tmp_path / "a", **kw)
    sur = bank.manifest["surrogates"]
    assert (sur["planned"], sur["kept"], sur["rejected"]) == (1, 0, {"gate validation passes": 1})
    assert len(bank) == 0
    bank = build_bank(bench, tmp_path / "b", surrogate_validation_passes=2, **kw)
    (row,) = bank
    assert row.provenance["pilot_runs"] == 2
    assert row.provenance["reduction"] == {"max_cases": 1, "validation_passes": 2}
