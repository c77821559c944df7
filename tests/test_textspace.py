import numpy as np
import pytest

from bat_gym.core.textspace import UnicodeText


def test_accepts_code_and_unicode():
    space = UnicodeText(100)
    assert space.contains('print("héllo, 世界")\n\tx = {"a": [1, 2]}')
    assert space.contains("")


@pytest.mark.parametrize("bad", [b"bytes", 3, "a" * 101, "nul\x00byte", "lone \ud800 surrogate"])
def test_rejects_what_cannot_be_a_message(bad):
    assert not UnicodeText(100).contains(bad)


def test_min_length_and_validation():
    assert not UnicodeText(10, min_length=2).contains("a")
    with pytest.raises(ValueError, match="min_length <= max_length"):
        UnicodeText(3, min_length=5)


def test_samples_are_members_and_seeded():
    a, b = UnicodeText(50, seed=7), UnicodeText(50, seed=7)
    samples = [a.sample() for _ in range(20)]
    assert samples == [b.sample() for _ in range(20)]
    assert all(a.contains(s) for s in samples)
    assert not a.is_np_flattenable
    assert isinstance(a.np_random, np.random.Generator)
