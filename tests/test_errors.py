"""Errors: one root, clear messages, and each survives the trip out of a worker process."""

from __future__ import annotations

import inspect
import pickle

import pytest

from bat_gym.core import errors


def _made(cls: type) -> errors.BatGymError:
    """An instance of ``cls`` made with a string for each of its required arguments."""
    params = [
        p
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    values = {"problems": [("field", "is wrong")], "known": ["a", "b"], "candidates": ["a"]}
    return cls(*[values.get(p.name, f"<{p.name}>") for p in params])


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_pickles_as_itself(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.BatGymError)
    error = _made(cls)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls and str(again) == str(error)
    assert again.__dict__.keys() == error.__dict__.keys()
