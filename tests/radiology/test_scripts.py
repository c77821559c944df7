"""The radiology sandbox code: real files, complete, shipped, and sent as written."""

from __future__ import annotations

import ast
import csv
import fnmatch
import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bat_gym.envs.radiology import sandbox_code, suite
from bat_gym.envs.radiology.models import MEASURE_PATH, measure_source

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(sandbox_code.SCRIPT_DIR.glob("*.py"))
STAGES = ("s2_setup", "s3_validate", "s4_infer", "s5_submit", "naive_s2_setup")
# The functions the naive baseline gets wrong, one trap each.
NAIVE_FUNCTIONS = {"load", "radiograph", "diameter"}
# (track, task seed): both tiers of both tracks; odd seeds are the hard tier.
CELLS = [(t, s) for t in ("lesion_growth", "nodule_dx") for s in (0, 1, 2_000_001)]


def _turn_codes(track: str, seed: int) -> list[tuple[str, str, str]]:
    bench = suite.Radiology()
    task = bench.make_task(track, seed, "heldout" if seed >= 2_000_000 else "train")
    return [
        (turn.stage, call.arguments.get("language", ""), call.arguments.get("code", ""))
        for turn in [
            *(t for o in bench.outcomes for t in bench.teacher_turns(task, o)),
            *(t for f in ("S3", "S4", "S5") for t in bench.repair_turns(task, f, "failure")),
            *bench.naive_turns(task),
        ]
        for call in turn.calls
        if call.name == "execute_code"
    ]


def test_the_folder_holds_the_pipeline_its_patches_the_stages_and_the_receipt():
    assert {p.stem for p in SCRIPTS} == {
        "infer",
        "receipt",
        "pilot_check",
        *sandbox_code.NAIVE_PATCHES,
        *STAGES,
        "s3_shape_pilot",
    }
    # A data folder, not a package of the suite's modules: its files run in a sandbox only.
    assert not (sandbox_code.SCRIPT_DIR / "__init__.py").exists()


@pytest.mark.parametrize("path", [*SCRIPTS, MEASURE_PATH], ids=lambda p: p.name)
def test_every_file_compiles_and_says_what_it_is(path):
    source = path.read_text(encoding="utf-8")
    compile(source, str(path), "exec")
    assert ast.get_docstring(ast.parse(source)), f"{path.name} says nothing of itself"


def test_the_sent_pipeline_is_the_file_less_its_docstring():
    sent = sandbox_code.pipeline()
    source = sandbox_code.script("infer")
    assert sent.startswith("\nimport ") and source.endswith(sent.lstrip("\n"))
    assert ast.get_docstring(ast.parse(sent)) is None
    compile(sent, "pipeline/infer.py", "exec")


def test_the_naive_pipeline_differs_in_the_patched_functions_only_and_as_patched():
    good = ast.parse(sandbox_code.pipeline()).body
    bad = ast.parse(sandbox_code.naive_pipeline()).body
    changed = set()
    for a, b in zip(good, bad, strict=True):
        if ast.dump(a) != ast.dump(b):
            assert isinstance(a, ast.FunctionDef), ast.unparse(b)
            changed.add(a.name)
    assert changed == NAIVE_FUNCTIONS
    naive = {n.name: n for n in bad if isinstance(n, ast.FunctionDef)}
    for patch in sandbox_code.NAIVE_PATCHES:
        (fn,) = [
            n for n in ast.parse(sandbox_code.script(patch)).body if isinstance(n, ast.FunctionDef)
        ]
        assert ast.dump(naive[fn.name]) == ast.dump(fn), patch


def test_the_naive_pipeline_has_none_of_the_checks_the_traps_need():
    naive = sandbox_code.naive_pipeline()
    for check in ("RescaleSlope", "EchoTime", "MONOCHROME1", "/ mag"):
        assert check in sandbox_code.pipeline() and check not in naive, check


@pytest.mark.parametrize(("track", "seed"), CELLS)
def test_every_turn_is_python_or_bash_with_every_slot_filled(track, seed):
    codes = _turn_codes(track, seed)
    assert {lang for _, lang, _ in codes} == {"python", "bash"}
    for stage, lang, code in codes:
        assert "SLOT_" not in code, (stage, code)
        if lang == "python":
            compile(code, f"{track} {stage}", "exec")


