"""The code blocks of the README, the quickstart and the tour, run as a reader pastes them.

Each document's blocks run in order, in one fresh directory of its own.

Every ``python`` and ``bash`` block is a test, run in a new process with the installed
``bat-gym`` on the PATH, so a snippet cannot rot. A block sees the files the blocks
before it made (``banks/med``, ``runs/``), as a reader following along would. Blocks are
found and their markers read by ``pytest-codeblocks``: an HTML comment such as
``<!--pytest.mark.slow-->`` or ``<!--pytest.mark.skip(reason=...)-->`` just before a
block marks it (the install commands are skipped: CI runs them itself; blocks that take
minutes on a CPU are ``slow``).

    pytest -m "readme and not slow" tests/test_readme.py   # the blocks CI runs
    pytest -m readme tests/test_readme.py                  # every block
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The documents a reader follows block by block, from a fresh folder.
DOCUMENTS = (README, ROOT / "docs" / "quickstart.md", ROOT / "docs" / "guide.md")
RUNNABLE = ("python", "bash", "sh")
TIMEOUT_S = 1200

pytestmark = pytest.mark.readme


def _blocks() -> list:
    params = []
    for doc in DOCUMENTS:
        name = doc.relative_to(ROOT).as_posix()
        for block in extract_from_file(doc):
            if block.syntax not in RUNNABLE:
                continue
            # Markers are written as pytest expressions in the document's HTML comments.
            marks = [eval(mark, {"pytest": pytest}) for mark in block.marks]
            params.append(pytest.param(name, block, id=f"{name}:{block.lineno}", marks=marks))
    return params


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh folder per document, shared by its blocks."""
    return {
        doc.relative_to(ROOT).as_posix(): tmp_path_factory.mktemp(doc.stem) for doc in DOCUMENTS
    }


@pytest.mark.parametrize(("doc", "block"), _blocks())
def test_the_block_runs_as_pasted(doc: str, block, workdirs: dict[str, Path]) -> None:
    workdir = workdirs[doc]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if block.syntax == "python":
        script = workdir / f"readme_{block.lineno}.py"
        script.write_text(block.code, encoding="utf-8")
        argv = [sys.executable, script.name]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    done = subprocess.run(
        argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, (
        f"{doc} line {block.lineno} exited {done.returncode}\n"
        f"--- stdout (end)\n{done.stdout[-4000:]}\n--- stderr (end)\n{done.stderr[-4000:]}"
    )


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: d.name)
def test_every_runnable_block_is_collected(doc: Path) -> None:
    """A block in another fence (```py, ```shell) would silently escape the test."""
    fences = [
        line.strip()[3:]
        for line in doc.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("```") and len(line.strip()) > 3
    ]
    assert set(fences) <= {*RUNNABLE, "toml", "text"}, fences
