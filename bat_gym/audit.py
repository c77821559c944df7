"""Leakage audit: measure that no held-out content is in a Stage Bank.

A bank is built from training seeds only; this module checks that claim against the
bank's bytes rather than trusting the builder. It regenerates the benchmark's
held-out tasks and looks for four kinds of leak:

``task ids``
    a held-out task id in a row (its ``task_id``, any message) or in any blob, and a
    row whose provenance names a held-out split or seed.
``public files``
    a held-out task's public file stored byte for byte as a blob.
``answers``
    a held-out private answer (each array or value, and the whole answer dict) whose
    canonical bytes (raw C-order array bytes, or canonical JSON) are stored as a blob.
``8-grams``
    a word 8-gram of a held-out task card (``task.card`` and its ``TASK.md``) that is
    also in a bank prompt.

Content that every task shares by design is not a leak and is excluded: public files
that are byte-identical in the bank's own training tasks (a track's model code, for
instance), and 8-grams that also occur in the benchmark's boilerplate (stage skills and
system prompts, and the user prompts and ``TASK.md`` of the bank's training tasks). What
is left is what the held-out tasks alone say. Answers shorter than
:data:`MIN_ANSWER_BYTES` are not fingerprinted (a lone ``0`` matches too much to mean
anything). Limits: answers are matched as whole blobs, so an answer embedded inside a
larger file (an image format with a header) is not detected.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bat_gym import progress
from bat_gym.bank import BankReport, StageBank
from bat_gym.benchmark import Benchmark
from bat_gym.spec import Task

__all__ = [
    "MIN_ANSWER_BYTES",
    "NGRAM",
    "HeldOutIndex",
    "audit_bank",
    "answer_fingerprints",
    "heldout_task_ids",
    "task_fingerprints",
    "word_ngrams",
]

NGRAM = 8
MIN_ANSWER_BYTES = 16
_MAX_ID_SEEDS = 10_000  # ids are cheap hashes; check this many held-out seeds per track
_ID_PATTERN = re.compile(rb"[A-Za-z0-9_]+-[0-9a-f]{12}")
_WORD = re.compile(r"[a-z0-9_]+")


def word_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The lower-cased word ``n``-grams of ``text``."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


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


def _public_files(bench: Benchmark, task: Task) -> dict[str, str]:
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
    return set(_public_files(bench, task).values()) | answer_fingerprints(
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

        The tasks are the ones :func:`audit_bank` checks: the first
        ``splits.heldout_repeats`` held-out seeds of every track (of ``tracks`` only,
        when given; task ids always cover every track, they cost nothing).
        """
        tracks = list(tracks or [t.name for t in bench.spec.tracks])
        eval_seeds = bench.evaluated_seeds()
        digests: dict[str, str] = {}
        for track in tracks:
            for seed in eval_seeds:
                task = bench.make_task(track, seed, "heldout")
                for rel, digest in _public_files(bench, task).items():
                    digests.setdefault(digest, f"{task.task_id}:{rel}")
                for digest in answer_fingerprints(bench.private_answers(task)):
                    digests.setdefault(digest, f"{task.task_id}:answer")
        return cls(task_ids=heldout_task_ids(bench), digests=digests)

    def leaks(self, digests: Iterable[str], shared: set[str]) -> dict[str, str]:
        """The held-out ones among ``digests`` (digest -> where from), ``shared`` aside.

        ``shared`` is content shared by design: as :func:`audit_bank` excludes what the
        bank's own training tasks hold, a row is judged against its own task's
        fingerprints (:func:`task_fingerprints`): the same model code or a card
        variant in a held-out task is not a leak.
        """
        return {d: self.digests[d] for d in digests if d in self.digests and d not in shared}


def _task_text(bench: Benchmark, task: Task) -> str:
    """The task's card as the agent reads it: ``task.card`` and ``TASK.md``."""
    with tempfile.TemporaryDirectory(prefix="bat-gym-audit-") as tmp:
        bench.write_public_files(task, Path(tmp))
        md = Path(tmp) / "TASK.md"
        return task.card + "\n" + (md.read_text(errors="replace") if md.is_file() else "")


def _prompt_text(bank: StageBank) -> Iterable[tuple[str, str]]:
    for row in bank:
        for i, m in enumerate(row.messages):
            yield (
                f"{row.state_id}/messages[{i}]",
                f"{m.get('content') or ''} {m.get('tool_calls') or ''}",
            )


