import json

import pytest

from bat_gym.bank import StageBank
from bat_gym.core.errors import BankError, SpecError
from bat_gym.core.sandbox.snapshot import WorkspaceIndex


def files_of(bank, state):
    snap = bank.store.get_snapshot(state.snapshot)
    return {e.path for e in snap.entries if e.kind == "f"}


def test_every_focus_track_pair_is_built_from_training_seeds(toy, toy_bank):
    pairs = {(s.focus, s.track) for s in toy_bank}
    assert pairs == {(f, t.name) for f in toy.spec.focuses for t in toy.spec.tracks}
    assert len(toy_bank) == 6 * 2 * 2
    assert all(s.provenance["seed"] in toy.spec.splits.train for s in toy_bank)


def test_select_filters_by_focus_track_and_outcome(toy_bank):
    outcomes = {s.outcome for s in toy_bank}
    for outcome in outcomes:
        ids = toy_bank.select(focus="E2E", outcome=outcome)
        assert ids == sorted(ids) and ids
        assert all(
            toy_bank.get(i).outcome == outcome and toy_bank.get(i).focus == "E2E" for i in ids
        )
    assert toy_bank.select(outcome="no-such-outcome") == []


def test_a_stage_state_holds_earlier_artifacts_and_nothing_later(toy, toy_bank):
    stages = toy.spec.stages
    for state in toy_bank:
        if state.focus == "E2E":
            continue
        files = files_of(toy_bank, state)
        k = [s.id for s in stages].index(state.focus)
        for earlier in stages[:k]:
            assert set(earlier.artifacts) <= files, (state.state_id, earlier.id)
        for later in stages[k:]:
            assert not set(later.artifacts) & files, (state.state_id, later.id)


def test_stage_rows_carry_the_upstream_conversation(toy_bank):
    s3 = toy_bank.get(toy_bank.select(focus="S3")[0])
    roles = [m["role"] for m in s3.messages]
    assert roles[:2] == ["system", "user"] and roles.count("assistant") == 2  # S1 and S2 turns
    assert "## S3 Validate" in s3.messages[0]["content"]


def test_snapshots_restore_exactly(toy_bank, tmp_path):
    state = toy_bank.get(toy_bank.select(focus="S5")[0])
    snap = toy_bank.store.get_snapshot(state.snapshot)
    ws = tmp_path / "ws"
    ws.mkdir()
    WorkspaceIndex(ws).restore(snap, toy_bank.store)
    assert WorkspaceIndex(ws).scan().digest == state.snapshot


def test_edited_rows_and_broken_rows_are_refused(toy_bank, tmp_path):
    import shutil

    copy = tmp_path / "bank"
    shutil.copytree(toy_bank.root, copy)
    rows = (copy / "rows.jsonl").read_text().splitlines()
    row = json.loads(rows[0])
    row["track"] = "other"
    (copy / "rows.jsonl").write_text("\n".join([json.dumps(row), *rows[1:]]) + "\n")
    with pytest.raises(BankError, match="does not match the digest"):
        StageBank(copy)
    # A row that is internally broken is named by line and field, even with a fixed digest.
    import hashlib

    row["snapshot"] = "zz"
    data = ("\n".join([json.dumps(row), *rows[1:]]) + "\n").encode()
    (copy / "rows.jsonl").write_bytes(data)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["rows_sha256"] = hashlib.sha256(data).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecError, match=r"rows.jsonl:1"):
        StageBank(copy)


def test_a_manifest_missing_what_the_code_reads_is_refused_by_field(toy_bank, tmp_path):
    import shutil

    copy = tmp_path / "bank"
    shutil.copytree(toy_bank.root, copy)
    bank = StageBank(copy)
    assert (bank.info.benchmark, bank.info.rows) == ("toy_pipeline", len(bank))
    assert bank.info.model_dump(exclude_unset=True) == bank.manifest  # every key kept as written
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["benchmark"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BankError, match="not a bank manifest: benchmark: Field required"):
        StageBank(copy)


def test_a_directory_that_is_not_a_bank_is_named(tmp_path):
    with pytest.raises(BankError, match="not a Stage Bank"):
        StageBank(tmp_path)
    assert not (tmp_path / "store").exists()  # looking did not write anything


def test_history_keeps_whole_recent_turns_within_the_prompt_budget():
    from bat_gym.bank import fit_history

    turn = lambda i: [  # noqa: E731
        {"role": "assistant", "content": f"a{i}", "tool_calls": []},
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 100},
    ]
    history = [m for i in range(5) for m in turn(i)]
    assert fit_history(history, 10_000) == history
    kept = fit_history(history, 250)
    assert kept[0]["content"] == "[3 earlier turn(s) omitted; their files are in /workspace]"
    assert [m["content"] for m in kept[1:] if m["role"] == "assistant"] == ["a3", "a4"]
    assert all(
        m["role"] != "tool" or kept[i - 1]["role"] == "assistant" for i, m in enumerate(kept) if i
    )
