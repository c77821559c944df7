"""Run directories read into view models: evaluations, Stage Banks, GRPO and BiCuRL runs.

The viewer reads what the library writes and never writes there:

* an evaluation (``bat-gym eval --out DIR``): ``manifest.json``, ``report.json``,
  ``cells/<key>.json`` and the traces ``episodes/<key>.json``
  (:mod:`bat_gym.evaluation.episodes`); held-out, so the evaluation side of the
  firewall;
* a Stage Bank (``bat-gym bank build --out DIR``): ``manifest.json`` and ``rows.jsonl``;
* a GRPO run (``bat-gym train grpo --out DIR``): ``metrics.jsonl`` and the rollout
  sample ``rollouts/step_NNNNNN.jsonl``;
* a BiCuRL run (``bat-gym loop --out DIR``): ``loop_state.json``, whose evaluations
  and GRPO rounds are opened as runs of their own;
* a study (``bat-gym study run --out DIR``): ``study.json`` and ``results.json``, whose
  units' training runs and evaluations are opened as runs of their own.

Everything is read lazily and cached: an overview reads one or two small files, an
episode page one trace, a GRPO page one step's file.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bat_gym.core.errors import BatGymError
from bat_gym.evaluation.episodes import VERDICT_KEY

__all__ = ["RunKind", "Run", "ViewerError", "detect_kind", "load_runs"]

RunKind = Literal["eval", "bank", "grpo", "loop", "study"]
_STEP_FILE = re.compile(r"^step_(\d{6,})\.jsonl$")


class ViewerError(BatGymError):
    """A path the viewer cannot show, with what it expected there."""


def detect_kind(path: Path) -> RunKind | None:
    """Which kind of run directory ``path`` is, by the files in it; None if none."""
    if (path / "study.json").is_file() and (path / "units").is_dir():
        return "study"
    if (path / "loop_state.json").is_file():
        return "loop"
    if (path / "rows.jsonl").is_file() and (path / "manifest.json").is_file():
        return "bank"
    if (path / "cells").is_dir() or (path / "report.json").is_file():
        return "eval"
    if (path / "metrics.jsonl").is_file() or (path / "rollouts").is_dir():
        return "grpo"
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise ViewerError(f"{path} is not valid JSON ({exc}); was it written whole?") from None


@dataclass(eq=False)
class Run:
    """One run directory and what the viewer knows of it.

    Attributes:
        id: the run's id in URLs and file names (``r0``, ``r1``, ...).
        kind: what wrote it.
        path: the directory.
        title: a one-line name for it.
        parent: the id of the run that holds it (a loop's evaluations), or None.
    """

    id: str
    kind: RunKind
    path: Path
    title: str = ""
    parent: str | None = None
    children: list[str] = field(default_factory=list)

    # ---------------------------------------------------------------- evaluation
    @property
    def heldout(self) -> bool:
        """An evaluation: the evaluation side of the firewall (held-out tasks)."""
        return self.kind == "eval"

    @functools.cached_property
    def report(self) -> dict[str, Any]:
        """``report.json``, or one put together from ``cells/`` and ``manifest.json``."""
        report = _read_json(self.path / "report.json")
        if report is not None:
            return report
        cells = [_read_json(p) for p in sorted((self.path / "cells").glob("*.json"))]
        return {
            "manifest": _read_json(self.path / "manifest.json") or {},
            "aggregates": None,
            "intervals": {},
            "cells": [c for c in cells if c is not None],
        }

    @property
    def cells(self) -> list[dict[str, Any]]:
        """The evaluation's cell results (``CellResult`` as JSON), in run order."""
        return list(self.report.get("cells") or [])

    def cell(self, key: str) -> dict[str, Any] | None:
        """The result of the cell ``key``."""
        return next((c for c in self.cells if _key(c) == key), None)

    def episode(self, key: str) -> dict[str, Any] | None:
        """The trace of the cell ``key``, None when the run kept none."""
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", key):
            return None
        return _read_json(self.path / "episodes" / f"{key}.json")

    def verdict(self, key: str) -> dict[str, Any] | None:
        """The verdict of the cell ``key``'s trace, parsed from the head of the file.

        Traces write the verdict before their long fields (messages, record, files), so
        a comparison of 70 cells parses a few KiB each instead of whole traces; a trace
        laid out otherwise is read whole.
        """
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", key):
            return None
        path = self.path / "episodes" / f"{key}.json"
        try:
            with path.open(encoding="utf-8") as f:
                head = f.read(1 << 16)
                at = head.find(VERDICT_KEY)
                if at < 0 or '"messages": ' in head[:at]:
                    return (self.episode(key) or {}).get("verdict")
                decoder = json.JSONDecoder()
                while True:
                    try:
                        return decoder.raw_decode(head, at + len(VERDICT_KEY))[0]
                    except json.JSONDecodeError:
                        more = f.read(1 << 16)
                        if not more:
                            return (self.episode(key) or {}).get("verdict")
                        head += more
        except FileNotFoundError:
            return None

    def blob(self, sha256: str) -> bytes | None:
        """A file content kept beside the traces, by sha256."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            return None
        for where in (self.path / "episodes" / "blobs",):
            p = where / sha256
            if p.is_file():
                return p.read_bytes()
        return None

    # ---------------------------------------------------------------- bank
    @functools.cached_property
    def manifest(self) -> dict[str, Any]:
        """``manifest.json`` (evaluation or bank)."""
        return _read_json(self.path / "manifest.json") or {}

    @functools.cached_property
    def rows(self) -> list[dict[str, Any]]:
        """A bank's rows (``StageState`` as JSON), in file order."""
        out = []
        with (self.path / "rows.jsonl").open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    out.append(json.loads(line))
        return out

    def trajectories(self) -> dict[str, list[dict[str, Any]]]:
        """A bank's rows grouped per teacher trajectory (``task_id/outcome``), by prefix length."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in self.rows:
            groups.setdefault(f"{row['task_id']}.{row.get('outcome', 'success')}", []).append(row)
        for rows in groups.values():
            rows.sort(key=lambda r: len(r["messages"]))
        return groups

    # ---------------------------------------------------------------- grpo
    @functools.cached_property
    def metrics(self) -> list[dict[str, Any]]:
        """A GRPO run's ``metrics.jsonl``, one record per step."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]

    def rollout_steps(self) -> list[int]:
        """Steps with a kept rollout sample, ascending (a directory listing; no file read)."""
        folder = self.path / "rollouts"
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))

    def rollouts(self, step: int) -> list[dict[str, Any]]:
        """The kept rollouts of ``step`` (one file read)."""
        path = self.path / "rollouts" / f"step_{step:06d}.jsonl"
        if not path.is_file():
            return []
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    # ---------------------------------------------------------------- loop
    @functools.cached_property
    def loop_state(self) -> dict[str, Any]:
        """A BiCuRL run's ``loop_state.json``."""
        return _read_json(self.path / "loop_state.json") or {}

    @functools.cached_property
    def study_results(self) -> dict[str, Any]:
        """A study's ``results.json`` (empty before its first unit finished)."""
        return _read_json(self.path / "results.json") or {}

    def round_eval(self, record: dict[str, Any]) -> Path:
        """The candidate evaluation of a loop round (``evals/round-NN`` in the run).

        The state records the path as the loop was given it (maybe relative to where it
        ran), so the run's own layout is tried first.
        """
        own = self.path / "evals" / f"round-{int(record.get('round', 0)):02d}"
        recorded = Path(record.get("eval") or own)
        return own if own.is_dir() or not recorded.is_dir() else recorded.resolve()


