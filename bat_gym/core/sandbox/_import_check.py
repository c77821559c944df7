"""Imports each module asked for; prints those that fail, one a line; exits 1 if any did.

Runs with a sandbox image's python, as code passed on the command line:
:func:`~bat_gym.core.sandbox.docker_image.import_check` reads this file as text and appends
the call of :func:`main` with the modules; the host never imports it. Standard library
only.
"""

import importlib


def main(modules: list[str]) -> int:
    """Import each of ``modules``; print each failure as ``name (Error: message)``.

    Returns:
        The exit status: 1 if any import failed, else 0.
    """
    bad = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            bad.append(f"{name} ({type(exc).__name__}: {exc})")
    print("\n".join(bad))
    return 1 if bad else 0
