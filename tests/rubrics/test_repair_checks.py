"""The repair record and linked stages, on hand-built workspaces (no reproduction)."""

from __future__ import annotations

import hashlib
import json

from bat_gym.rubrics.contract.checks import run_check

from .conftest import START

PRED = "id,label\ncase001,1\ncase002,0\n"
PIPE = "print('v1')\n"
S4_START = {**START, "pipeline/infer.py": PIPE, "outputs/predictions.csv": PRED}
RECEIPT = "validation/s5_submission.json"
FROZEN = {"paths": ["pipeline/", "outputs/predictions.csv"], "receipt": RECEIPT}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def receipt(*repairs: dict) -> str:
    return json.dumps({"stage": "S5", "repairs": list(repairs)})


def test_an_exact_record_of_a_change_is_accepted_and_a_missing_one_refused(make_ctx):
    fixed = "print('v2')\n"
    entry = {
        "path": "pipeline/infer.py",
        "sha256_before": sha(PIPE),
        "sha256_after": sha(fixed),
        "reason": "wrong unit",
    }
    ok = make_ctx({"pipeline/infer.py": fixed, RECEIPT: receipt(entry)}, start=S4_START)
    assert run_check("unchanged_unless_repaired", ok, FROZEN).passed is True
    bare = make_ctx({"pipeline/infer.py": fixed, RECEIPT: receipt()}, start=S4_START)
    result = run_check("unchanged_unless_repaired", bare, FROZEN)
    assert result.passed is False and "without a repair recorded" in result.detail


def test_a_record_that_is_not_the_change_made_is_refused(make_ctx):
    fixed = "print('v2')\n"
    for wrong in (
        {"sha256_before": sha("other"), "sha256_after": sha(fixed)},
        {"sha256_before": sha(PIPE), "sha256_after": None},
    ):
        entry = {"path": "pipeline/infer.py", "reason": "fix", **wrong}
        ctx = make_ctx({"pipeline/infer.py": fixed, RECEIPT: receipt(entry)}, start=S4_START)
        result = run_check("unchanged_unless_repaired", ctx, FROZEN)
        assert result.passed is False and "not the changes made" in result.detail
    garbled = make_ctx({RECEIPT: json.dumps({"repairs": "pipeline/infer.py"})}, start=S4_START)
    assert run_check("unchanged_unless_repaired", garbled, FROZEN).passed is False


def test_a_new_file_must_be_recorded_as_new(make_ctx):
    entry = {
        "path": "pipeline/helper.py",
        "sha256_before": None,
        "sha256_after": sha("X = 1\n"),
        "reason": "a helper",
    }
    ctx = make_ctx({"pipeline/helper.py": "X = 1\n", RECEIPT: receipt(entry)}, start=S4_START)
    assert run_check("unchanged_unless_repaired", ctx, FROZEN).passed is True
    ctx = make_ctx({"pipeline/helper.py": "X = 1\n"}, start=S4_START)
    assert run_check("unchanged_unless_repaired", ctx, FROZEN).passed is False


def test_the_submission_must_be_the_predictions(make_ctx):
    args = {"path": "outputs/submission.csv", "source": "outputs/predictions.csv"}
    linked = make_ctx({"outputs/submission.csv": PRED}, start=S4_START)
    assert run_check("stages_linked", linked, args).passed is True
    afresh = make_ctx(
        {"outputs/submission.csv": "id,label\ncase001,0\ncase002,0\n"}, start=S4_START
    )
    result = run_check("stages_linked", afresh, args)
    assert result.passed is False and "1 of 2 rows differ" in result.detail
