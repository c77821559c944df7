"""What every trainer shares: device and precision choice, RNG state, atomic checkpoints.

A checkpoint is a directory ``OUT/checkpoints/step-00000042`` written under a temporary
name and renamed into place, so a process killed mid-save leaves either the previous
checkpoint or the new one, never half of one. Old ones are rotated out the same way
(rename, then delete).

Every trainer resumes the same way (:func:`load_resume_state`): the trainer state is
read with ``torch.load(weights_only=True)`` (a checkpoint is data, never code to run),
and the configuration it was saved with must match this run's, except for the fields
the trainer declares free on resume (paths, step counts, logging).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bat_gym.core.errors import ConfigError

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("bat_gym.trainers needs torch: pip install 'bat-gym[train]'") from exc

__all__ = [
    "resolve_device",
    "resolve_bf16",
    "rng_state",
    "set_rng_state",
    "CheckpointDir",
    "check_resumable",
    "load_resume_state",
    "publish",
    "remove",
]

_STEP = re.compile(r"^step-(\d{8})$")


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when present, else CPU) or a torch device string (``cuda:1``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_bf16(setting: str, device: torch.device) -> bool:
    """Whether to run forward passes under bf16 autocast on ``device``.

    ``auto``: on for CUDA devices with bf16 support, off elsewhere (CPU autocast is
    slow and lossy); ``on`` forces it (an error on a CUDA device without bf16);
    ``off`` never.
    """
    if setting == "off":
        return False
    supported = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if setting == "on":
        if device.type == "cuda" and not supported:
            raise ConfigError(f"bf16='on' but {device} does not support bf16; use 'auto' or 'off'")
        return True
    return supported


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) generator states, loadable with weights_only."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        # numpy's key array as a tensor keeps the file loadable with weights_only=True
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointDir:
    """The ``checkpoints/`` folder of a run: numbered, complete, rotated checkpoints.

    Args:
        output_dir: the run's output directory.
        marker: the file whose presence makes a checkpoint complete (written last).
        keep_last: how many checkpoints to keep (>= 1).
    """

    def __init__(self, output_dir: str | Path, *, marker: str, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ConfigError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(output_dir) / "checkpoints"
        self.marker = marker
        self.keep_last = keep_last

    def all(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as ``(step, path)``, oldest first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := _STEP.match(p.name))]
        return sorted((s, p) for s, p in found if (p / self.marker).is_file())

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.all()
        return found[-1][1] if found else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Write a checkpoint through ``write(tmp_dir)`` (marker file last), publish, rotate."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-step-{step:08d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write(tmp)
        if not (tmp / self.marker).is_file():
            raise RuntimeError(f"the checkpoint writer did not write {self.marker}")
        final = self.root / f"step-{step:08d}"
        publish(tmp, final)
        for _, old in self.all()[: -self.keep_last]:
            remove(old)
        return final

    def clean_partial(self) -> None:
        """Delete what a process killed mid-save or mid-delete left behind."""
        for kind in ("tmp", "trash"):
            for p in self.root.glob(f".{kind}-*") if self.root.is_dir() else []:
                shutil.rmtree(p, ignore_errors=True)


def remove(path: Path) -> None:
    """Delete a directory so that a crash never leaves half of it under its own name."""
    # Rename first: a crash during the slow delete leaves a `.trash-*` name, never a
    # half-deleted directory that still looks like a checkpoint.
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    path.rename(trash)
    shutil.rmtree(trash)


def publish(tmp: Path, final: Path) -> None:
    """Move a fully written directory into place (rename is atomic on one filesystem)."""
    if final.exists():
        remove(final)
    tmp.rename(final)


def check_resumable(
    saved: Mapping[str, Any], now: Mapping[str, Any], *, free: Collection[str], checkpoint: Path
) -> None:
    """Refuse to continue a checkpoint under settings that change the training math.

    Args:
        saved: the configuration the checkpoint was written with (``asdict(cfg)``).
        now: this run's configuration, the same way.
        free: fields a resumed run may change (paths, step counts, logging, devices).
        checkpoint: the checkpoint, for the message.

    Raises:
        ConfigError: naming each changed field with both values, and the fix.
    """
    changed = {k: (saved.get(k), now[k]) for k in now if k not in free and saved.get(k) != now[k]}
    if changed:
        diff = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in changed.items())
        raise ConfigError(
            f"cannot resume from {checkpoint}: {diff}. These settings change the training "
            "math; restore them or use a new output_dir"
        )


def load_resume_state(
    checkpoint: Path,
    marker: str,
    now: Mapping[str, Any],
    *,
    free: Collection[str],
    map_location: str | torch.device | None = None,
) -> dict[str, Any]:
    """The trainer state of ``checkpoint``, loaded safely and checked against this run.

    Args:
        checkpoint: a complete checkpoint directory (:meth:`CheckpointDir.latest`).
        marker: the trainer state file in it (``trainer_state.pt``).
        now: this run's configuration (``asdict(cfg)``).
        free: fields a resumed run may change (see :func:`check_resumable`).
        map_location: where tensors land (``torch.load``'s argument; None: where saved).

    Returns:
        The saved dict (its ``"config"`` included).

    Raises:
        ConfigError: the file is not a trainer state this code can read safely (no
            pickled objects beyond tensors and plain data), holds no configuration, or
            was saved under settings that differ from ``now``.
    """
    path = checkpoint / marker
    try:
        saved = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises several kinds for a bad file
        raise ConfigError(
            f"cannot resume from {checkpoint}: {marker} does not load as plain data and "
            f"tensors ({type(exc).__name__}: {str(exc)[:200]}); delete the checkpoint or use "
            "a new output_dir"
        ) from exc
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        raise ConfigError(
            f"cannot resume from {checkpoint}: {marker} holds no saved configuration; "
            "delete the checkpoint or use a new output_dir"
        )
    check_resumable(saved["config"], now, free=free, checkpoint=checkpoint)
    return saved
