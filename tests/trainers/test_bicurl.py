"""The BiCuRL outer loop: phases, gate and retention, resumption, and the firewall."""

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from corpus import project_text  # noqa: E402

from bat_gym.evaluation import Aggregates, Cell, CellResult, aggregate  # noqa: E402
from bat_gym.trainers import bicurl  # noqa: E402
from bat_gym.trainers.bicurl import BiCuRLConfig, LoopState, RoundRecord, run_loop  # noqa: E402


class Killed(BaseException):
    """Stands in for a SIGKILL between two phases."""


def fake_aggregates(toy, scores: dict[str, float]) -> Aggregates:
    results = [
        CellResult(
            cell=Cell(track=t.name, seed=1_000_000, repeat=0),
            task_id=f"{t.name}-x",
            valid=True,
            overall=scores["overall"],
            task=scores["overall"],
            agentic=scores["overall"],
            stages={s: scores.get(s, scores["overall"]) for s in ("S1", "S2", "S3", "S4", "S5")},
        )
        for t in toy.spec.tracks
    ]
    return aggregate(results, toy.spec)


class World:
    """Fake evaluation and training: scores are scripted per checkpoint name."""

    def __init__(self, toy, scores, kill_at=None):
        self.toy, self.scores, self.kill_at = toy, scores, kill_at
        self.calls: list[str] = []

    def _tick(self, what):
        self.calls.append(what)
        if self.kill_at is not None and len(self.calls) == self.kill_at:
            raise Killed(what)

    def evaluate(self, model_dir, out_dir, cfg):
        self._tick(f"eval {Path(model_dir).name}")
        agg = fake_aggregates(self.toy, self.scores[Path(model_dir).name])
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        agg.write(Path(out_dir) / "aggregates.json")
        return agg

    def grpo(self, incumbent, target, out_dir, cfg, *, seed):
        r = Path(out_dir).parent.name  # round-00
        self._tick(f"grpo {r} from {Path(incumbent).name} on {target}")
        return str(Path(out_dir) / f"cand-{r}")


SCORES = {
    "start": {"overall": 0.50, "S3": 0.2},
    "cand-round-00": {"overall": 0.60, "S3": 0.4},  # better everywhere: promoted
    "cand-round-01": {"overall": 0.30},  # catastrophic drop: held, the incumbent stays
    "cand-round-02": {"overall": 0.62, "S2": 0.59},  # S2 may drop a little: promoted
}


@pytest.fixture
def world(toy, monkeypatch):
    w = World(toy, SCORES)
    monkeypatch.setattr(bicurl, "evaluate_checkpoint", w.evaluate)
    monkeypatch.setattr(bicurl, "_grpo_block", w.grpo)
    return w


def cfg(tmp_path, rounds=3):
    return BiCuRLConfig(
        model=str(tmp_path / "start"), output_dir=str(tmp_path / "loop"),
        benchmark="toy_pipeline", rounds=rounds,
    )  # fmt: skip


def test_rounds_gate_and_keep_the_best_eligible_checkpoint(world, tmp_path):
    state = run_loop(cfg(tmp_path))
    assert world.calls == [
        "eval start",
        "grpo round-00 from start on S3",  # the starting checkpoint's weakest stage
        "eval cand-round-00",
        "grpo round-01 from cand-round-00 on S3",  # promoted; its weakest stage next
        "eval cand-round-01",
        # Held: round 1's candidate is discarded; the largest regression (a tie) goes first.
        "grpo round-02 from cand-round-00 on S1",
        "eval cand-round-02",
    ]
    assert [r.decision for r in state.rounds] == ["promote", "catastrophic", "promote"]
    assert Path(state.incumbent).name == "cand-round-02"
    assert [r.best_overall for r in state.rounds] == pytest.approx([0.60, 0.60, 0.62])
    report = (tmp_path / "loop" / "report.md").read_text()
    assert "| 1 | S3 | 0.300 | 0.600 | catastrophic |" in report
    # Each phase's time is kept in the state file, so a resumed loop reports all of it.
    assert all(r.train_s >= 0 and r.eval_s >= 0 for r in state.rounds)
    saved = LoopState.load(tmp_path / "loop" / "loop_state.json")
    assert saved.seconds == pytest.approx(state.seconds)
    assert f"Time: {state.seconds:.0f} s" in report
    assert (tmp_path / "loop" / "rounds.png").stat().st_size > 0


def test_every_round_trains_with_its_own_seed_and_the_chosen_kl_reference(
    toy, monkeypatch, tmp_path
):
    """Round 2 follows a hold and targets S3 like the held round 1: with one seed for
    every round it would replay round 1 exactly (same incumbent, states and samples)."""
    from bat_gym.trainers import grpo

    scores = {**SCORES, "cand-round-01": {"overall": 0.30, "S3": 0.0}}
    w = World(toy, scores)
    monkeypatch.setattr(bicurl, "evaluate_checkpoint", w.evaluate)
    configs = []

    def fake_train(c):
        configs.append(c)
        return {"final": str(Path(c.output_dir).parent / f"cand-{Path(c.output_dir).parent.name}")}

    monkeypatch.setattr(grpo, "train", fake_train)
    state = run_loop(cfg(tmp_path))
    assert [r.target for r in state.rounds] == ["S3", "S3", "S3"]
    assert [Path(c.model).name for c in configs] == ["start", "cand-round-00", "cand-round-00"]
    seeds = [c.seed for c in configs]
    assert len(set(seeds)) == 3 and seeds == [bicurl.round_seed(0, r) for r in range(3)]
    assert all(c.kl_reference is None for c in configs)  # the round's incumbent

    configs.clear()
    anchored = BiCuRLConfig(
        model=str(tmp_path / "start"), output_dir=str(tmp_path / "anchored"),
        benchmark="toy_pipeline", rounds=2, kl_reference="start",
    )  # fmt: skip
    run_loop(anchored)
    assert [c.kl_reference for c in configs] == [anchored.model] * 2


