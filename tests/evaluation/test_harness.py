import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.core.errors import BatGymError
from bat_gym.evaluation import AGGREGATES_FILE, Aggregates, EvalConfig, evaluate, held_out_cells
from bat_gym.policies import PolicyError, ScriptedPolicy, make_policy

CFG = EvalConfig(repeats=2, workers=2, progress=False)


class Flaky(ScriptedPolicy):
    """The teacher, but the policy backend fails on chosen tracks' first calls."""

    def __init__(self, fail: dict[str, int]) -> None:
        super().__init__("teacher")
        self.fail = dict(fail)  # track -> how many more calls fail

    def act_batch(self, requests):
        track = requests[0].context.state.track
        if self.fail.get(track, 0) > 0:
            self.fail[track] -= 1
            raise PolicyError("the server answered 503")
        return super().act_batch(requests)


class Counting(ScriptedPolicy):
    def __init__(self) -> None:
        super().__init__("teacher")
        self.episodes: list[str] = []

    def act_batch(self, requests):
        ctx = requests[0].context
        if ctx.turn == 0:
            self.episodes.append(ctx.state.task_id)
        return super().act_batch(requests)


def test_teacher_evaluation_writes_every_report(toy, tmp_path):
    report = evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    for name in ("report.json", "report.md", "stages.png", "manifest.json", AGGREGATES_FILE):
        assert (tmp_path / name).is_file(), name
    agg = Aggregates.read(tmp_path / AGGREGATES_FILE)
    assert agg == report.aggregates
    assert agg.completion.runs == 2 * len(toy.spec.tracks) and agg.valid
    assert agg.overall == pytest.approx(1.0) and agg.task == pytest.approx(1.0)
    assert set(agg.tracks) == {t.name for t in toy.spec.tracks}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["policy"]["kind"] == "scripted"
    assert manifest["benchmark"]["contracts"]  # every contract digest is recorded
    assert all(len(d) == 64 for d in manifest["benchmark"]["contracts"].values())
    assert {c["seed"] for c in manifest["cells"]} <= set(toy.seeds("heldout"))
    assert manifest["timing"]["wall_s"] > 0


def test_a_rerun_adds_its_time_to_the_manifest(toy, tmp_path):
    """A finished evaluation run again (a resume) reports the time of both invocations."""
    evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    first = json.loads((tmp_path / "manifest.json").read_text())["timing"]
    evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    both = json.loads((tmp_path / "manifest.json").read_text())["timing"]
    assert first["invocations"] == 1 and both["invocations"] == 2
    assert both["started"] == first["started"]
    assert both["wall_s"] > first["wall_s"]
    assert both["episode_wall_s_total"] == first["episode_wall_s_total"]


@pytest.mark.slow
def test_medbench_naive_scores_below_the_teacher(tmp_path):
    cfg = EvalConfig(repeats=1, tracks=("segmentation", "vqa"), progress=False)
    teacher = evaluate("medbench_lite", make_policy("teacher"), tmp_path / "t", cfg).aggregates
    naive = evaluate("medbench_lite", make_policy("naive"), tmp_path / "n", cfg).aggregates
    assert teacher.overall > 0.95 and naive.overall < 0.5
    assert naive.stages["S3"] < teacher.stages["S3"]


def test_cells_are_held_out_tasks_one_per_repeat(toy):
    cells = held_out_cells(toy, EvalConfig(repeats=3))
    assert len(cells) == 3 * len(toy.spec.tracks)
    assert all(c.seed in toy.seeds("heldout") for c in cells)
    assert len({(c.track, c.seed) for c in cells}) == len(cells)
    # More repeats than the spec's heldout_repeats would play tasks no audit covers.
    with pytest.raises(ValueError, match="heldout_repeats = 10"):
        held_out_cells(toy, EvalConfig(repeats=11))


def test_a_rerun_skips_finished_cells(toy, tmp_path):
    first = Counting()
    evaluate(toy, first, tmp_path, CFG)
    assert len(first.episodes) == 2 * len(toy.spec.tracks)
    victim = next((tmp_path / "cells").glob("*.json"))
    victim.unlink()
    again = Counting()
    report = evaluate(toy, again, tmp_path, CFG)
    assert len(again.episodes) == 1  # only the missing cell is played again
    assert report.aggregates.completion.runs == 2 * len(toy.spec.tracks)


def test_a_torn_cell_file_is_redone_not_trusted(toy, tmp_path, capsys):
    evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    victim = next((tmp_path / "cells").glob("*.json"))
    victim.write_text(victim.read_text()[:40])
    again = Counting()
    evaluate(toy, again, tmp_path, CFG)
    assert len(again.episodes) == 1
    assert victim.name in capsys.readouterr().err


def test_a_rerun_refuses_another_policy(toy, tmp_path):
    evaluate(toy, make_policy("teacher"), tmp_path, CFG)
    with pytest.raises(BatGymError, match="another policy"):
        evaluate(toy, make_policy("naive"), tmp_path, CFG)


def test_infrastructure_failures_are_retried(toy, tmp_path):
    track = toy.spec.tracks[0].name
    report = evaluate(toy, Flaky({track: 1}), tmp_path, CFG)
    agg = report.aggregates
    assert agg.valid and agg.overall == pytest.approx(1.0)
    assert max(c.attempts for c in report.cells) == 2


