"""The sandbox code of MedBench-Lite's teacher: real files, complete, and sent as written."""

import ast
import fnmatch
import tomllib
from pathlib import Path

import pytest

from bat_gym.envs.medbench_lite import scripts
from bat_gym.envs.medbench_lite.teacher import naive_turns, teacher_turns
from bat_gym.envs.medbench_lite.tracks import TRACKS, get_track
from bat_gym.errors import PluginError

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


@pytest.fixture
def script_dir(tmp_path, monkeypatch):
    """A scripts folder of one track, ``t``, with a pipeline of two functions."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "pipeline.py").write_text(
        'X = 1\n\n\ndef f(a):\n    """Doc."""\n    return a + 1\n\n\ndef g():\n    return f(X)\n'
    )
    monkeypatch.setattr(scripts, "SCRIPT_DIR", tmp_path)
    scripts.script.cache_clear()
    yield tmp_path / "t"
    scripts.script.cache_clear()


def test_a_patch_replaces_the_function_of_its_name_and_keeps_every_other_line(script_dir):
    (script_dir / "bug.py").write_text(
        '"""Readers\' notes."""\n\nfrom pipeline import X\n\n\ndef f(a):\n    """Doc."""\n    return a - X\n'
    )
    assert scripts.pipeline_variant("t", "bug") == (
        'X = 1\n\n\ndef f(a):\n    """Doc."""\n    return a - X\n\n\ndef g():\n    return f(X)\n'
    )


@pytest.mark.parametrize(
    "patch",
    [
        "def h():\n    return 0\n",  # no such function in the pipeline
        "def f(a):\n    return a\n\n\ndef g():\n    return 0\n",  # two functions
        "X = 2\n",  # none
    ],
)
def test_a_malformed_patch_is_refused_with_the_fix(script_dir, patch):
    (script_dir / "bug.py").write_text(patch)
    with pytest.raises(PluginError, match="pipeline"):
        scripts.pipeline_variant("t", "bug")


def test_a_fragment_without_a_docstring_is_sent_whole(script_dir):
    (script_dir / "s2_smoke.py").write_text("\nsmoke = {'ok': True}\n")
    assert scripts.fragment("t", "s2_smoke") == "smoke = {'ok': True}\n"


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


def test_a_slot_alone_on_its_line_takes_code_and_one_inside_a_line_a_value(script_dir):
    stages = script_dir.parent / "stages"
    stages.mkdir()
    (stages / "s9.py").write_text(
        '"""Not sent."""\n\nimport os\nSLOT_BODY\nos.makedirs(SLOT_OUT_DIR, exist_ok=True)\n'
    )
    got = scripts.stage_script("s9", body="\nx = 1\ny = 2\n\n", out_dir="outputs/a b")
    assert got == "import os\nx = 1\ny = 2\nos.makedirs('outputs/a b', exist_ok=True)\n"
    # Source: a value written another way on purpose (here as JSON) goes in as it is.
    got = scripts.stage_script("s9", body="", out_dir=scripts.Source('"o"'))
    assert got.endswith('os.makedirs("o", exist_ok=True)\n')


@pytest.mark.parametrize(
    "slots", [{"body": "x = 1"}, {"body": "x = 1", "out_dir": "o", "extra": "e"}]
)
def test_a_stage_script_refuses_a_missing_or_unknown_slot(script_dir, slots):
    stages = script_dir.parent / "stages"
    stages.mkdir()
    (stages / "s9.py").write_text("SLOT_BODY\nprint(SLOT_OUT_DIR)\n")
    with pytest.raises(PluginError, match="slots"):
        scripts.stage_script("s9", **slots)
