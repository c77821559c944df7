"""Units of a study: one folder per piece of work, cached, resumable, safe across processes.

A unit's folder holds::

    unit.json     what the unit is (its settings); a rerun with other settings is refused
    lock          held (``flock``) while a process works on the unit
    ...           the work's own files (a training run resumes from its checkpoints)
    metrics.json  the unit's figures, written atomically when the work is done
    DONE          the done marker, written atomically after ``metrics.json``

A finished unit (``DONE`` present) is never run again; an unfinished one (killed
midway: no marker) is run again, and its work resumes where it can (GRPO from its
last checkpoint, BiCuRL from its loop state, an evaluation from its finished cells).
Two processes never work on one unit: the second finds it locked and skips it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bat_gym.core.errors import BatGymError, ConfigError
from bat_gym.core.files import write_atomic

__all__ = ["Unit", "UnitBusy", "UnitOutcome", "run_unit"]

DONE_FILE = "DONE"
METRICS_FILE = "metrics.json"
SETTINGS_FILE = "unit.json"


class UnitBusy(BatGymError):
    """Another process holds the unit's lock (it is working on it now)."""


@dataclass(frozen=True)
class Unit:
    """One unit's folder and what it is."""

    path: Path
    settings: dict[str, Any]
    """What the unit is; JSON-able. A folder made with other settings is refused."""

    @property
    def done(self) -> bool:
        """True when the unit finished (its marker is written)."""
        return (self.path / DONE_FILE).is_file()

    def metrics(self) -> dict[str, Any]:
        """The finished unit's figures."""
        return json.loads((self.path / METRICS_FILE).read_text(encoding="utf-8"))

    def check_settings(self) -> None:
        """Write ``unit.json`` on first use; refuse a folder made with other settings.

        Raises:
            ConfigError: the folder holds a unit with other settings, naming them.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        wanted = json.loads(json.dumps(self.settings))
        path = self.path / SETTINGS_FILE
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
            if changed:
                raise ConfigError(
                    f"{self.path} holds a unit run with other {', '.join(changed)}; rerun with "
                    "the same study file, or use a new --out (or delete that unit's folder)"
                )
            return
        write_atomic(path, json.dumps(wanted, indent=1, sort_keys=True) + "\n")

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the unit's lock for the block.

        Raises:
            UnitBusy: another process holds it.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise UnitBusy(
                    f"{self.path} is being worked on by another process; wait for it, or run "
                    "the other units meanwhile"
                ) from exc
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def finish(self, metrics: dict[str, Any]) -> None:
        """Write the figures, then the marker (each atomically: a reader sees all or none)."""
        write_atomic(self.path / METRICS_FILE, json.dumps(metrics, indent=1, default=str) + "\n")
        write_atomic(self.path / DONE_FILE, "done\n")


UnitOutcome = Literal["ran", "skipped", "busy"]
"""``ran``: the work ran now; ``skipped``: finished before; ``busy``: locked elsewhere."""


def run_unit(unit: Unit, work: Callable[[Path], dict[str, Any]]) -> UnitOutcome:
    """Run ``work(unit.path)`` unless the unit is done or busy; mark it done after.

    Args:
        unit: the unit.
        work: does the unit's work in its folder (resuming what it finds there) and
            returns its metrics.
    """
    if unit.done:
        return "skipped"
    unit.check_settings()
    try:
        with unit.lock():
            if unit.done:  # finished by another process while this one waited
                return "skipped"
            unit.finish(work(unit.path))
    except UnitBusy:
        return "busy"
    return "ran"
