"""The study runner: its config, its units (cache, resume, lock), the token budget, the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bat_gym.core.errors import BatGymError, ConfigError
from bat_gym.trainers.study.arms import ARMS, composition
from bat_gym.trainers.study.config import ARM_NAMES, StudyConfig, load_study
from bat_gym.trainers.study.units import Unit, UnitBusy, run_unit

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "benchmarks" / "studies"

# A study small enough for a test: skill_ladder's short teacher turns, one SFT step.
MICRO = {
    "name": "micro",
    "benchmark": "skill_ladder",
    "arms": ["sft", "grpo-e2e"],
    "seeds": 1,
    "tasks_per_track": 1,
    "sft_steps": 1,
    "token_budget": 40,
    "groups_per_step": 2,
    "group_size": 2,
    "rounds": 1,
    "eval_repeats": 1,
    "eval_workers": 2,
    "max_turns": 2,
    "max_new_tokens": 16,
}


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"arms": ["sft", "sft"]}, "twice"),
        ({"arms": ["sft", "ppo"]}, "arms"),
        ({"token_budget": 0}, "token_budget"),
        ({"seeds": 0}, "seeds"),
        ({"grpo": {"target": "S3"}}, "remove them from grpo"),
        ({"grpo": {"max_generated_tokens": 5}}, "remove them from grpo"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_study_field_is_a_config_error_naming_it(tmp_path, change, names):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({**MICRO, **change}))  # JSON is YAML
    with pytest.raises(ConfigError, match=names) as info:
        load_study(path)
    assert isinstance(info.value, BatGymError)
    assert str(path) in str(info.value)


def test_a_missing_or_unreadable_study_file_says_what_to_give(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; give a YAML file"):
        load_study(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_study(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping of study fields"):
        load_study(bad)


def test_quick_overrides_the_full_sizes_of_the_shipped_study():
    full = load_study(STUDIES / "skill_ladder.yaml")
    quick = load_study(STUDIES / "skill_ladder.yaml", quick=True)
    assert full.arms == ARM_NAMES and full.seeds >= 5 and full.rounds >= 10
    assert quick.seeds < full.seeds and quick.token_budget < full.token_budget
    assert quick.max_new_tokens == full.max_new_tokens  # not in quick: kept


def test_every_arm_is_runnable_and_the_pools_fill_each_batch():
    assert set(ARMS) == set(ARM_NAMES)
    for arm in ARMS.values():
        if arm.mix is None:
            continue
        for batch in (2, 4, 8):
            counts = composition(arm.mix, batch)
            assert sum(counts.values()) == batch
            # A dropped pool stays dropped; a kept one keeps at least its share's floor.
            for share, n in zip(arm.mix, counts.values(), strict=True):
                assert (n == 0) == (share == 0) or batch < 4


@pytest.mark.parametrize("quick", [False, True])
def test_every_rl_arm_of_the_shipped_study_makes_a_valid_trainer_config(tmp_path, quick):
    from bat_gym.trainers.study.arms import bicurl_config, grpo_config

    study = load_study(STUDIES / "skill_ladder.yaml", quick=quick)
    args = (tmp_path / "sft", tmp_path / "bank", tmp_path / "out", 3)
    e2e = grpo_config(study, ARMS["grpo-e2e"], *args)
    assert e2e.max_generated_tokens == study.token_budget and e2e.seed == 3
    assert e2e.curriculum["e2e_per_batch"] == study.groups_per_step
    for name in ("bicurl", "bicurl-no-target", "bicurl-no-mix", "bicurl-no-e2e"):
        cfg = bicurl_config(study, ARMS[name], *args)
        assert cfg.rounds == study.rounds and cfg.model == str(tmp_path / "sft")
        round_cfg = cfg.round_grpo(cfg.model, "S3", str(tmp_path / "r"), seed=0)
        # Each round gets its share of the one budget; the pools follow the arm's mix.
        assert round_cfg.max_generated_tokens * study.rounds <= study.token_budget
        assert round_cfg.curriculum == {
            "batch_size": study.groups_per_step,
            **composition(ARMS[name].mix, study.groups_per_step),
        }
        assert round_cfg.lr == e2e.lr and round_cfg.group_size == e2e.group_size


@pytest.mark.parametrize("quick", [False, True])
def test_the_gpu_study_samples_and_evaluates_with_vllm_on_cuda_from_a_base_model(tmp_path, quick):
    """benchmarks/studies/skill_ladder_gpu.yaml: the sizes a GPU user runs, torch-free to
    check: every RL arm samples with vLLM and trains on cuda, every evaluation (the
    final one and BiCuRL's gates) serves the checkpoint with vLLM, SFT starts from the
    base model at the 4B-9B recipe."""
    from bat_gym.trainers.study.arms import bicurl_config, grpo_config

    study = load_study(STUDIES / "skill_ladder_gpu.yaml", quick=quick)
    assert study.eval_policy == "vllm" and study.sft["device"] == "cuda"
    assert study.seeds >= (2 if quick else 5) and study.rounds >= (4 if quick else 10)
    args = (tmp_path / "sft", tmp_path / "bank", tmp_path / "out", 0)
    e2e = grpo_config(study, ARMS["grpo-e2e"], *args)
    assert (e2e.generator, e2e.device) == ("vllm", "cuda")
    cfg = bicurl_config(study, ARMS["bicurl"], *args)
    command = cfg.evaluation.command("ckpt", "evals/r0")
    assert command[command.index("--policy") + 1] == "vllm:ckpt"
    round_cfg = cfg.round_grpo(cfg.model, "S3", str(tmp_path / "r"), seed=0)
    assert (round_cfg.generator, round_cfg.device) == ("vllm", "cuda")
    # Without a checkpoint folder it stops before any work, saying what to give.
    with pytest.raises(ConfigError, match="--base-model PATH"):
        study.model_copy(update={"base_model": str(tmp_path / "nowhere")}).check_base_model()


def test_a_base_model_replaces_the_tiny_model_and_is_recorded_in_the_units(tmp_path, tiny):
    """A study from a checkpoint: SFT starts from it with its own tokenizer, and every
    unit records it (a folder of the tiny study refuses it); a study without one records
    exactly what units recorded before the field existed."""
    from bat_gym.trainers.study.runner import _setup, _unit_settings, sft_unit
    from bat_gym.trainers.tiny_sft import tiny_sft_config

    plain = StudyConfig(**MICRO)
    assert not {"base_model", "sft", "eval_policy"} & set(_unit_settings(plain, "sft", 0))
    assert set(sft_unit(plain, tmp_path).settings) == {"benchmark", "tasks_per_track", "sft_steps"}
    study = StudyConfig(**{**MICRO, "base_model": str(tiny), "sft": {"lr": 3e-5}})
    assert _unit_settings(study, "grpo-e2e", 0)["base_model"] == str(tiny)
    assert sft_unit(study, tmp_path).settings["sft"] == {"lr": 3e-5}
    setup = _setup(study, tmp_path)
    assert setup.init == Path(tiny) and not (tmp_path / "setup" / "init").exists()
    cfg = tiny_sft_config(setup, tmp_path / "run", steps=1, **study.sft)
    assert cfg.model == str(tiny) and cfg.lr == 3e-5
    with pytest.raises(ConfigError, match="remove them from sft"):
        StudyConfig(**{**MICRO, "sft": {"model": "elsewhere"}})


def test_a_batch_too_small_for_an_arms_pools_is_refused_before_any_work(tmp_path):
    from bat_gym.trainers.study.runner import check_pools, run_study

    check_pools(StudyConfig(**{**MICRO, "arms": ["bicurl"], "groups_per_step": 4}))
    small = StudyConfig(**{**MICRO, "arms": ["bicurl"], "groups_per_step": 2})
    with pytest.raises(ConfigError, match="no e2e_per_batch rows .* groups_per_step >= 4"):
        run_study(small, tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_the_config_imports_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; from bat_gym.trainers.study import load_study; "
        f"load_study({str(STUDIES / 'skill_ladder.yaml')!r}); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# ----------------------------------------------------------------------------- units


def test_a_finished_unit_is_skipped_and_an_interrupted_one_is_redone(tmp_path):
    calls = []

    def work(path):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt  # killed midway: no marker is written
        return {"value": 1}

    unit = Unit(tmp_path / "u", {"arm": "sft", "seed": 0})
    with pytest.raises(KeyboardInterrupt):
        run_unit(unit, work)
    assert not unit.done and not (unit.path / "metrics.json").exists()
    assert run_unit(unit, work) == "ran"
    assert unit.done and unit.metrics() == {"value": 1}
    assert run_unit(unit, work) == "skipped"
    assert len(calls) == 2


def test_a_unit_held_by_another_process_is_busy_and_other_settings_are_refused(tmp_path):
    unit = Unit(tmp_path / "u", {"seed": 0})
    with unit.lock():
        # A second open file description: what another process would hold.
        with pytest.raises(UnitBusy, match="another process"), Unit(tmp_path / "u", {}).lock():
            pass
        assert run_unit(unit, lambda p: {"x": 1}) == "busy"
    unit.check_settings()
    with pytest.raises(ConfigError, match="other seed"):
        Unit(tmp_path / "u", {"seed": 1}).check_settings()


# ----------------------------------------------------------------------------- report


def _fake_unit(out: Path, arm: str, seed: int, level: float, rounds=()) -> None:
    """A finished unit's files as run_arm_unit writes them (3 tracks x 4 episodes)."""
    per_track = {t: [level + d for d in (-0.05, 0.0, 0.0, 0.05)] for t in ("a", "b", "c")}
    unit = Unit(out / "units" / arm / f"seed-{seed}", {"arm": arm, "seed": seed})
    unit.check_settings()
    unit.finish(
        {
            "arm": arm, "seed": seed, "checkpoint": "x", "generated_tokens": 100.0,
            "grpo_steps": 2, "rounds": list(rounds), "train_s": 1.0, "wall_s": 2.0,
            "overall": level, "task": level, "stages": {"S1": level, "S3": level / 2},
            "episodes": 12, "finished": 6, "finish_rate": 0.5, "overall_by_track": per_track,
            "overall_ci": [level - 0.05, level + 0.05], "eval_s": 1.0,
        }
    )  # fmt: skip


def test_the_report_has_a_row_per_arm_with_ci_bounds_and_the_comparisons(tmp_path):
    from bat_gym.trainers.study.report import write_report

    (tmp_path / "study.json").write_text(
        StudyConfig(**{**MICRO, "arms": list(ARM_NAMES)}).model_dump_json()
    )
    rounds = [
        {"round": 0, "target": "S3", "decision": "promote", "raw_overall": 0.6,
         "retained_overall": 0.6, "stages": {"S1": 0.7, "S3": 0.5}},
        {"round": 1, "target": "S3", "decision": "hold", "raw_overall": 0.4,
         "retained_overall": 0.6, "stages": {"S1": 0.5, "S3": 0.3}},
    ]  # fmt: skip
    for seed in (0, 1):
        _fake_unit(tmp_path, "grpo-e2e", seed, 0.3)
        _fake_unit(tmp_path, "bicurl", seed, 0.6, rounds)
    res = write_report(tmp_path)
    assert list(res["arms"]) == ["grpo-e2e", "bicurl"]
    for row in res["arms"].values():
        low, high = row["overall_ci"]
        assert low <= row["overall"] <= high and len(row["seeds"]) == 2
    diff = res["comparisons"]["bicurl - grpo-e2e"]
    assert diff["difference"] == pytest.approx(0.3) and diff["excludes_zero"]
    assert res["bicurl_rounds"]["raw_overall"] == [0.6, 0.4]
    assert res["bicurl_rounds"]["retained_max_fall"] == 0.0
    table = (tmp_path / "results.md").read_text()
    assert "| GRPO E2E-only | 2 | 0.300 | [" in table and "| bicurl - grpo-e2e | +0.300" in table
    for png in ("overall.png", "bicurl_rounds.png", "bicurl_stages.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- a real study


@pytest.mark.slow
def test_a_micro_study_runs_caches_resumes_and_keeps_the_token_budget(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from bat_gym.trainers.study import runner

    study = StudyConfig(**MICRO)
    out = tmp_path / "study"
    first = runner.run_study(study, out)
    assert first == {"sft/seed-0": "ran", "grpo-e2e/seed-0": "ran"}
    grpo = runner.unit_dir(out, "grpo-e2e", 0)
    steps = [json.loads(x) for x in (grpo / "train" / "metrics.jsonl").read_text().splitlines()]
    spent = sum(s["generated_tokens"] for s in steps)
    # Stopped by the budget, at the step boundary nearest it: within one step of it.
    last = steps[-1]["generated_tokens"]
    assert study.token_budget - last <= spent <= study.token_budget + last
    assert study.token_budget <= spent + last / 2
    metrics = json.loads((grpo / "metrics.json").read_text())
    assert metrics["generated_tokens"] == spent and 0 <= metrics["finish_rate"] <= 1
    results = json.loads((out / "results.json").read_text())
    assert set(results["arms"]) == {"sft", "grpo-e2e"}

    # A rerun trains nothing: every unit is skipped, no file of a unit changes.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "units").rglob("*") if p.is_file()}

    def no_training(*args, **kwargs):
        raise AssertionError("a finished unit was run again")

    monkeypatch.setattr(runner, "run_arm_unit", no_training)
    assert set(runner.run_study(study, out).values()) == {"skipped"}
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    monkeypatch.undo()

    # A unit killed before its marker is redone; GRPO resumes from its last checkpoint.
    os.remove(grpo / "DONE")
    again = runner.run_study(study, out)
    assert again == {"sft/seed-0": "skipped", "grpo-e2e/seed-0": "ran"}
    lines = (grpo / "train" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(steps)  # no step was redone


def test_more_seeds_from_the_command_line_extend_a_study_and_keep_its_units(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from bat_gym.cli import app
    from bat_gym.trainers.study import runner

    ran = []
    monkeypatch.setattr(runner, "run_study", lambda study, out, on_unit: ran.append(study))
    file = STUDIES / "skill_ladder.yaml"
    result = CliRunner().invoke(
        app, ["study", "run", str(file), "--quick", "--seeds", "5", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    (five,) = ran
    assert five.seeds == 5 and five.seed_list == [0, 1, 2, 3, 4]
    two = load_study(file, quick=True)
    assert two.seeds == 2
    # The seeds the two share are the same units: a finished one is reused, not redone.
    for arm in two.arms:
        assert runner._unit_settings(five, arm, 1) == runner._unit_settings(two, arm, 1)


def test_bat_gym_view_shows_a_study_table(tmp_path):
    from bat_gym.trainers.study.report import write_report
    from bat_gym.viewer import Site

    (tmp_path / "study.json").write_text(StudyConfig(**MICRO).model_dump_json())
    _fake_unit(tmp_path, "sft", 0, 0.5)
    write_report(tmp_path)
    site = Site([tmp_path])
    assert [r.kind for r in site.runs] == ["study"]
    site.export(tmp_path.parent / "site")
    page = (tmp_path.parent / "site" / f"{site.runs[0].id}.html").read_text()
    assert "SFT</td><td class='num'>1</td><td class='num'>0.500</td>" in page


def test_a_bicurl_arm_reuses_a_sibling_arms_finished_start_evaluation(tmp_path):
    from bat_gym.trainers.study.arms import _share_start_evaluation

    units = tmp_path / "units"
    done = units / "bicurl" / "seed-1" / "train" / "evals" / "start"
    done.mkdir(parents=True)
    (done / "aggregates.json").write_text("{}")
    (units / "bicurl-no-mix" / "seed-1" / "train" / "evals" / "start").mkdir(parents=True)
    other_seed = units / "bicurl-no-e2e" / "seed-0" / "train"
    _share_start_evaluation(other_seed)
    assert not (other_seed / "evals").exists()  # another seed samples other episodes
    mine = units / "bicurl-no-target" / "seed-1" / "train"
    _share_start_evaluation(mine)
    assert (mine / "evals" / "start" / "aggregates.json").is_file()


def test_bat_gym_study_report_rebuilds_the_table_and_refuses_a_non_study(tmp_path):
    from typer.testing import CliRunner

    from bat_gym.cli import app

    (tmp_path / "study.json").write_text(StudyConfig(**MICRO).model_dump_json())
    _fake_unit(tmp_path, "sft", 0, 0.5)
    result = CliRunner().invoke(app, ["study", "report", str(tmp_path)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "1 arms ->" in result.output and (tmp_path / "results.md").is_file()
    result = CliRunner().invoke(app, ["study", "report", str(tmp_path / "units")])
    assert isinstance(result.exception, ConfigError) and "not a study folder" in str(
        result.exception
    )


def test_an_arm_without_a_scored_episode_has_no_interval_and_no_comparison(tmp_path):
    from bat_gym.trainers.study.report import write_report

    (tmp_path / "study.json").write_text(StudyConfig(**MICRO).model_dump_json())
    _fake_unit(tmp_path, "sft", 0, 0.5)
    unit = Unit(tmp_path / "units" / "baseline" / "seed-0", {})
    unit.check_settings()
    unit.finish({**json.loads((tmp_path / "units/sft/seed-0/metrics.json").read_text()),
                 "arm": "baseline", "overall": None, "overall_by_track": {"a": [], "b": []}})  # fmt: skip
    res = write_report(tmp_path)
    assert res["arms"]["baseline"]["overall_ci"] == [None, None]
    assert "sft - baseline" not in res["comparisons"]
    assert "| Baseline (no training) | 1 | - | [-, -] |" in (tmp_path / "results.md").read_text()


def test_a_second_process_waits_for_the_shared_sft_run_then_uses_it(tmp_path, monkeypatch):
    import threading
    import time

    from bat_gym.trainers.study import runner

    monkeypatch.setattr(runner, "_WAIT_S", 0.05)
    study = StudyConfig(**MICRO)
    other = runner.sft_unit(study, tmp_path)
    other.check_settings()
    locked, release = threading.Event(), threading.Event()

    def first_process():
        with Unit(other.path, other.settings).lock():  # its own open file description
            locked.set()
            release.wait(5)
            other.finish({"checkpoint": str(tmp_path / "ck")})

    thread = threading.Thread(target=first_process)
    thread.start()
    locked.wait(5)
    threading.Timer(0.3, release.set).start()
    t0 = time.perf_counter()
    # Had it not waited, it would have built a bank and trained (seconds, and no "ck").
    assert runner._sft_unit(study, tmp_path) == tmp_path / "ck"
    assert time.perf_counter() - t0 >= 0.25
    thread.join()
