"""A Gymnasium space of arbitrary Unicode text.

Gymnasium's ``spaces.Text`` enumerates an alphabet (alphanumeric by default) and cannot
hold code, JSON or prose with punctuation. :class:`UnicodeText` accepts any ``str`` up
to ``max_length`` characters that contains no NUL and no lone surrogate (neither can be
encoded as UTF-8 or passed to a process), and samples printable text for checkers.

Vector envs batch it as a tuple of strings (Gymnasium's default for custom spaces).
For ``AsyncVectorEnv``'s shared memory, each env gets a slot of a length prefix plus
``4 * max_length`` bytes, enough for any member encoded as UTF-8; reading returns a
live view (the vector env reads its buffer once and relies on views, as it does for
arrays), which ``copy.deepcopy`` turns into a plain tuple.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import (
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

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


_LEN = np.dtype("<u8")


def _slot_bytes(space: UnicodeText) -> int:
    return _LEN.itemsize + 4 * space.max_length


@create_shared_memory.register(UnicodeText)
def _create_shared(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    import multiprocessing as mp

    return (ctx or mp).Array("B", n * _slot_bytes(space))


@write_to_shared_memory.register(UnicodeText)
def _write_shared(space: UnicodeText, index: int, value: str, shared_memory: Any) -> None:
    data = value.encode("utf-8")
    buf = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
    start = index * _slot_bytes(space)
    buf[start : start + _LEN.itemsize] = np.frombuffer(
        np.array(len(data), dtype=_LEN).tobytes(), dtype=np.uint8
    )
    buf[start + _LEN.itemsize : start + _LEN.itemsize + len(data)] = np.frombuffer(
        data, dtype=np.uint8
    )


class SharedTexts(Sequence[str]):
    """The strings in a shared-memory buffer, read afresh on every access."""

    def __init__(self, space: UnicodeText, shared_memory: Any, n: int) -> None:
        self._space, self._memory, self._n = space, shared_memory, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        buf = np.frombuffer(self._memory.get_obj(), dtype=np.uint8)
        start = (i % self._n) * _slot_bytes(self._space)
        size = int(buf[start : start + _LEN.itemsize].view(_LEN)[0])
        return bytes(buf[start + _LEN.itemsize : start + _LEN.itemsize + size]).decode("utf-8")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)


@read_from_shared_memory.register(UnicodeText)
def _read_shared(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, shared_memory, n)
