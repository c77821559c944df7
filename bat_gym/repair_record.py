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
"""

from __future__ import annotations

from collections.abc import Sequence

from bat_gym.protocol import ToolCall, python_call

__all__ = ["start_call", "record_call"]

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
