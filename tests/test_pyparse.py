import ast
from concurrent.futures import ThreadPoolExecutor

import pytest

from bat_gym.core import pyparse

DEEP = (
    "x = " + "(" * 60 + "1" + ")" * 60 + "\n" + "def f():\n    return [i for i in range(3)]\n" * 50
)


def test_parses_from_many_threads_at_once_without_a_system_error():
    # CPython 3.11/3.12 can raise "AST constructor recursion depth mismatch" when two
    # threads parse at once; the verifier parses agent code from worker threads.
    with ThreadPoolExecutor(8) as pool:
        trees = list(pool.map(lambda _: pyparse.parse(DEEP), range(400)))
    assert all(isinstance(t, ast.Module) and len(t.body) == 51 for t in trees)


def test_a_spurious_system_error_is_retried_once(monkeypatch):
    real, calls = ast.parse, []

    def flaky(source, filename="<unknown>"):
        calls.append(filename)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=57, after=62)")
        return real(source, filename=filename)

    monkeypatch.setattr(pyparse.ast, "parse", flaky)
    assert isinstance(pyparse.parse("a = 1", "agent.py"), ast.Module)
    assert calls == ["agent.py", "agent.py"]


def test_bad_source_raises_as_ast_parse_does():
    with pytest.raises(SyntaxError):
        pyparse.parse("def (")
