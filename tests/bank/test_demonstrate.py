"""Admission by demonstration: a row is kept only if honest work, played from it, wins it."""

import json

import pytest
from typer.testing import CliRunner

from bat_gym.bank import StageBank, build_bank
from bat_gym.bank.demonstrate import BELOW_BAR, load_demonstration
from bat_gym.cli import app

runner = CliRunner()


def toy_demonstrated(skip_stage):
    """The toy benchmark, whose demonstrator of ``skip_stage`` rows leaves that stage's work out.

    It stands for a row no honest play can win (an earlier stage's mistake frozen in
    its start state): the demonstration is played from the row and scored by the row's
    contract, and earns nothing.
    """
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    class Toy(ToyPipeline):
        def demonstration_turns(self, task, state):
            if state.focus != skip_stage:
                return None
            return [t for t in self.teacher_script(task) if t.stage > skip_stage]

    return Toy()


@pytest.fixture(scope="module")
def refused_bank(tmp_path_factory):
    bench = toy_demonstrated("S4")
    return bench, build_bank(bench, tmp_path_factory.mktemp("refused") / "b")


def test_a_row_no_demonstration_wins_is_not_admitted_and_is_counted_by_reason(refused_bank):
    bench, bank = refused_bank
    assert bank.select(focus="S4") == []  # neither track's S4 row is admitted
    assert {s.focus for s in bank} == {"E2E", "S1", "S2", "S3", "S5"}
    m = bank.manifest
    assert m["rejected"] == {BELOW_BAR: 2}
    assert m["admission"]["demonstration_min_share"] == 0.9
    assert m["admission"]["shares"]["S4"] == {"success": {"admitted": 0, "rows": 2}}
    assert m["admission"]["shares"]["S3"] == {"success": {"admitted": 2, "rows": 2}}
    assert m["admission"]["rows_admitted"] == 10 and m["admission"]["rows_checked"] == 12


def test_every_admitted_row_stores_the_demonstration_that_won_it(refused_bank):
    bench, bank = refused_bank
    for row in bank:
        demo = row.provenance["demonstration"]
        assert demo["reward"] >= 0.9 * demo["attainable"]
        turns = load_demonstration(bank.store, row)
        # The teacher's own continuation from the row's stage, ending in finish.
        assert turns[0].stage == ("S1" if row.focus == "E2E" else row.focus)
        assert "finish" in turns[-1].text
        stored = json.loads(bank.store.read_blob(demo["blob"]))
        assert stored["reward"] == demo["reward"] and stored["verdict"]["reward"] == demo["reward"]


def toy_setup_done_in_validate():
    """The toy benchmark whose teacher does Setup's work in its Validate turn.

    Its Setup row's own turns (an ``echo``) leave no setup; only the next stage's turn
    writes it. Playing on from the row would win it, but that pays a policy for doing
    the next stage: a row that teaches only that must not be admitted.
    """
    from bat_gym.core.protocol import bash_call
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    class Toy(ToyPipeline):
        outcomes = ("success",)

        def teacher_turns(self, task):
            out = []
            for t in super().teacher_turns(task):
                if t.stage == "S2":
                    out.append(t._replace(calls=(bash_call("echo setting up"),)))
                    t = t._replace(stage="S3")
                out.append(t)
            return out

    return Toy()


def test_a_stage_row_won_only_by_the_next_stages_work_is_not_admitted(tmp_path):
    bank = build_bank(toy_setup_done_in_validate(), tmp_path / "b")
    assert bank.select(focus="S2") == []
    assert bank.manifest["admission"]["shares"]["S2"] == {"success": {"admitted": 0, "rows": 2}}
    # The rows whose own stage's work wins them stay.
    assert len(bank.select(focus="S4")) == 2 and len(bank.select(focus="E2E")) == 2


def test_bank_build_and_explain_print_the_admitted_share(tmp_path):
    out = tmp_path / "b"
    result = runner.invoke(
        app, ["bank", "build", "--benchmark", "toy_pipeline", "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert "admitted 12 of 12 candidate rows" in result.output
    assert "S4    success 2/2 (100%)" in result.output
    result = runner.invoke(app, ["bank", "explain", str(out)])
    assert result.exit_code == 0, result.output
    assert "admitted 12 of 12 candidate rows" in result.output
    assert "E2E   success 2/2 (100%)" in result.output


def test_bank_explain_names_each_row_not_admitted(refused_bank):
    bench, bank = refused_bank
    from bat_gym.bank.explain import explain, journal_records

    lines = explain(journal_records(bank.root))
    refused = [line for line in lines if "not admitted" in line]
    assert len(refused) == 2 and all(".S4.success" in line for line in refused)
    assert BELOW_BAR in refused[0] and "reward 0.000 of an attainable 1.000" in refused[0]


def _tamper(bank, row, turns):
    """Replace ``row``'s stored demonstration by ``turns``; the bank stays self-consistent."""
    from bat_gym.bank.demonstrate import Demonstration, store_demonstration

    demo = Demonstration(turns=tuple(turns), reward=1.0, attainable=1.0)
    forged = store_demonstration(bank.store, row, demo)
    rows = [forged if r.state_id == row.state_id else r for r in bank]
    meta = {k: v for k, v in bank.manifest.items() if k not in ("format", "rows", "rows_sha256")}
    StageBank.write(bank.root, rows, meta)
    return StageBank(bank.root)


def test_bank_verify_replays_demonstrations_and_flags_one_below_the_bar(tmp_path):
    from bat_gym.catalog import get_benchmark

    bench = get_benchmark("toy_pipeline")
    bank = build_bank(bench, tmp_path / "b", tracks=["lookup"])
    report = bank.verify()
    assert report.ok, report.table()
    assert report.checked["demonstrations"] == len(bank) == 6
    row = bank.get(bank.select(focus="S5")[0])
    turns = load_demonstration(bank.store, row)
    bank = _tamper(bank, row, [t for t in turns if "finish" in t.text])  # no submission
    report = bank.verify()
    ((where, what),) = report.findings["demonstrations"]
    assert where == row.state_id
    assert "no longer reaches the bar: the demonstration earns 0.000" in what
    assert "at build it earned 1.000" in what
    result = runner.invoke(app, ["bank", "verify", str(bank.root)])
    assert result.exit_code == 1 and "no longer reaches the bar" in result.output
