"""Scaffold a benchmark plugin package: what ``bat-gym new-benchmark NAME`` writes.

The package is rendered from the template tree shipped in ``bat_gym/scaffold/template``,
real files that are valid Python, YAML, TOML and Markdown before rendering (so the
templates are linted and read like the code they become). Rendering does three things:

* ``__NAME__`` becomes the benchmark's name (in file names too) and ``__CLASS__`` its
  class name (``my_bench`` -> ``MyBench``);
* ``__S_<Stage>__`` (``__S_Submit__``) becomes the id of that stage in this package
  (``S2`` in a two-stage package);
* a block of lines that opens with a ``# [stage Plan]`` line (``<!-- [stage Plan] -->``
  in Markdown) and closes with ``# [end]`` is kept only when the package has that
  stage, without the marker lines. A file that renders empty is not written.

Stage names are the ones the ``bat/<Name>-v0`` env ids use (:data:`STAGE_ENV_NAMES`),
so every stage of a scaffolded benchmark has its env id.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from bat_gym.core.errors import ConfigError
from bat_gym.core.stages import REFERENCE_STAGE_NAMES

__all__ = ["STAGE_SETS", "TEMPLATE", "Scaffold", "new_benchmark", "render_text"]

TEMPLATE = Path(__file__).with_name("template")

#: The stages of a package of N stages, in order. Setup (write the pipeline) and Submit
#: (run it on every case) make the smallest staged benchmark; more stages add a pilot
#: (Validate), a plan (Plan), then a separate full run (Infer).
STAGE_SETS: dict[int, tuple[str, ...]] = {
    2: ("Setup", "Submit"),
    3: ("Setup", "Validate", "Submit"),
    4: ("Plan", "Setup", "Validate", "Submit"),
    5: REFERENCE_STAGE_NAMES,
}
_ALL_STAGES = STAGE_SETS[5]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_OPEN = re.compile(r"^\s*(?:#|<!--)\s*\[stage (\w+)\]\s*(?:-->)?\s*$")
_CLOSE = re.compile(r"^\s*(?:#|<!--)\s*\[end\]\s*(?:-->)?\s*$")
_SKIPPED = ("__pycache__", ".pyc", ".ruff_cache", ".pytest_cache")


@dataclass(frozen=True)
class Scaffold:
    """What :func:`new_benchmark` wrote.

    Attributes:
        name: the benchmark's name (also its Python package and entry point name).
        root: the package directory.
        stages: ``(id, name)`` of each stage, in order.
        files: the files written, relative to ``root``.
    """

    name: str
    root: Path
    stages: tuple[tuple[str, str], ...]
    files: tuple[str, ...]

    @property
    def env_ids(self) -> tuple[str, ...]:
        """The env ids that serve this benchmark: one per stage, then E2E."""
        return (*(f"bat/{name}-v0" for _, name in self.stages), "bat/E2E-v0")


def check_name(name: str) -> None:
    """Refuse a name that cannot be a benchmark, package and entry point name at once.

    Raises:
        ConfigError: the name is not a lowercase Python identifier, is a keyword, is
            already an installed benchmark, or is already an importable module.
    """
    if not _NAME.match(name) or not name.isidentifier():
        raise ConfigError(
            f"{name!r} is not a benchmark name: use a lowercase Python identifier "
            "(letters, digits, underscores, starting with a letter), e.g. my_bench"
        )
    if keyword.iskeyword(name):
        raise ConfigError(f"{name!r} is a Python keyword; choose another name")
    from bat_gym.catalog import list_benchmarks

    if name in list_benchmarks():
        raise ConfigError(f"a benchmark named {name!r} is already installed; choose another name")
    if importlib.util.find_spec(name) is not None:
        raise ConfigError(
            f"{name!r} is already an importable module here; choose another name, or the "
            "package would shadow it (or be shadowed)"
        )


def render_text(text: str, name: str, stages: tuple[str, ...]) -> str:
    """One template file's text, rendered for benchmark ``name`` with ``stages``.

    Raises:
        ConfigError: a stage block that is not closed, nested, or names no stage.
    """
    out: list[str] = []
    keep: bool | None = None  # None: outside every block
    for n, line in enumerate(text.splitlines(keepends=True), start=1):
        opened, closed = _OPEN.match(line), _CLOSE.match(line)
        if opened:
            if keep is not None or opened.group(1) not in _ALL_STAGES:
                raise ConfigError(f"template line {n}: a nested or unknown stage block")
            keep = opened.group(1) in stages
        elif closed:
            if keep is None:
                raise ConfigError(f"template line {n}: [end] without a stage block")
            keep = None
        elif keep is not False:
            out.append(line)
    if keep is not None:
        raise ConfigError("template: a stage block is not closed with [end]")
    rendered = "".join(out)
    for i, stage in enumerate(stages, start=1):
        rendered = rendered.replace(f"__S_{stage}__", f"S{i}")
    left = re.findall(r"__S_\w+?__", rendered)
    if left:
        raise ConfigError(f"template: {sorted(set(left))} name stages outside their blocks")
    camel = "".join(part.capitalize() for part in name.split("_"))
    return rendered.replace("__NAME__", name).replace("__CLASS__", camel)


def new_benchmark(name: str, out: str | Path | None = None, *, stages: int = 2) -> Scaffold:
    """Write a working benchmark plugin package for ``name``.

    Args:
        name: the benchmark's name, a lowercase Python identifier.
        out: the package directory to create (default: ``./NAME``); it must not exist,
            or be empty.
        stages: how many stages, 2 to 5 (see :data:`STAGE_SETS`).

    Returns:
        What was written.

    Raises:
        ConfigError: a bad name, a stage count out of range, or ``out`` is not empty.
    """
    if stages not in STAGE_SETS:
        raise ConfigError(
            f"--stages must be between {min(STAGE_SETS)} and {max(STAGE_SETS)}, got {stages}: "
            "stage names are the env ids' (bat/Plan-v0 .. bat/Submit-v0)"
        )
    root = Path(out) if out is not None else Path(name)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"{root} already exists; choose another --out or remove it")
    check_name(name)
    chosen = STAGE_SETS[stages]
    written: list[str] = []
    for source in sorted(TEMPLATE.rglob("*")):
        rel = source.relative_to(TEMPLATE)
        if source.is_dir() or any(part.endswith(_SKIPPED) for part in rel.parts):
            continue
        text = render_text(source.read_text(encoding="utf-8"), name, chosen)
        if not text.strip():
            continue  # a file of a stage this package does not have
        target = root / Path(*(part.replace("__NAME__", name) for part in rel.parts))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target.relative_to(root).as_posix())
    return Scaffold(
        name=name,
        root=root,
        stages=tuple((f"S{i}", s) for i, s in enumerate(chosen, start=1)),
        files=tuple(written),
    )