@pytest.mark.parametrize("kill_at", range(1, 8))
def test_a_loop_killed_at_any_phase_resumes_without_redoing_work(
    toy, monkeypatch, tmp_path, kill_at
):
    straight = World(toy, SCORES)
    monkeypatch.setattr(bicurl, "evaluate_checkpoint", straight.evaluate)
    monkeypatch.setattr(bicurl, "_grpo_block", straight.grpo)
    expected = run_loop(cfg(tmp_path / "a"))

    killed = World(toy, SCORES, kill_at=kill_at)
    monkeypatch.setattr(bicurl, "evaluate_checkpoint", killed.evaluate)
    monkeypatch.setattr(bicurl, "_grpo_block", killed.grpo)
    with pytest.raises(Killed):
        run_loop(cfg(tmp_path / "b"))
    killed.kill_at = None
    state = run_loop(cfg(tmp_path / "b"))
    # The killed phase runs again (its work was lost); nothing finished before it does.
    assert killed.calls == straight.calls[:kill_at] + straight.calls[kill_at - 1 :]
    assert [r.decision for r in state.rounds] == [r.decision for r in expected.rounds]
    assert Path(state.incumbent).name == Path(expected.incumbent).name


def test_a_finished_loop_can_be_extended_but_not_changed(world, tmp_path):
    run_loop(cfg(tmp_path, rounds=1))
    n = len(world.calls)
    state = run_loop(cfg(tmp_path, rounds=2))
    assert len(state.rounds) == 2 and world.calls[n] == "grpo round-01 from cand-round-00 on S3"
    other = cfg(tmp_path, rounds=2)
    other.selector = "deficit"
    with pytest.raises(ValueError, match="selector"):
        run_loop(other)


def test_the_state_file_is_json_and_names_no_task(world, tmp_path):
    run_loop(cfg(tmp_path, rounds=1))
    state = LoopState.load(tmp_path / "loop" / "loop_state.json")
    text = state.model_dump_json()
    assert "1000000" not in text and "-x" not in text  # no seeds, no task ids


@pytest.mark.slow
def test_the_loop_reads_nothing_of_an_evaluation_but_aggregates_json(toy_bank, tmp_path):
    """A real loop (tiny model, real GRPO, real ``bat-gym eval`` child processes)."""
    from bat_gym.trainers.tiny_model import build_tiny_model

    model = build_tiny_model(
        tmp_path / "model", ["\n".join(project_text())], vocab_size=600, hidden_size=64
    )
    evals = str(tmp_path / "loop" / "evals")
    opened: list[str] = []

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(evals):
                opened.append(path)

    sys.addaudithook(audit)
    state = run_loop(
        BiCuRLConfig(
            model=str(model), output_dir=str(tmp_path / "loop"), benchmark="toy_pipeline",
            bank=str(toy_bank.root), rounds=1, steps_per_round=1, eval_repeats=1,
            eval_max_turns=2, eval_max_new_tokens=16,
            grpo={"group_size": 2, "max_new_tokens": 16, "max_turns": 2, "num_envs": 2},
        )
    )  # fmt: skip
    assert state.rounds[0].decision in ("promote", "hold", "catastrophic")
    assert opened, "the loop read the aggregates"
    assert {Path(p).name for p in opened} == {"aggregates.json"}
    # The evaluation side wrote its reports; the loop never opened them.
    assert (Path(evals) / "start" / "report.json").is_file()


def test_the_loop_reports_its_rounds_to_the_progress_display(world, tmp_path):
    from bat_gym.core import progress

    tasks = []

    class Recording(progress.Reporter):
        def task(self, what, total=None, *, done=0):
            tasks.append(progress.ProgressTask(what, total, done))
            return tasks[-1]

    with progress.use(Recording()):
        run_loop(cfg(tmp_path))
    (rounds,) = [t for t in tasks if t.what == "BiCuRL rounds"]
    assert (rounds.done, rounds.total, rounds.closed) == (3, 3, True)


def test_the_state_file_keeps_its_keys_and_a_bad_one_is_refused_by_name(world, tmp_path):
    from bat_gym.core.errors import BatGymError

    run_loop(cfg(tmp_path, rounds=1))
    path = tmp_path / "loop" / "loop_state.json"
    raw = json.loads(path.read_text())
    assert list(raw) == [
        "round", "phase", "incumbent", "incumbent_eval", "target", "selector", "rounds",
        "settings", "start_eval_s",
    ]  # fmt: skip
    assert set(raw["rounds"][0]) == {
        "round", "target", "candidate", "train_s", "eval_s", "eval", "decision",
        "failed_checks", "candidate_overall", "incumbent_overall", "candidate_stages", "gate",
        "best_overall", "next_target",
    }  # fmt: skip
    # Read back and written again, the file is the same.
    LoopState.load(path).save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == raw
    # A round the GRPO block wrote but no evaluation finished keeps only its own keys.
    state = LoopState.load(path)
    state.rounds.append(RoundRecord(round=1, target="S2", candidate="c", train_s=1.0))
    state.save(path)
    assert set(json.loads(path.read_text())["rounds"][1]) == {
        "round", "target", "candidate", "train_s",
    }  # fmt: skip

    raw["rounds"][0]["decision"] = 3
    raw["phase"] = "sleep"
    path.write_text(json.dumps(raw))
    with pytest.raises(BatGymError, match="loop_state.json is not a loop state .*phase"):
        LoopState.load(path)