@pytest.mark.parametrize(("track", "seed"), CELLS[:2])
def test_the_teacher_writes_the_pipeline_and_the_naive_baseline_its_variant(track, seed):
    setups = [code for stage, _, code in _turn_codes(track, seed) if stage == "S2"]
    teacher, *mistaken, naive = setups  # success, recovery and failure, the naive baseline
    assert len(mistaken) == 2
    assert all(repr(sandbox_code.naive_pipeline()) in code for code in mistaken)
    assert repr(sandbox_code.pipeline()) in teacher
    assert repr(sandbox_code.naive_pipeline()) in naive
    assert repr(sandbox_code.pipeline()) not in naive


def test_the_sent_texts_are_those_the_states_were_built_from():
    # The default bank's states hold what these texts write and print: a change here
    # changes every state built from the teacher's turns. Change it deliberately, and
    # this digest with it.
    sent = [
        sandbox_code.pipeline(),
        sandbox_code.naive_pipeline(),
        sandbox_code.stage_script(
            "s3_validate", check=sandbox_code.CHECK, receipt=sandbox_code.RECEIPT
        ),
        *(
            sandbox_code.stage_script(n, receipt=sandbox_code.RECEIPT)
            for n in ("s4_infer", "s5_submit")
        ),
        sandbox_code.stage_script("s2_setup", pipeline="P"),
        sandbox_code.stage_script("naive_s2_setup", pipeline="P"),
        measure_source(),
    ]
    digest = hashlib.sha256("\0".join(sent).encode()).hexdigest()
    assert digest == PINNED, digest


# The digest of the texts the teacher sends since its S3 pilot states a check (the
# pilot checked against the model card's own reading, on a patient where a trap shows).
PINNED = "3e50c3f79d1948452e7a87defb8066dc47280058a8a4a082e9504e1a7dd7c13b"


def test_the_task_ships_the_model_the_verifier_imports(tmp_path):
    bench = suite.Radiology()
    bench.write_public_files(bench.make_task("nodule_dx", 0, "train"), tmp_path)
    assert (tmp_path / "model" / "measure.py").read_bytes() == MEASURE_PATH.read_bytes()
    assert measure_source() == suite.MEASURE_PY
    for fn in suite._measure_fns():
        assert Path(fn.__code__.co_filename).resolve() == MEASURE_PATH.resolve()


@pytest.mark.parametrize("track", ["lesion_growth", "nodule_dx"])
def test_on_a_hard_task_the_pipeline_agrees_with_the_verifier_and_the_naive_one_never(
    track, tmp_path
):
    # The files as the sandbox gets them, run as S4 runs them: every trap of the
    # track is in a hard (odd-seed) task, and the naive pipeline falls into one on
    # every patient.
    bench = suite.Radiology()
    task = bench.make_task(track, 1, "train")
    bench.write_public_files(task, tmp_path)
    truth = bench.private_answers(task)["patients"]
    rows = {}
    for name, text in (
        ("teacher", sandbox_code.pipeline()),
        ("naive", sandbox_code.naive_pipeline()),
    ):
        (tmp_path / f"{name}.py").write_text(text)
        subprocess.run(
            [sys.executable, f"{name}.py", f"{name}.csv"], cwd=tmp_path, check=True, timeout=120
        )
        with open(tmp_path / f"{name}.csv", newline="") as f:
            rows[name] = {r["id"]: r for r in csv.DictReader(f)}
    assert set(rows["teacher"]) == set(rows["naive"]) == set(truth)
    for pid, want in truth.items():
        got = rows["teacher"][pid]
        assert (float(got["diameter_mm"]), float(got["prior_mm"]), got["change"]) == (
            want["diameter_mm"],
            want["prior_mm"],
            want["change"],
        ), pid
        naive = rows["naive"][pid]
        assert float(naive["diameter_mm"]) != want["diameter_mm"], pid


def test_a_non_editable_install_ships_the_scripts_and_the_model():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "bat_gym.envs.radiology.models" in config["packages"]
    globs = config["package-data"]["bat_gym.envs.radiology"]
    for path in SCRIPTS:
        assert any(fnmatch.fnmatch(f"scripts/{path.name}", g) for g in globs), path.name
