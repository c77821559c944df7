"""The benchmark's default bank: built on first use into bat_gym's cache, then reused."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path

from bat_gym.bank.build import build_bank
from bat_gym.bank.store import BANK_FORMAT, StageBank
from bat_gym.benchmark import Benchmark
from bat_gym.files import cache_dir

__all__ = ["cache_dir", "default_bank", "package_digest"]


@functools.cache
def package_digest(module: str) -> str:
    """sha256 over the files of the package that defines ``module`` (its code and data).

    Bytecode caches are left out. A module outside any package digests its own file.
    """
    mod = sys.modules.get(module)
    path = Path(getattr(mod, "__file__", "") or "")
    if not path.is_file():
        return ""
    root = path.parent if getattr(mod, "__package__", None) else path
    files = sorted(root.rglob("*")) if root.is_dir() else [root]
    h = hashlib.sha256()
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(f"{f.relative_to(root.parent)}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def default_bank(bench: Benchmark) -> StageBank:
    """The benchmark's default bank, built on first use and cached.

    The small grid: one training task per track, every focus, and every teacher outcome
    the benchmark declares (for MedBench-Lite the reference 126-state grid), so the
    curriculum can balance a round over tracks and outcomes.

    Concurrent first uses (vector-env workers) wait on a lock; one builds.
    """
    from bat_gym import __version__

    # Rows pin contract digests, so an edited contract must not reuse an old bank; and
    # the states hold files the benchmark's code wrote, so edited code must not either.
    contracts = [ref.sha256 for f in bench.spec.focuses if (ref := bench.contract_ref(f))]
    code = package_digest(type(bench).__module__)
    key = hashlib.sha256(
        f"{bench.name}/{bench.spec.version}/{__version__}/{BANK_FORMAT}/{contracts}/"
        f"{bench.outcomes}/{code}".encode()
    ).hexdigest()[:12]
    root = cache_dir() / "banks" / f"{bench.name}-{key}"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "manifest.json").exists():
            with contextlib.suppress(Exception):
                return StageBank(root)
            shutil.rmtree(root, ignore_errors=True)
        tmp = root.with_name(root.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        build_bank(bench, tmp, outcomes=tuple(bench.outcomes))
        os.replace(tmp, root)
    return StageBank(root)