def audit_bank(bank: StageBank, bench: Benchmark | None = None) -> BankReport:
    """Audit ``bank`` for held-out content of ``bench`` (default: the one it names).

    Progress (the held-out tasks regenerated, then each check's pass over them) goes to
    the current reporter (:mod:`bat_gym.progress`).

    Returns:
        A report with one line per check; ``report.ok`` is False on any finding.
    """
    if bench is None:
        from bat_gym.registry import get_benchmark

        bench = get_benchmark(bank.manifest["benchmark"])
    with progress.task(f"auditing {len(bank)} states", 5) as shown:
        return _audit(bank, bench, shown)


def _audit(bank: StageBank, bench: Benchmark, shown: progress.ProgressTask) -> BankReport:
    shown.describe("audit: regenerating the evaluated held-out tasks")
    report = BankReport("audit")
    tracks = [t.name for t in bench.spec.tracks]
    heldout_seeds = bench.seeds("heldout")
    eval_seeds = bench.evaluated_seeds()
    heldout = [bench.make_task(t, s, "heldout") for t in tracks for s in eval_seeds]
    train = {
        (row.track, row.provenance["seed"])
        for row in bank
        if row.provenance.get("split") == "train" and "seed" in row.provenance
    }
    train_tasks = [bench.make_task(t, s, "train") for t, s in sorted(train)]
    blobs = {p.parent.name + p.name: p for p in (bank.store.root / "blobs").glob("*/*")}

    shown.advance()

    # -- task ids and seeds ----------------------------------------------------------
    shown.describe("audit: task ids and seeds")
    ids = heldout_task_ids(bench)
    for row in bank:
        report.count("task ids")
        if row.task_id in ids:
            report.find("task ids", row.state_id, f"task_id is held-out task {ids[row.task_id]}")
        split, seed = row.provenance.get("split"), row.provenance.get("seed")
        if split != "train" or seed in heldout_seeds:
            report.find("task ids", row.state_id, f"provenance names split {split} seed {seed}")
    for where, text in _prompt_text(bank):
        for found in set(_ID_PATTERN.findall(text.encode())):
            if found.decode() in ids:
                report.find("task ids", where, f"mentions held-out task id {found.decode()}")
    for digest, path in sorted(blobs.items()):
        report.count("task ids")
        for found in set(_ID_PATTERN.findall(path.read_bytes())):
            if found.decode() in ids:
                report.find(
                    "task ids", f"blob {digest}", f"holds held-out task id {found.decode()}"
                )

    shown.advance()

    # -- public files ----------------------------------------------------------------
    shown.describe(f"audit: {len(heldout)} held-out tasks' public files")
    shared = {d for task in train_tasks for d in _public_files(bench, task).values()}
    for task in heldout:
        for rel, digest in _public_files(bench, task).items():
            if digest in shared:
                continue  # byte-identical in training tasks: shared by design
            report.count("public files")
            if digest in blobs:
                report.find("public files", f"blob {digest}", f"is held-out {task.task_id}:{rel}")

    shown.advance()

    # -- private answers -------------------------------------------------------------
    shown.describe(f"audit: {len(heldout)} held-out tasks' answers")
    shared_answers = {
        d for task in train_tasks for d in answer_fingerprints(bench.private_answers(task))
    }
    for task in heldout:
        for digest in answer_fingerprints(bench.private_answers(task)) - shared_answers:
            report.count("answers")
            if digest in blobs:
                report.find("answers", f"blob {digest}", f"is a private answer of {task.task_id}")

    shown.advance()

    # -- 8-grams ---------------------------------------------------------------------
    shown.describe("audit: card 8-grams in prompts")
    boiler: set[tuple[str, ...]] = set()
    from bat_gym.protocol import get_protocol

    proto = get_protocol(bank.manifest.get("protocol", "hermes"))
    for focus in bench.spec.focuses:
        boiler |= word_ngrams(bench.system_prompt(focus, proto))
        for task in train_tasks:
            boiler |= word_ngrams(bench.user_prompt(task, focus))
    for task in train_tasks:
        boiler |= word_ngrams(_task_text(bench, task))
    for stage in bench.spec.stages:
        boiler |= word_ngrams(stage.skill)
    held: dict[tuple[str, ...], str] = {}
    for task in heldout:
        for gram in word_ngrams(_task_text(bench, task)) - boiler:
            held.setdefault(gram, task.task_id)
    report.count("8-grams", len(held))
    for where, text in _prompt_text(bank):
        for gram in word_ngrams(text) & held.keys():
            report.find("8-grams", where, f"shares {' '.join(gram)!r} with {held[gram]}")
    shown.advance()
    return report
