"""Property: ``step`` never raises, whatever the message says.

Messages mix the three tool-call syntaxes with arbitrary Unicode (lone surrogates and
NUL included), deep nesting, huge numbers and long runs, the way a policy early in RL
writes them. One env serves every example, so the property also covers an env stepped
through thousands of odd messages in a row.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_TEXT = st.text(st.characters(codec=None, categories=None), max_size=200)
_CODE = st.one_of(
    _TEXT,
    st.sampled_from(["true", "echo hi", "ls -la", "exit 3", "print(1)", "raise SystemExit(2)"]),
)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)


@st.composite
def messages(draw) -> str:
    kind = draw(st.sampled_from(["hermes", "json", "openai", "raw", "nest", "number"]))
    args = {
        "language": draw(st.sampled_from(["bash", "python", "ruby", ""])),
        "code": draw(_CODE),
    }
    if draw(st.booleans()):
        args[draw(_TEXT)] = draw(_JSON_VALUE)
    name = draw(st.sampled_from(["execute_code", "execute_code", "finish", "nope", ""]))
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=draw(st.booleans()))
    if kind == "hermes":
        return draw(_TEXT) + f"<tool_call>{body}</tool_call>" + draw(_TEXT)
    if kind == "json":
        return f"```json\n{body}\n```"
    if kind == "openai":
        item = {
            "id": "c",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        return json.dumps({"content": draw(_TEXT), "tool_calls": [item]})
    if kind == "nest":
        return f"<tool_call>{_nested(draw(st.integers(0, 100_000)))}</tool_call>"
    if kind == "number":
        digits = "9" * draw(st.integers(1, 10_000))
        return (
            f'<tool_call>{{"name": "execute_code", "arguments": {{"code": {digits}}}}}</tool_call>'
        )
    return draw(_TEXT)


@pytest.fixture(scope="module")
def env(toy_bank):
    env = gym.make("bat/E2E-v0", benchmark="toy_pipeline", states=toy_bank)
    env.reset(seed=0)
    yield env
    env.close()


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # deterministic in CI
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=messages())
def test_step_never_raises(env, message):
    _, reward, terminated, truncated, info = env.step(message)
    json.dumps(info["messages"])  # every recorded message stays serializable
    assert isinstance(reward, float)
    if terminated or truncated:
        assert info["verdict"].reward is not None
        env.reset(seed=0)
