"""The leakage audit: a clean bank passes, and each kind of planted leak is caught."""

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bat_gym.audits.leakage import answer_fingerprints, audit_bank, word_ngrams
from bat_gym.bank import StageBank
from bat_gym.cli import app

runner = CliRunner()


@pytest.fixture
def bank_copy(toy_bank, tmp_path):
    copy = tmp_path / "bank"
    shutil.copytree(toy_bank.root, copy)
    return copy


def heldout_task(toy, track="threshold"):
    return toy.make_task(track, toy.seeds("heldout")[0], "heldout")


def rewrite_first_row(root, edit):
    rows = (root / "rows.jsonl").read_text().splitlines()
    row = json.loads(rows[0])
    edit(row)
    data = ("\n".join([json.dumps(row), *rows[1:]]) + "\n").encode()
    (root / "rows.jsonl").write_bytes(data)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["rows_sha256"] = hashlib.sha256(data).hexdigest()
    (root / "manifest.json").write_text(json.dumps(manifest))
    return row["state_id"]


def test_a_clean_bank_passes(toy_bank):
    report = audit_bank(toy_bank)
    assert report.ok, report.table()
    assert report.checked["task ids"] >= len(toy_bank) and report.checked["public files"] > 0
    assert report.checked["answers"] > 0
    result = runner.invoke(app, ["bank", "audit", str(toy_bank.root)])
    assert result.exit_code == 0 and "audit: OK" in result.output


def test_a_heldout_public_file_in_the_store_is_found(toy, bank_copy):
    task = heldout_task(toy)
    with tempfile.TemporaryDirectory() as tmp:
        toy.write_public_files(task, Path(tmp))
        digest = StageBank(bank_copy).store.put_bytes((Path(tmp) / "data/cases.csv").read_bytes())
    report = audit_bank(StageBank(bank_copy))
    assert report.findings["public files"] == [
        (f"blob {digest}", f"is held-out {task.task_id}:data/cases.csv")
    ]
    result = runner.invoke(app, ["bank", "audit", str(bank_copy)])
    assert result.exit_code == 1 and digest in result.output


def test_a_heldout_task_id_in_a_prompt_is_found(toy, bank_copy):
    task = heldout_task(toy, "lookup")

    def plant(row):
        row["messages"][1]["content"] += f" (see also {task.task_id})"

    state_id = rewrite_first_row(bank_copy, plant)
    report = audit_bank(StageBank(bank_copy))
    assert [w for w, _ in report.findings["task ids"]] == [f"{state_id}/messages[1]"]


def test_a_heldout_seed_in_provenance_is_found(toy, bank_copy):
    state_id = rewrite_first_row(
        bank_copy, lambda row: row["provenance"].update(seed=toy.seeds("heldout")[3])
    )
    report = audit_bank(StageBank(bank_copy))
    assert [w for w, _ in report.findings["task ids"]] == [state_id]


def test_a_heldout_answer_in_the_store_is_found(toy, bank_copy):
    task = heldout_task(toy)
    labels = toy.private_answers(task)["scores"]
    blob = json.dumps(labels, sort_keys=True, separators=(",", ":")).encode()
    digest = StageBank(bank_copy).store.put_bytes(blob)
    assert digest in answer_fingerprints(toy.private_answers(task))
    report = audit_bank(StageBank(bank_copy))
    assert report.findings["answers"] == [
        (f"blob {digest}", f"is a private answer of {task.task_id}")
    ]


def test_heldout_card_ngrams_are_found_but_shared_boilerplate_is_not(toy, bank_copy):
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    secret = "the calibration drift of this scanner is known to reach seven percent"

    class Toy(ToyPipeline):
        def make_task(self, track, seed, split):
            task = super().make_task(track, seed, split)
            if split == "heldout":
                return task.model_copy(update={"card": f"{task.card} Note: {secret}."})
            return task

    bench = Toy()
    # The card's template is in every training prompt: shared by design, not a leak.
    clean = audit_bank(StageBank(bank_copy), bench)
    assert clean.ok
    # Only the held-out sentence (and 8-grams straddling its edges) is left to look for.
    assert clean.checked["8-grams"] >= len(word_ngrams(f"note {secret}"))

    def plant(row):
        row["messages"][-1]["content"] += f" I heard {secret}."

    state_id = rewrite_first_row(bank_copy, plant)
    report = audit_bank(StageBank(bank_copy), bench)
    assert {w for w, _ in report.findings["8-grams"]} == {f"{state_id}/messages[1]"}
    assert not report.ok
