"""docs/new-benchmark.md, followed as written: a benchmark from scaffold to GRPO.

Every ``bash`` and ``python`` block of the page is a test, run in order in one fresh
directory, each in a new process of one venv (``python`` and ``bat-gym`` first on the
PATH), as a reader pastes them: ``new-benchmark``, the hand edits (an artifact renamed, a built-in
and a custom check item added, the contract's version bumped), the package's own tests,
a Stage Bank, two evaluations, the reward audit, a tiny model and two GRPO steps. The
last test checks that the walkthrough ends where the page says it does.

The venv is a user's (:mod:`user_env`): the page's ``python -m pip install -e`` runs
real pip in it, offline (``--no-deps --no-build-isolation``: bat_gym and pytest are
there already), so the Python blocks import the package as a reader's do, from the
folder where ``my_bench/`` would shadow it were it not in the src layout.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import user_env
from pytest_codeblocks import extract_from_file

PAGE = Path(__file__).resolve().parents[2] / "docs" / "new-benchmark.md"
RUNNABLE = ("python", "bash")
TIMEOUT_S = 600
_INSTALL = re.compile(r"^python -m pip install -e (\S+)$")


def _blocks() -> list:
    params = []
    for block in extract_from_file(PAGE):
        if block.syntax not in RUNNABLE:
            continue
        marks = [eval(mark, {"pytest": pytest}) for mark in block.marks]
        params.append(pytest.param(block, id=f"new-benchmark.md:{block.lineno}", marks=marks))
    return params


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("walkthrough")


@pytest.fixture(scope="module")
def venv(workdir: Path) -> dict[str, str]:
    """The environment of the reader's venv (made outside ``workdir``'s listing)."""
    return user_env.make(workdir / ".venv", workdir / ".cache")


@pytest.mark.parametrize("block", _blocks())
def test_the_block_runs_as_written(block, workdir: Path, venv: dict[str, str]) -> None:
    installing = _INSTALL.match(block.code.strip())
    if installing:
        user_env.pip_install(shlex.split(installing.group(1))[0], venv, workdir)
        return
    if "bat-gym train" in block.code or "bat-gym tiny-model" in block.code:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    if block.syntax == "python":
        script = workdir / f"block_{block.lineno}.py"
        script.write_text(block.code, encoding="utf-8")
        argv = ["python", script.name]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    done = subprocess.run(
        argv,
        cwd=workdir,
        env=venv,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"new-benchmark.md line {block.lineno} exited {done.returncode}\n"
        f"--- stdout (end)\n{done.stdout[-4000:]}\n--- stderr (end)\n{done.stderr[-4000:]}"
    )


def test_the_walkthrough_ends_where_the_page_says(workdir: Path) -> None:
    package = workdir / "my_bench" / "src" / "my_bench"
    if not (workdir / "evals" / "naive" / "aggregates.json").exists():
        pytest.skip("the walkthrough's blocks did not run (deselected)")
    # The hand edits are in the package, and its contracts load with them.
    submit = (package / "contracts" / "submit.yaml").read_text()
    assert 'version: "1.1"' in submit and "outputs/scores.csv" in submit
    assert "check: ids_sorted" in submit and "check: non_degenerate" in submit
    assert "outputs/submission.csv" not in (package / "bench.py").read_text()
    # The teacher earns the whole reward with the new items; the naive baseline nothing.
    teacher = json.loads((workdir / "evals" / "teacher" / "aggregates.json").read_text())
    naive = json.loads((workdir / "evals" / "naive" / "aggregates.json").read_text())
    assert teacher["overall"] >= 0.95 and naive["overall"] <= 0.2
    cells = sorted((workdir / "evals" / "teacher" / "cells").glob("*.json"))
    assert cells and all(json.loads(c.read_text())["valid"] for c in cells)
    assert (workdir / "banks" / "my_bench" / "manifest.json").is_file()
    if (workdir / "runs" / "grpo").exists():
        metrics = (workdir / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in metrics] == [1, 2]
        assert (workdir / "runs" / "grpo" / "final" / "config.json").is_file()


def test_every_runnable_block_is_collected() -> None:
    """A block in another fence (```py, ```shell) would silently escape the test."""
    fences = [
        line.strip()[3:]
        for line in PAGE.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("```") and len(line.strip()) > 3
    ]
    assert set(fences) <= {*RUNNABLE, "yaml", "toml", "json", "text"}, fences
