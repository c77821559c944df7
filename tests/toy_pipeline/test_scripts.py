"""toy_pipeline's sandbox code: real files, shipped, and what the teacher writes."""

import fnmatch
import tomllib
from pathlib import Path

import pytest

from bat_gym.envs.toy_pipeline import suite, teacher

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((Path(suite.__file__).parent / "scripts").glob("*.py"))


def test_there_are_the_stage_scripts_and_a_pipeline_and_a_check_per_track():
    assert {p.stem for p in SCRIPTS} == {
        "receipt",
        "s2_setup",
        "naive_s2_setup",
        "s3_validate",
        "s3_shape_pilot",
        "s4_infer",
        "s5_submit",
        *(f"{t}_{kind}" for t in ("threshold", "lookup") for kind in ("infer", "check")),
    }


@pytest.mark.parametrize("track", ["threshold", "lookup"])
def test_every_turn_is_python_or_bash_with_every_slot_filled(track):
    turns = [
        *(
            t
            for o in teacher.OUTCOMES
            for t in teacher.teacher_turns(track, cases=3, unit="mm", outcome=o)
        ),
        *(t for f in ("S3", "S4", "S5") for t in teacher.repair_turns(track, f, "failure")),
        *teacher.naive_turns(track),
    ]
    for turn in turns:
        for call in turn.calls:
            code = call.arguments.get("code", "")
            assert "SLOT_" not in code, (turn.stage, code)
            if call.arguments.get("language") == "python":
                compile(code, f"{track} {turn.stage}", "exec")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_script_compiles(path):
    compile(path.read_text(encoding="utf-8"), str(path), "exec")


@pytest.mark.parametrize("track", ["threshold", "lookup"])
def test_the_teacher_writes_its_pipeline_file_and_the_naive_one_differs(track):
    source = (Path(suite.__file__).parent / "scripts" / f"{track}_infer.py").read_text()
    setup = teacher.teacher_turns(track, cases=3, unit="mm")[1].calls[0].arguments["code"]
    naive = teacher.naive_turns(track)[0].calls[0].arguments["code"]
    assert repr(source) in setup
    assert repr(source) not in naive and "pipeline/infer.py" in naive


def test_a_non_editable_install_ships_every_script():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = config["package-data"]["bat_gym.envs.toy_pipeline"]
    for path in SCRIPTS:
        assert any(fnmatch.fnmatch(f"scripts/{path.name}", g) for g in globs), path.name
