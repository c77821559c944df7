"""The scripted teacher's repair record: two tool calls around a repair done in the open.

A stage whose start state carries an earlier stage's mistake may repair it, and says so
in its own receipt under ``repairs``: one entry per file of an earlier stage that the
repair changed, created or deleted, with the file's sha256 in the start state
(``sha256_before``, null for a new file), its final sha256 (``sha256_after``, null for
a deleted file) and a one-line ``reason``::

    "repairs": [{"path": "pipeline/infer.py", "sha256_before": "9f2c...",
                 "sha256_after": "41ab...", "reason": "the pilot's check failed: ..."}]

A teacher brackets its repair turns with the two calls made here:

* :func:`start_call`, first: the sha256 of every workspace file, kept in the sandbox's
  temporary directory (private to the episode, cleared at reset), so that "before" is
  the start state's;
* :func:`record_call`, last, once the stage's receipt is written: compares the
  workspace with the kept digests and adds an entry for each file that differs, except
  the stage's own new products, to that receipt.

Both run inside the sandbox with the standard library only.

For the reference stages (S2 writes ``pipeline/infer.py``; S3 to S5 write receipts under
``validation/``), :data:`STAGE_RECEIPTS`, :func:`starts_with_s2_mistake`,
:func:`pipeline_reasons` and :func:`record_stage_call` are the parts every suite's
repair exercise shares, and :func:`write_file_call` writes a repaired file in the open.
"""

from __future__ import annotations

from collections.abc import Sequence

from bat_gym.core.protocol import ToolCall, bash_call, python_call

__all__ = [
    "STAGE_RECEIPTS",
    "pipeline_reasons",
    "record_call",
    "record_stage_call",
    "start_call",
    "starts_with_s2_mistake",
    "write_file_call",
]

# The start state's digests, in the sandbox's own temporary directory ($TMPDIR).
_START = "repair_start.json"

_DIGESTS = f'''
import hashlib, json, os, tempfile

START = {_START!r}

def workspace_sha256():
    """Every workspace file's sha256, by path relative to the workspace root."""
    out = {{}}
    for folder, dirs, files in os.walk("."):
        dirs.sort()
        for name in sorted(files):
            path = os.path.relpath(os.path.join(folder, name))
            with open(path, "rb") as fh:
                out[path] = hashlib.sha256(fh.read()).hexdigest()
    return out

kept = os.path.join(tempfile.gettempdir(), START)
'''


def start_call() -> ToolCall:
    """The call that keeps every workspace file's sha256 before the repair begins."""
    return python_call(
        _DIGESTS
        + """
start = workspace_sha256()
with open(kept, "w") as fh:
    json.dump(start, fh)
print("kept the sha256 of", len(start), "files: the start state the repair record refers to")
"""
    )


def record_call(receipt: str, reasons: Sequence[tuple[str, str]], own: Sequence[str]) -> ToolCall:
    """The call that writes the ``repairs`` record into ``receipt`` (after :func:`start_call`).

    Args:
        receipt: the stage's own receipt (``validation/s4_completion.json``), already
            written; its other keys are kept.
        reasons: ``(path prefix, reason)`` pairs; a changed file gets the reason of the
            first prefix it starts with (end with ``("", reason)`` for the rest).
        own: path prefixes of the stage's own products: a *new* file under one of them
            is the stage's work, not a repair, and is left out. A file of the start
            state that changed is recorded wherever it lives.
    """
    return python_call(
        _DIGESTS
        + f"""
RECEIPT = {receipt!r}
REASONS = {list(reasons)!r}
OWN = {tuple(own)!r}
with open(kept) as fh:
    start = json.load(fh)
now = workspace_sha256()
repairs = []
for path in sorted(set(start) | set(now)):
    before, after = start.get(path), now.get(path)
    if before == after or path == RECEIPT or (before is None and path.startswith(OWN)):
        continue
    reason = next((r for prefix, r in REASONS if path.startswith(prefix)), "re-derived after the repair")
    repairs.append({{"path": path, "sha256_before": before, "sha256_after": after, "reason": reason}})
with open(RECEIPT) as fh:
    body = json.load(fh)
body["repairs"] = repairs
with open(RECEIPT, "w") as fh:
    json.dump(body, fh, indent=2)
for r in repairs:
    print("repair:", r["path"], (r["sha256_before"] or "new")[:12], "->", (r["sha256_after"] or "deleted")[:12], "|", r["reason"])
print(len(repairs), "repairs recorded in", RECEIPT)
"""
    )


#: Each reference stage's receipt, and the prefixes of its own products: a new file
#: under one of them is the stage's work, not a repair.
STAGE_RECEIPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "S3": ("validation/s3_validation.json", ("validation/",)),
    "S4": ("validation/s4_completion.json", ("outputs/", "validation/s4_completion.json")),
    "S5": (
        "validation/s5_submission.json",
        ("outputs/submission.csv", "validation/s5_submission.json"),
    ),
}


def starts_with_s2_mistake(focus: str, outcome: str) -> bool:
    """Whether a row starts with a mistake its trajectory made in S2, for the usual outcomes.

    ``recovery`` and ``failure`` write the mistaken pipeline in S2; ``recovery`` fixes
    it in S3, so only its S3 row starts with it; ``failure`` keeps it to the end.
    """
    return (focus == "S3" and outcome in ("recovery", "failure")) or (
        focus in ("S4", "S5") and outcome == "failure"
    )


def pipeline_reasons(evidence: str) -> list[tuple[str, str]]:
    """The ``reasons`` of a repaired pipeline: its own, the pilot's and the outputs'.

    Args:
        evidence: one line: what the check showed, which the pipeline's entry quotes.
    """
    return [
        ("pipeline/", evidence),
        ("validation/", "the pilot, run again with the repaired pipeline"),
        ("outputs/", "re-derived with the repaired pipeline"),
    ]


def record_stage_call(focus: str, reasons: Sequence[tuple[str, str]]) -> ToolCall:
    """:func:`record_call` into reference stage ``focus``'s receipt (``S3``..``S5``)."""
    receipt, own = STAGE_RECEIPTS[focus]
    return record_call(receipt, reasons, own)


def write_file_call(path: str, text: str) -> ToolCall:
    """A bash call that writes ``text`` to ``path`` through a heredoc.

    The heredoc keeps the file readable in the transcript (no escaped string). The file
    is ``text`` byte for byte, with a final newline where ``text`` lacks one; ``text``
    must not hold a line ``BAT_FILE_EOF``.
    """
    folder = path.rpartition("/")[0]
    return bash_call(
        (f"mkdir -p {folder}\n" if folder else "")
        + f"cat > {path} <<'BAT_FILE_EOF'\n"
        + text.removesuffix("\n")
        + f"\nBAT_FILE_EOF\nwc -l {path}"
    )
