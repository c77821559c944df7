"""What of a benchmark's held-out tasks must never reach training data, as digests.

A Stage Bank is built from training seeds only. Two places check that claim against
bytes: the admission gates of a build (:class:`~bat_gym.bank.Admission`, row by row,
through a :class:`HeldOutIndex`) and the audit of a finished bank
(:func:`bat_gym.audits.leakage.audit_bank`). Both fingerprint the same things, defined here: a
held-out task's id, each of its public files (sha256), and its private answers
(:func:`answer_fingerprints`). The held-out tasks are those an evaluation plays
(:meth:`~bat_gym.benchmark.Benchmark.evaluated_seeds`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bat_gym.benchmark import Benchmark
from bat_gym.core.spec import Task

__all__ = [
    "MIN_ANSWER_BYTES",
    "HeldOutIndex",
    "answer_fingerprints",
    "heldout_task_ids",
    "public_file_digests",
    "task_fingerprints",
]

MIN_ANSWER_BYTES = 16
"""Answer values with fewer canonical bytes are not fingerprinted (a lone ``0`` matches
too much to mean anything)."""
_MAX_ID_SEEDS = 10_000  # ids are cheap hashes; check this many held-out seeds per track


def _canonical(value: Any) -> Iterator[bytes]:
    """The canonical byte forms of an answer value, and of every value inside it."""
    if isinstance(value, np.ndarray):
        yield np.ascontiguousarray(value).tobytes()
        return
    if isinstance(value, dict):
        for v in value.values():
            yield from _canonical(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _canonical(v)
    yield json.dumps(value, sort_keys=True, separators=(",", ":"), default=_jsonable).encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def answer_fingerprints(answers: dict[str, Any]) -> set[str]:
    """sha256 of the canonical bytes of each answer value (nested) and of the whole dict.

    Values whose bytes are shorter than :data:`MIN_ANSWER_BYTES` are left out.
    """
    return {
        hashlib.sha256(b).hexdigest() for b in _canonical(answers) if len(b) >= MIN_ANSWER_BYTES
    }


def public_file_digests(bench: Benchmark, task: Task) -> dict[str, str]:
    """``{path: sha256}`` of the task's public files."""
    with tempfile.TemporaryDirectory(prefix="bat-gym-audit-") as tmp:
        bench.write_public_files(task, Path(tmp))
        return {
            str(p.relative_to(tmp)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(tmp).rglob("*"))
            if p.is_file()
        }


def heldout_task_ids(bench: Benchmark) -> dict[str, str]:
    """``{task id: "track/heldout seed N"}`` of the first held-out seeds of every track.

    Ids are cheap hashes, so up to ``_MAX_ID_SEEDS`` seeds per track are covered.
    """
    seeds = list(bench.seeds("heldout"))[:_MAX_ID_SEEDS]
    return {
        bench.task_id(t.name, s, "heldout"): f"{t.name}/heldout seed {s}"
        for t in bench.spec.tracks
        for s in seeds
    }


def task_fingerprints(bench: Benchmark, task: Task) -> set[str]:
    """sha256 of each of ``task``'s public files, and its answer fingerprints."""
    return set(public_file_digests(bench, task).values()) | answer_fingerprints(
        bench.private_answers(task)
    )


@dataclass(frozen=True)
class HeldOutIndex:
    """What a single bank row may not contain: held-out task ids and content digests.

    Built once per bank build (generating the evaluated held-out tasks is the costly
    part) and consulted for every row the build admits.

    Attributes:
        task_ids: held-out task id -> ``"track/heldout seed N"``.
        digests: sha256 of a held-out public file or answer fingerprint -> where it is
            from (``"<task id>:<path>"`` or ``"<task id>:answer"``).
    """

    task_ids: dict[str, str]
    digests: dict[str, str]

    @classmethod
    def of(cls, bench: Benchmark, *, tracks: Sequence[str] | None = None) -> HeldOutIndex:
        """Regenerate ``bench``'s evaluated held-out tasks and fingerprint them.

        The tasks are the ones :func:`~bat_gym.audits.leakage.audit_bank` checks: the first
        ``splits.heldout_repeats`` held-out seeds of every track (of ``tracks`` only,
        when given; task ids always cover every track, they cost nothing).
        """
        tracks = list(tracks or [t.name for t in bench.spec.tracks])
        eval_seeds = bench.evaluated_seeds()
        digests: dict[str, str] = {}
        for track in tracks:
            for seed in eval_seeds:
                task = bench.make_task(track, seed, "heldout")
                for rel, digest in public_file_digests(bench, task).items():
                    digests.setdefault(digest, f"{task.task_id}:{rel}")
                for digest in answer_fingerprints(bench.private_answers(task)):
                    digests.setdefault(digest, f"{task.task_id}:answer")
        return cls(task_ids=heldout_task_ids(bench), digests=digests)

    def leaks(self, digests: Iterable[str], shared: set[str]) -> dict[str, str]:
        """The held-out ones among ``digests`` (digest -> where from), ``shared`` aside.

        ``shared`` is content shared by design: as :func:`~bat_gym.audits.leakage.audit_bank` excludes what the
        bank's own training tasks hold, a row is judged against its own task's
        fingerprints (:func:`task_fingerprints`): the same model code or a card
        variant in a held-out task is not a leak.
        """
        return {d: self.digests[d] for d in digests if d in self.digests and d not in shared}
