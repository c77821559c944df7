"""``bat-gym new-benchmark``: the template, its rendering, and the one-line refusals.

The rendered package is played for real (bank, eval, GRPO) in
``tests/docs/test_new_benchmark.py``; here it is imported in process and checked
without a sandbox, for every stage count.
"""

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.core.errors import ConfigError, PluginError
from bat_gym.core.plugins import load_target
from bat_gym.rubrics.contract.model import ContractLibrary
from bat_gym.scaffold import STAGE_SETS, TEMPLATE, new_benchmark, render_text

runner = CliRunner()


def test_the_templates_are_valid_python_before_rendering():
    # So they are linted as they stand (CI's ruff covers bat_gym/scaffold/template).
    sources = sorted(TEMPLATE.rglob("*.py"))
    assert len(sources) >= 4
    for path in sources:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_render_keeps_the_blocks_of_the_package_stages_and_names_them():
    text = (
        "name = '__NAME__'  # __CLASS__\n"
        "# [stage Plan]\nplan = '__S_Plan__'\n# [end]\n"
        "<!-- [stage Validate] -->\nvalidate = '__S_Validate__'\n<!-- [end] -->\n"
        "submit = '__S_Submit__'\n"
    )
    assert render_text(text, "my_bench", ("Setup", "Validate", "Submit")) == (
        "name = 'my_bench'  # MyBench\nvalidate = 'S2'\nsubmit = 'S3'\n"
    )
    assert "plan = 'S1'" in render_text(text, "my_bench", STAGE_SETS[5])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("# [stage Plan]\nx = 1\n", "not closed"),
        ("# [end]\n", "without a stage block"),
        ("# [stage Plan]\n# [stage Setup]\n# [end]\n", "nested or unknown"),
        ("# [stage Deploy]\n# [end]\n", "nested or unknown"),
        ("x = '__S_Plan__'\n", "outside their blocks"),
    ],
)
def test_a_broken_template_is_refused(text, says):
    with pytest.raises(ConfigError, match=says):
        render_text(text, "my_bench", ("Setup", "Submit"))


def _load(root: Path, name: str):
    """Import a rendered package from its directory, as its entry point would."""
    sys.path.insert(0, str(root / "src"))
    try:
        return importlib.import_module(name).benchmark()
    finally:
        sys.path.remove(str(root / "src"))


@pytest.mark.parametrize("stages", sorted(STAGE_SETS))
def test_every_stage_count_renders_a_consistent_package(stages, tmp_path):
    name = f"scaffolded_{stages}"
    made = new_benchmark(name, tmp_path / name, stages=stages)
    try:
        bench = _load(made.root, name)
        spec = bench.spec
        assert [s.name for s in spec.stages] == list(STAGE_SETS[stages])
        assert made.stages == tuple((s.id, s.name) for s in spec.stages)
        assert made.env_ids[-1] == "bat/E2E-v0" and len(made.env_ids) == stages + 1
        # Its own contracts, one per focus, and not the reference library.
        library = bench.contract_library()
        assert len(library) == stages + 1
        assert all(library.for_focus(f) is not None for f in spec.focuses)
        assert library.ids != ContractLibrary.reference().ids
        for c in library:
            assert (made.root / "src" / name / "contracts" / f"{c.id}.yaml").is_file()
        # The scripts name only stages the spec has, in order, and end with finish.
        task = bench.make_task("units", 0, "train")
        for turns in (bench.teacher_turns(task), bench.naive_turns(task)):
            ids = [t.stage for t in turns]
            assert ids == sorted(ids) and set(ids) <= {s.id for s in spec.stages}
            assert turns[-1].calls[-1].name == "finish"
        assert {t.stage for t in bench.teacher_turns(task)} == {s.id for s in spec.stages}
        # The README names each stage's env id, and no other stage's.
        readme = (made.root / "README.md").read_text()
        for stage in STAGE_SETS[5]:
            assert (f"`bat/{stage}-v0` |" in readme) == (stage in STAGE_SETS[stages])
        rendered = "".join((made.root / f).read_text() for f in made.files)
        assert not re.findall(r"__NAME__|__CLASS__|__S_\w+__|\[stage \w+\]|\[end\]", rendered)
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_the_package_declares_its_entry_point_and_contracts(tmp_path):
    made = new_benchmark("my_bench", tmp_path / "pkg")
    pyproject = (made.root / "pyproject.toml").read_text()
    assert (
        '[project.entry-points."bat_gym.benchmarks"]\nmy_bench = "my_bench:benchmark"' in pyproject
    )
    assert 'my_bench = ["contracts/*.yaml"]' in pyproject
    assert sorted(made.files) == sorted(
        [
            "README.md",
            "pyproject.toml",
            "src/my_bench/__init__.py",
            "src/my_bench/bench.py",
            "src/my_bench/pipeline.py",
            "src/my_bench/contracts/e2e.yaml",
            "src/my_bench/contracts/setup.yaml",
            "src/my_bench/contracts/submit.yaml",
            "tests/test_benchmark.py",
        ]
    )


