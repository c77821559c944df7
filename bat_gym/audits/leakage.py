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
:data:`~bat_gym.bank.heldout.MIN_ANSWER_BYTES` are not fingerprinted (a lone ``0``
matches too much to mean anything). Limits: answers are matched as whole blobs, so an
answer embedded inside a larger file (an image format with a header) is not detected.

The fingerprints are those of :mod:`bat_gym.bank.heldout`, which a bank build's
leakage gate checks row by row; they are named here too, as the audit's vocabulary.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from bat_gym.bank import BankReport, StageBank
from bat_gym.bank.heldout import (
    MIN_ANSWER_BYTES,
    HeldOutIndex,
    answer_fingerprints,
    heldout_task_ids,
    public_file_digests,
    task_fingerprints,
)
from bat_gym.benchmark import Benchmark
from bat_gym.core import progress
from bat_gym.core.spec import Task

__all__ = [
    "NGRAM",
    "audit_bank",
    "word_ngrams",
    # the fingerprints of bat_gym.bank.heldout, which the audit measures with
    "MIN_ANSWER_BYTES",
    "HeldOutIndex",
    "answer_fingerprints",
    "heldout_task_ids",
    "task_fingerprints",
]

NGRAM = 8
_ID_PATTERN = re.compile(rb"[A-Za-z0-9_]+-[0-9a-f]{12}")
_WORD = re.compile(r"[a-z0-9_]+")


def word_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The lower-cased word ``n``-grams of ``text``."""
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


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
    the current reporter (:mod:`bat_gym.core.progress`).

    Returns:
        A report with one line per check; ``report.ok`` is False on any finding.
    """
    if bench is None:
        from bat_gym.catalog import get_benchmark

        bench = get_benchmark(bank.info.benchmark)
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
    shared = {d for task in train_tasks for d in public_file_digests(bench, task).values()}
    for task in heldout:
        for rel, digest in public_file_digests(bench, task).items():
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
    from bat_gym.core.protocol import get_protocol

    proto = get_protocol(bank.info.protocol)
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