def _key(cell_result: dict[str, Any]) -> str:
    c = cell_result["cell"]
    return f"{c['track']}-{c['seed']}-r{c['repeat']}"


def _title(run: Run) -> str:
    if run.kind == "eval":
        m = run.report.get("manifest") or {}
        policy = (m.get("policy") or {}).get("name", "?")
        bench = (m.get("benchmark") or {}).get("name", "?")
        return f"{bench} evaluation of {policy}"
    if run.kind == "bank":
        return f"Stage Bank of {run.manifest.get('benchmark', '?')}"
    if run.kind == "grpo":
        return "GRPO run"
    if run.kind == "study":
        return f"Study {(_read_json(run.path / 'study.json') or {}).get('name', '?')}"
    return "BiCuRL run"


def load_runs(paths: list[str | Path]) -> list[Run]:
    """The runs at ``paths``, with a loop's evaluations and GRPO rounds added after it.

    Raises:
        ViewerError: a path is missing or holds no run the viewer knows.
    """
    runs: list[Run] = []
    seen: set[Path] = set()

    def add(path: Path, parent: Run | None, title: str | None = None) -> Run | None:
        path = path.resolve()
        kind = detect_kind(path)
        if kind is None or path in seen:
            return None
        seen.add(path)
        run = Run(id=f"r{len(runs)}", kind=kind, path=path, parent=parent and parent.id)
        run.title = title or _title(run)
        runs.append(run)
        if parent is not None:
            parent.children.append(run.id)
        return run

    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ViewerError(f"{path}: no such directory; give a run directory to view")
        if detect_kind(path) is None:
            raise ViewerError(
                f"{path} holds no run the viewer knows: an evaluation (bat-gym eval --out), "
                "a Stage Bank (bat-gym bank build --out), a GRPO run (bat-gym train grpo "
                "--out) or a BiCuRL run (bat-gym loop --out)"
            )
        run = add(path, None)
        if run is not None and run.kind == "study":
            # Each unit's training run (GRPO or BiCuRL) and its held-out evaluation.
            for unit in sorted((path / "units").glob("*/seed-*")):
                name = f"{unit.parent.name} {unit.name.replace('-', ' ')}"
                add(unit / "train", run, f"{name} training")
                add(unit / "eval", run, f"{name} evaluation")
            continue
        if run is None or run.kind != "loop":
            continue
        state = run.loop_state
        add(path / "evals" / "start", run, "start evaluation")
        for r in state.get("rounds", []):
            i = int(r.get("round", 0))
            add(path / "rounds" / f"round-{i:02d}" / "grpo", run, f"round {i} GRPO")
            add(run.round_eval(r), run, f"round {i} candidate evaluation")
        # A round still training is not in the state yet: its GRPO run is shown already.
        for grpo in sorted((path / "rounds").glob("round-*/grpo")):
            add(grpo, run, f"{grpo.parent.name.replace('-', ' ')} GRPO (training)")
    return runs
