"""Without the openenv extra, `bat-gym serve openenv` names the extra to install."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BAT_GYM = str(Path(sys.executable).parent / "bat-gym")


@pytest.mark.skipif(
    importlib.util.find_spec("openenv") is not None,
    reason="openenv is installed here (its tests are tests/integrations/test_openenv.py)",
)
def test_serve_openenv_names_its_extra() -> None:
    done = subprocess.run(
        [BAT_GYM, "serve", "openenv", "--port", "8000"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "[openenv]" in done.stderr and "pip install" in done.stderr
