"""The sandbox code of MedBench-Lite's teacher: real files, complete, and sent as written."""

import ast
import fnmatch
import tomllib
from pathlib import Path

import pytest

from bat_gym.envs.medbench_lite import scripts
from bat_gym.envs.medbench_lite.teacher import naive_turns, teacher_turns
from bat_gym.envs.medbench_lite.tracks import TRACKS, get_track

FILES = sorted(p for p in scripts.SCRIPT_DIR.glob("*/*.py"))
FRAGMENTS = ("s2_inspect", "s2_smoke", "s3_pilot", "s3_weak_pilot", "s5_submit_check")
REPO = Path(__file__).resolve().parents[2]


def test_every_track_has_a_script_folder_and_every_folder_is_a_track_or_the_stages():
    folders = {p.name for p in scripts.SCRIPT_DIR.iterdir() if p.is_dir() and p.name[0] != "_"}
    assert folders == {t.name for t in TRACKS} | {"stages"}


@pytest.mark.parametrize("track", [t.name for t in TRACKS])
def test_a_track_has_its_pipeline_its_mistake_and_every_fragment(track):
    names = {p.stem for p in (scripts.SCRIPT_DIR / track).glob("*.py")}
    assert {"pipeline", "pipeline_bug", *FRAGMENTS} <= names
    assert names <= {"pipeline", "pipeline_bug", "pipeline_naive", *FRAGMENTS}


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_script_compiles(path):
    compile(path.read_text(encoding="utf-8"), str(path), "exec")


@pytest.mark.parametrize("track", [t.name for t in TRACKS])
def test_the_recipe_sends_the_files_as_written(track):
    recipe = get_track(track).recipe()
    assert recipe.pipeline == scripts.script(track, "pipeline")
    for field, name in zip(
        ("inspect", "smoke", "pilot", "weak_pilot", "submit_check"), FRAGMENTS, strict=True
    ):
        sent = getattr(recipe, field)
        source = scripts.script(track, name)
        # The docstring documents the fragment here; everything after it is sent.
        assert not sent.lstrip().startswith('"""'), (track, name)
        assert source.endswith(sent), (track, name)
        assert ast.get_docstring(ast.parse(source)), f"{track}/{name}.py says nothing of itself"
        compile(sent, f"{track}/{name}", "exec")


@pytest.mark.parametrize("track", [t.name for t in TRACKS])
def test_a_pipeline_variant_differs_from_the_pipeline_in_its_one_function_only(track):
    recipe = get_track(track).recipe()
    good = ast.parse(recipe.pipeline)
    for variant in {recipe.pipeline_bug, recipe.naive_pipeline}:
        assert variant != recipe.pipeline
        bad = ast.parse(variant)
        changed = [
            a.name
            for a, b in zip(good.body, bad.body, strict=True)
            if ast.dump(a) != ast.dump(b) and isinstance(a, ast.FunctionDef)
        ]
        others = [
            a
            for a, b in zip(good.body, bad.body, strict=True)
            if ast.dump(a) != ast.dump(b) and not isinstance(a, ast.FunctionDef)
        ]
        assert len(changed) == 1 and not others, (track, changed)


def test_the_naive_baseline_runs_the_mistake_unless_the_track_names_its_own():
    for t in TRACKS:
        recipe = t.recipe()
        own = (scripts.SCRIPT_DIR / t.name / "pipeline_naive.py").is_file()
        assert (recipe.naive_pipeline != recipe.pipeline_bug) == own, t.name


def test_a_non_editable_install_ships_every_script():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "bat_gym.envs.medbench_lite.scripts" in config["packages"]
    globs = config["package-data"]["bat_gym.envs.medbench_lite.scripts"]
    for path in FILES:
        rel = path.relative_to(scripts.SCRIPT_DIR).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


@pytest.mark.parametrize("track", [t.name for t in TRACKS])
def test_every_teacher_turn_is_python_or_bash_with_every_slot_filled(track):
    recipe = get_track(track).recipe()
    turns = [t for o in ("success", "recovery", "failure") for t in teacher_turns(recipe, o)]
    for turn in turns + naive_turns(recipe):
        for call in turn.calls:
            code = call.arguments.get("code", "")
            assert "SLOT_" not in code, (turn.stage, code)
            if call.arguments.get("language") == "python":
                compile(code, f"{track} {turn.stage}", "exec")