def test_a_folder_that_shadows_the_package_is_named(tmp_path, monkeypatch):
    # A project folder of the package's name without __init__.py, in the working directory:
    # it imports as an empty namespace package (the src/ layout keeps the scaffold's own
    # project folder from doing so).
    (tmp_path / "shadowed_bench").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(PluginError, match="no attribute 'benchmark'; shadowed_bench was") as e:
            load_target("shadowed_bench:benchmark")
        assert str(tmp_path / "shadowed_bench") in str(e.value)
        assert "run from another directory, or rename that folder" in str(e.value)
    finally:
        sys.modules.pop("shadowed_bench", None)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("My-Bench", "not a benchmark name: use a lowercase Python identifier"),
        ("2bench", "not a benchmark name"),
        ("class", "is a Python keyword"),
        ("toy_pipeline", "a benchmark named 'toy_pipeline' is already installed"),
        ("json", "'json' is already an importable module"),
    ],
)
def test_a_name_that_cannot_work_is_refused(name, says, tmp_path):
    with pytest.raises(ConfigError, match=says):
        new_benchmark(name, tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_an_existing_directory_and_a_stage_count_out_of_range_are_refused(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="taken already exists"):
        new_benchmark("my_bench", tmp_path / "taken")
    with pytest.raises(ConfigError, match="between 2 and 5"):
        new_benchmark("my_bench", tmp_path / "pkg", stages=6)
    (tmp_path / "empty").mkdir()
    assert new_benchmark("my_bench", tmp_path / "empty").root == tmp_path / "empty"


def test_the_command_writes_the_package_and_says_what_next(tmp_path):
    result = runner.invoke(app, ["new-benchmark", "my_bench", "--out", str(tmp_path / "pkg")])
    assert result.exit_code == 0, result.output
    assert "(stages S1 Setup, S2 Submit)" in result.output
    assert "env ids: bat/Setup-v0, bat/Submit-v0, bat/E2E-v0" in result.output
    # This Python's own pip and pytest, with the test extra: a bare `pip` may be another's.
    assert f"{sys.executable} -m pip install -e '{tmp_path / 'pkg'}[test]'" in result.output
    assert f"{sys.executable} -m pytest {tmp_path / 'pkg' / 'tests'}" in result.output
    assert "bat-gym is not on the package index" in result.output
    assert (tmp_path / "pkg" / "src" / "my_bench" / "bench.py").is_file()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["new-benchmark", "my-bench"], "not a benchmark name"),
        (["new-benchmark", "my_bench", "--out", "taken"], "taken already exists"),
        (["new-benchmark", "my_bench", "--stages", "1"], "between 2 and 5"),
    ],
)
def test_the_command_refuses_in_one_line(args, says, tmp_path):
    # As the console script runs it.
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    done = subprocess.run(
        [sys.executable, "-c", "from bat_gym.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("stages", sorted(STAGE_SETS))
def test_out_of_the_box_the_package_tests_builds_evaluates_and_passes_its_audit(stages, tmp_path):
    # What new-benchmark promises, unchanged, in fresh processes that find the package
    # through its entry point (the walkthrough test does this for a changed package).
    import user_env

    made = new_benchmark("fresh_bench", tmp_path / "fresh_bench", stages=stages)
    env = user_env.make(tmp_path / "venv", tmp_path / "cache")
    user_env.pip_install("fresh_bench[test]", env, tmp_path)
    for command in (
        "python -m pytest -q -p no:cacheprovider fresh_bench/tests",
        "bat-gym bank build --benchmark fresh_bench --out bank --quiet",
        "bat-gym eval --benchmark fresh_bench --policy teacher --out teacher --quiet",
        "bat-gym eval --benchmark fresh_bench --policy naive --out naive --quiet",
        "bat-gym audit-reward --benchmark fresh_bench --quiet",
    ):
        done = subprocess.run(
            command.split(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    teacher = json.loads((tmp_path / "teacher" / "aggregates.json").read_text())
    naive = json.loads((tmp_path / "naive" / "aggregates.json").read_text())
    assert teacher["overall"] == 1.0 and naive["overall"] == 0.0
    assert sorted(teacher["stages"]) == [sid for sid, _ in made.stages]
