"""A third-party package ships a rubric check and a policy through entry points alone.

The package (tests/fixtures/acme_rubric_plugin) is installed with real pip into a fresh
venv, as an author's user would install it; nothing puts it on ``PYTHONPATH``.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "acme_rubric_plugin"

# Runs in the venv: a contract naming the package's check scores through it, and the
# package's policy kind builds by its spec; neither is imported before it is asked for.
SCORE = textwrap.dedent(
    """
    import sys, tempfile

    from bat_gym.policies import make_policy
    from bat_gym.core.record import ExecutionRecord
    from bat_gym.rubrics.contract.context import CheckContext
    from bat_gym.rubrics.contract.model import RubricContract
    from bat_gym.rubrics.verifier.verdict import verify
    from bat_gym.rubrics.contract.workspace import FrozenWorkspace
    from bat_gym.core.sandbox.snapshot import BlobStore

    assert "acme_rubric_plugin" not in sys.modules
    contract = RubricContract.model_validate({
        "id": "acme_readme", "version": "1", "focus": "S1",
        "items": [{"id": "readme", "check": "acme_has_readme", "args": {"path": "README.md"}}],
    })
    store = BlobStore(tempfile.mkdtemp())
    start = FrozenWorkspace.from_files(store, {"TASK.md": "# task"})
    for files in ({"README.md": "hello"}, {}):
        ws = FrozenWorkspace.from_files(store, {"TASK.md": "# task", **files})
        record = ExecutionRecord(start_digest=start.digest, calls=[])
        ctx = CheckContext(workspace=ws, start=start, record=record, task=None, spec=None)
        verdict = verify(contract, ctx)
        print("reward", verdict.reward, verdict.stages[0].items[0].detail)
    policy = make_policy("acme:hello")
    print("policy", type(policy).__name__, policy.name)
    """
)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv over this interpreter's packages, with the fixture pip-installed in it."""
    root = tmp_path_factory.mktemp("plugin_venv")
    env_dir = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env_dir)],
        check=True,
    )
    python = env_dir / "bin" / "python"
    # --system-site-packages reaches the base interpreter's packages; where this test
    # runs in a venv itself, its packages (bat_gym, pip, setuptools) are one more site
    # directory, added the way site-packages are (their .pth files processed).
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    outer = [p for p in site.getsitepackages() if Path(p).resolve() != Path(own).resolve()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in outer)
    (Path(own) / "outer_site.pth").write_text(lines)
    package = root / "acme_rubric_plugin"  # a copy: pip builds in the source folder
    shutil.copytree(FIXTURE, package)
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    installed = subprocess.run([*pip, str(package)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def _run(python: Path, *args: str) -> str:
    done = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_contract_scores_through_the_package_check_and_its_policy_builds(venv):
    lines = _run(venv, "-c", SCORE).splitlines()
    assert lines == [
        "reward 1.0 README.md is there",
        "reward 0.0 README.md is missing or empty",
        "policy ScriptedPolicy acme:hello",
    ]


def test_bat_gym_plugins_lists_the_package_check_and_policy(venv):
    shown = _run(venv, "-m", "bat_gym.cli", "plugins")
    rows = [line.split() for line in shown.splitlines()]
    assert ["acme_has_readme", "acme-rubric-plugin", "acme_rubric_plugin:has_readme"] in rows
    assert ["acme", "acme-rubric-plugin", "acme_rubric_plugin:KIND"] in rows
    # bat_gym's own, beside them
    assert [
        "file_exists",
        "bat-gym",
        "bat_gym.rubrics.verifier.checks.artifact:file_exists",
    ] in rows
