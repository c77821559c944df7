"""Install a benchmark plugin package for subprocesses only, as ``pip install -e`` would.

The package directory goes on PYTHONPATH with a ``.dist-info`` holding the name,
version and entry points its own ``pyproject.toml`` declares (what pip records), so
bat_gym finds the benchmark through its entry point in those processes, this test
environment stays as it was, and there is nothing to uninstall. Cheaper than pip by
seconds, and a concurrent test never sees the benchmark.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

__all__ = ["install", "plugin_env"]


def install(package: Path, site: Path) -> None:
    """``pip install -e PACKAGE`` into ``site``, as far as Python and bat_gym can tell.

    A mistake in the package's entry point declaration fails later, as under pip.
    """
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    dist = site / f"{project['name']}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    (dist / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items())
            for group, entries in project.get("entry-points", {}).items()
        )
    )
    with (site / "roots.txt").open("a") as roots:
        roots.write(f"{package.resolve()}\n")


def plugin_env(site: Path, cache: Path) -> dict[str, str]:
    """The environment of a process that sees what :func:`install` put in ``site``.

    This interpreter's scripts (``bat-gym``, ``pytest``) come first on the PATH, and the
    bat_gym cache is ``cache``: a benchmark made in a test has default states of its own.
    """
    listing = site / "roots.txt"
    roots = listing.read_text().split() if listing.exists() else []
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(site), *roots]),
        "BAT_GYM_CACHE": str(cache),
        "TOKENIZERS_PARALLELISM": "false",
    }
