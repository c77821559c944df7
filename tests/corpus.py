"""Text to train the tests' tiny tokenizers on: the project's own prose and code samples."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The README and the tour it links to hold the env ids, tool-call syntax and commands the
# tiny models see in prompts.
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "guide.md")


def project_text() -> list[str]:
    """The lines of the README and the tour, in that order."""
    return [line for doc in DOCUMENTS for line in doc.read_text(encoding="utf-8").splitlines()]
