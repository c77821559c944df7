"""A Gymnasium space of arbitrary Unicode text.

Gymnasium's ``spaces.Text`` enumerates an alphabet (alphanumeric by default) and cannot
hold code, JSON or prose with punctuation. :class:`UnicodeText` accepts any ``str`` up
to ``max_length`` characters that contains no NUL and no lone surrogate (neither can be
encoded as UTF-8 or passed to a process), and samples printable text for checkers.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["UnicodeText"]

_SAMPLE_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n\té中∑"


class UnicodeText(spaces.Space[str]):
    r"""Any Unicode string of ``min_length`` .. ``max_length`` characters.

    Args:
        max_length: longest accepted string, in characters.
        min_length: shortest accepted string, in characters.

    Example:
        >>> space = UnicodeText(max_length=20)
        >>> space.contains('print("héllo")\n')
        True
        >>> space.contains("a" * 21)
        False
    """

    def __init__(
        self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None
    ) -> None:
        if not 0 <= min_length <= max_length:
            raise ValueError(
                f"expected 0 <= min_length <= max_length, got {min_length} and {max_length}"
            )
        self.min_length = int(min_length)
        self.max_length = int(max_length)
        super().__init__(dtype=str, seed=seed)

    def contains(self, x: Any) -> bool:
        """True for a ``str`` of allowed length with no NUL and valid UTF-8 encoding."""
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        if "\x00" in x:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Random printable text (ASCII, whitespace and a few non-ASCII characters)."""
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample takes no mask or probability")
        hi = min(self.max_length, self.min_length + 64)
        n = int(self.np_random.integers(self.min_length, hi + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=n)
        return "".join(_SAMPLE_ALPHABET[i] for i in idx)

    @property
    def is_np_flattenable(self) -> bool:
        """Text has no fixed-size numeric form."""
        return False

    def __repr__(self) -> str:
        return f"UnicodeText(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and other.min_length == self.min_length
            and other.max_length == self.max_length
        )

    def to_jsonable(self, sample_n: Any) -> list[str]:
        """Samples are already JSON strings."""
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        """Inverse of :meth:`to_jsonable`."""
        return list(sample_n)
