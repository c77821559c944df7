"""A user's environment for a benchmark plugin package: a real venv, and real pip in it.

:func:`make` creates a venv (``--system-site-packages``, ``--without-pip``) whose
site-packages also reads this interpreter's (a ``.pth`` file), so bat_gym and its
dependencies are there without a download, and gives it the ``bat-gym`` script. A
package is then installed as a reader installs it, ``python -m pip install -e``, with
``--no-deps --no-build-isolation`` (everything it needs is there; nothing is fetched).
This environment stays as it was: nothing to uninstall, and a concurrent test never
sees the package.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

__all__ = ["make", "pip_install"]

_PIP_FLAGS = ("--no-deps", "--no-build-isolation", "--no-index", "-q")


def make(venv: Path, cache: Path) -> dict[str, str]:
    """Create the venv ``venv``; return the environment of a process that runs in it.

    Its ``bin`` comes first on the PATH (``python``, ``bat-gym``), and the bat_gym cache
    is ``cache``: a benchmark made in a test has default states of its own.
    """
    venv, cache = venv.resolve(), cache.resolve()
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    theirs = subprocess.run(
        [python, "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    # addsitedir, not a bare path: our .pth files (bat_gym's own editable install) count.
    (Path(theirs) / "_parent_env.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in ours) + "\n"
    )
    script = venv / "bin" / "bat-gym"
    script.write_text(f"#!{python}\nimport sys\nfrom bat_gym.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "BAT_GYM_CACHE": str(cache),
        "TOKENIZERS_PARALLELISM": "false",
    }


def pip_install(requirement: str, env: dict[str, str], cwd: Path) -> None:
    """``python -m pip install -e REQUIREMENT`` in the venv ``env`` runs in, offline."""
    done = subprocess.run(
        ["python", "-m", "pip", "install", *_PIP_FLAGS, "-e", requirement],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"pip install -e {requirement}\n{done.stdout}\n{done.stderr}"