def test_persistent_failures_are_invalid_not_zero(toy, tmp_path):
    track = toy.spec.tracks[0].name
    report = evaluate(toy, Flaky({track: 1000}), tmp_path, CFG)
    agg = report.aggregates
    assert not agg.valid
    assert agg.completion.invalid == 2 and agg.failures["infrastructure"] == 2
    assert agg.tracks[track].overall is None  # no score, not a zero
    assert agg.overall == pytest.approx(1.0)  # the other tracks, unaffected
    assert "503" in (tmp_path / "report.md").read_text()
    # Invalid cells are not stored as finished: a rerun plays them again.
    again = Counting()
    assert evaluate(toy, again, tmp_path, CFG).aggregates.valid
    assert len(again.episodes) == 2


def test_cli_eval(toy, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--benchmark",
            "toy_pipeline",
            "--policy",
            "teacher",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "overall 1.000" in result.output
    assert Aggregates.read(tmp_path / AGGREGATES_FILE).completion.runs == len(toy.spec.tracks)


def test_cli_eval_names_a_bad_policy_spec(tmp_path):
    result = CliRunner().invoke(
        app, ["eval", "--benchmark", "toy_pipeline", "--policy", "gpt", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0
    assert "openai:URL#MODEL" in result.output


def test_a_killed_evaluation_resumes(tmp_path):
    """SIGKILL mid-run; the rerun keeps every cell finished before the kill."""
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import time
        from bat_gym.evaluation import EvalConfig, evaluate
        from bat_gym.policies import ScriptedPolicy

        class Slow(ScriptedPolicy):
            def act_batch(self, requests):
                time.sleep(0.05)
                return super().act_batch(requests)

        evaluate("toy_pipeline", Slow("teacher"), {str(out)!r},
                 EvalConfig(repeats=4, workers=1, progress=False))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    cells = out / "cells"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(cells.glob("*.json"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = {p.name: p.stat().st_mtime_ns for p in cells.glob("*.json")}
    assert 2 <= len(kept) < 8
    again = Counting()
    report = evaluate("toy_pipeline", again, out, EvalConfig(repeats=4, workers=1, progress=False))
    assert len(again.episodes) == 8 - len(kept)
    assert report.aggregates.completion.runs == 8 and report.aggregates.valid
    assert all((cells / n).stat().st_mtime_ns == t for n, t in kept.items())


# -- the spec's held-out repeats, and policies a benchmark cannot play ---------------------


def toy_variant(name, **spec_updates):
    """The toy benchmark under ``name``: splits as given, and no naive baseline."""
    from bat_gym.envs.toy_pipeline.suite import SPEC, ToyPipeline

    class Variant(ToyPipeline):
        spec = SPEC.model_copy(update={"name": name, **spec_updates})
        naive_turns = None  # a benchmark that defines no naive baseline

    return Variant()


@pytest.fixture
def three_repeats():
    from bat_gym.catalog import register_benchmark, unregister_benchmark
    from bat_gym.envs.toy_pipeline.suite import SPEC

    splits = SPEC.splits.model_copy(update={"heldout_repeats": 3})
    bench = toy_variant("toy_three", splits=splits)
    register_benchmark("toy_three", bench)
    yield bench
    unregister_benchmark("toy_three")


def test_eval_plays_the_specs_heldout_repeats_the_tasks_the_audit_covers(
    three_repeats, tmp_path, monkeypatch
):
    from bat_gym.audits.leakage import HeldOutIndex

    bench = three_repeats
    cells = held_out_cells(bench, EvalConfig())
    assert len(cells) == 3 * len(bench.spec.tracks)
    seeds = sorted({c.seed for c in cells})
    assert seeds == bench.evaluated_seeds() == list(bench.seeds("heldout"))[:3]
    # The leakage audit regenerates exactly the evaluated held-out tasks, no more.
    made = []
    make_task = type(bench).make_task

    def counting(self, track, seed, split):
        made.append((split, seed))
        return make_task(self, track, seed, split)

    monkeypatch.setattr(type(bench), "make_task", counting)
    HeldOutIndex.of(bench)
    assert sorted({s for split, s in made if split == "heldout"}) == seeds
    monkeypatch.undo()
    out = tmp_path / "e"
    args = ["eval", "--policy", "teacher", "--benchmark", "toy_three", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--track", "lookup", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "3/3 valid cells" in result.output
    too_many = CliRunner().invoke(app, [*args, "--repeats", "4"])
    assert too_many.exit_code == 2 and "heldout_repeats = 3" in too_many.output


def test_naive_on_a_benchmark_without_a_baseline_fails_in_one_line(
    three_repeats, tmp_path, monkeypatch, capsys
):
    from bat_gym.cli import main

    out = tmp_path / "e"
    monkeypatch.setattr(
        sys, "argv", ["bat-gym", "eval", "--policy", "naive", "--benchmark", "toy_three",
                      "--out", str(out)]
    )  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: policy 'naive': toy_three defines no naive baseline (Benchmark.naive_turns); "
        "evaluate the teacher or a model instead, or add naive_turns to the benchmark"
    ]
    assert not (out / "cells").exists()  # refused before any cell ran


def test_a_policy_named_by_its_spec_is_built_evaluated_and_closed(toy, tmp_path, monkeypatch):
    from bat_gym.evaluation import evaluate_spec

    closed = []
    monkeypatch.setattr(ScriptedPolicy, "close", lambda self: closed.append(self.name))
    cfg = EvalConfig(repeats=1, workers=1, progress=False)
    report = evaluate_spec(toy, "teacher", tmp_path / "eval", cfg)
    assert report.aggregates.overall == 1.0
    assert closed == ["teacher"]
    assert (tmp_path / "eval" / AGGREGATES_FILE).exists()
