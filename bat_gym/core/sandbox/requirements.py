"""What a benchmark's sandbox must be able to import, and where each backend gets it.

A benchmark declares, through :meth:`bat_gym.benchmark.Benchmark.sandbox_requirements`,
the python modules that code running *inside* its sandbox imports: the pipelines its
teacher writes, the scripts and model files among its public files, the libraries its
skills tell an agent to use. A backend that cannot provide them refuses to start with
:class:`~bat_gym.core.errors.SandboxUnavailable`, naming the missing modules and the fix,
rather than letting every episode fail at its first import and be scored as the
model's failure.

* ``local``: agent code runs this interpreter (bound read-only into the sandbox), so
  every module must be importable here. Checked once per process
  (:meth:`SandboxRequirements.check_host`); the fix is ``pip install``.
* ``docker``: the image is built with :attr:`~SandboxRequirements.debian` packages
  (``debootstrap --include``) plus the pure-Python :attr:`~SandboxRequirements.from_host`
  distributions copied from this interpreter; its tag encodes the set
  (:func:`bat_gym.core.sandbox.docker_image.ensure_image`). The fix is to build it.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import threading
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bat_gym.core.errors import SandboxUnavailable

__all__ = [
    "DEFAULT_REQUIREMENTS",
    "SandboxRequirements",
]

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_DEBIAN = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1
_DISTRIBUTION = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508 names
_PIP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~ ]*")


def _normalized(values: Iterable[str], pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    out = set()
    for value in values:
        value = value.strip()
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        out.add(value)
    return tuple(sorted(out))


class SandboxRequirements(BaseModel):
    """The modules code inside a sandbox imports, and the packages that provide them.

    Every field is a set, kept sorted: two requirements that ask for the same things
    are equal whatever order they were written in. Combine several with ``|``.

    Example (close to MedBench-Lite's)::

        SandboxRequirements(
            modules=("numpy", "PIL", "pydicom.pixels"),
            pip=("numpy", "Pillow>=10", "pydicom>=3"),
            debian=("python3-numpy", "python3-pil"),
            from_host=("pydicom",),  # Debian bookworm's pydicom is 2.3, without pydicom.pixels
        )

    A ``from_host`` distribution's own dependencies are not followed: list the pure-Python
    ones too, or the Debian packages that provide them (the build checks that every
    module imports).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    modules: tuple[str, ...] = Field(
        (),
        description="Import names that must import inside the sandbox, e.g. 'nibabel' or "
        "'PIL'. A submodule ('pydicom.pixels') also requires a version that has it.",
    )
    pip: tuple[str, ...] = Field(
        (),
        description="pip requirements that provide the modules in the host interpreter "
        "(what the local backend's refusal tells you to install), e.g. 'Pillow>=10'.",
    )
    debian: tuple[str, ...] = Field(
        (),
        description="Debian bookworm packages the docker image includes, e.g. 'python3-nibabel'.",
    )
    from_host: tuple[str, ...] = Field(
        (),
        description="Pure-Python distributions (pip names) the docker image copies from "
        "this interpreter, at the version installed here: for modules Debian bookworm "
        "lacks, or ships too old.",
    )

    @field_validator("modules", mode="before")
    @classmethod
    def _modules(cls, v: Iterable[str]) -> tuple[str, ...]:
        return _normalized(_strings(v), _MODULE, "python module name")

    @field_validator("pip", mode="before")
    @classmethod
    def _pip(cls, v: Iterable[str]) -> tuple[str, ...]:
        return _normalized(_strings(v), _PIP, "pip requirement")

    @field_validator("debian", mode="before")
    @classmethod
    def _debian(cls, v: Iterable[str]) -> tuple[str, ...]:
        return _normalized(_strings(v), _DEBIAN, "Debian package name")

    @field_validator("from_host", mode="before")
    @classmethod
    def _from_host(cls, v: Iterable[str]) -> tuple[str, ...]:
        return _normalized(_strings(v), _DISTRIBUTION, "distribution name")

    @property
    def pip_names(self) -> tuple[str, ...]:
        """The distribution name of each :attr:`pip` requirement (``'Pillow>=10'``: ``Pillow``)."""
        return tuple(_DISTRIBUTION.match(spec).group(0) for spec in self.pip)  # type: ignore[union-attr]

    def __or__(self, other: SandboxRequirements) -> SandboxRequirements:
        """Everything either asks for."""
        if not isinstance(other, SandboxRequirements):
            return NotImplemented
        return SandboxRequirements(
            **{f: (*getattr(self, f), *getattr(other, f)) for f in type(self).model_fields}
        )

    @classmethod
    def union(cls, requirements: Iterable[SandboxRequirements]) -> SandboxRequirements:
        """Everything any of ``requirements`` asks for (nothing, for none)."""
        out = cls()
        for r in requirements:
            out = out | r
        return out

    # -- the local backend --------------------------------------------------------------

    def missing_on_host(self) -> tuple[str, ...]:
        """The modules this interpreter cannot import; each is looked up once per process."""
        return tuple(m for m in self.modules if not _found_on_host(m))

    def check_host(self, backend: str = "local") -> None:
        """Refuse when this interpreter, the one agent code runs, lacks a module.

        Raises:
            SandboxUnavailable: naming the missing modules and the ``pip install`` that
                provides them.
        """
        missing = self.missing_on_host()
        if not missing:
            return
        install = " ".join(shlex.quote(p) for p in self.pip) or " ".join(
            m.split(".")[0] for m in missing
        )
        raise SandboxUnavailable(
            backend,
            f"agent code runs this interpreter ({sys.executable}), which cannot import "
            f"{', '.join(missing)}, needed by the benchmark's sandbox code; install them "
            f"with `{sys.executable} -m pip install {install}`",
        )


def _strings(v: Iterable[str] | str) -> Iterable[str]:
    if isinstance(v, str):  # a bare string would be read as its characters
        return (v,)
    return v


DEFAULT_REQUIREMENTS = SandboxRequirements(
    modules=("numpy",), pip=("numpy",), debian=("python3-numpy",)
)
"""What a benchmark gets unless it says otherwise: numpy, as the base image always had."""

_found: dict[str, bool] = {}
_found_lock = threading.Lock()


def _found_on_host(module: str) -> bool:
    with _found_lock:
        if module not in _found:
            try:
                # A submodule's lookup imports its parent package; a top-level one imports
                # nothing.
                _found[module] = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                _found[module] = False
        return _found[module]
