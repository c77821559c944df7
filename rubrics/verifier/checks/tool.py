"""Checks on the calls of a benchmark's own tools (:mod:`bat_gym.core.tools`).

``tool_called`` reads :attr:`~bat_gym.core.record.ExecutionRecord.tool_uses`: what the env
recorded when it ran the tool (validated arguments, status, result digest), never
what the agent says it did. Argument predicates name a field of the arguments by a
dotted path (``roi.x``) and test it; ``equals_answer`` compares it with a value of
the task's private answers, which only the verifier holds, and the verdict never
quotes that value.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bat_gym.core.record import ToolUseRecord
from bat_gym.rubrics.contract.checks import register_check
from bat_gym.rubrics.contract.context import (
    CheckContext,
    CheckFailed,
    CheckResult,
    CheckUnscorable,
    Evidence,
)
from bat_gym.rubrics.verifier.reading import states_answer

__all__ = ["ArgumentTest", "tool_called"]

_MISSING = object()


class ArgumentTest(BaseModel):
    """What one argument of a recorded call must be; every test given must hold.

    Attributes:
        equals: the argument is exactly this JSON value.
        one_of: the argument is one of these values.
        contains: a string holding this text, or a list holding this item.
        matches: a string in which this regular expression is found (``re.search``).
        at_least: a number at least this.
        at_most: a number at most this.
        equals_answer: a key of the task's private answers; the argument must state
            that answer (as ``matches_answers`` compares values).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    equals: Any = Field(None, description="The exact JSON value.")
    one_of: list[Any] | None = Field(None, min_length=1, description="Allowed values.")
    contains: Any = Field(None, description="Substring of a string, or item of a list.")
    matches: str | None = Field(None, description="A regular expression found in a string.")
    at_least: float | None = Field(None, description="Lower bound of a number.")
    at_most: float | None = Field(None, description="Upper bound of a number.")
    equals_answer: str | None = Field(None, description="Key of the private answers.")

    @model_validator(mode="after")
    def _some(self) -> ArgumentTest:
        if not self.model_fields_set:
            raise ValueError("an argument test needs at least one of its fields")
        if self.matches is not None:
            re.compile(self.matches)
        return self


def _get(arguments: dict[str, Any], path: str) -> Any:
    value: Any = arguments
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _passes(value: Any, test: ArgumentTest, answers: dict[str, Any] | None) -> bool:
    """Whether ``value`` meets every test set in ``test``."""
    if value is _MISSING:
        return False
    given = test.model_fields_set
    if "equals" in given and value != test.equals:
        return False
    if test.one_of is not None and value not in test.one_of:
        return False
    if "contains" in given:
        if isinstance(value, str):
            if not isinstance(test.contains, str) or test.contains not in value:
                return False
        elif not isinstance(value, list) or test.contains not in value:
            return False
    if test.matches is not None and (
        not isinstance(value, str) or re.search(test.matches, value) is None
    ):
        return False
    number = _number(value)
    if test.at_least is not None and (number is None or number < test.at_least):
        return False
    if test.at_most is not None and (number is None or number > test.at_most):
        return False
    if test.equals_answer is not None:
        if answers is None or test.equals_answer not in answers:
            return False
        if not states_answer(str(value), answers[test.equals_answer]):
            return False
    return True


@register_check("tool_called")
def tool_called(
    ctx: CheckContext,
    *,
    name: str,
    arguments: dict[str, ArgumentTest] | None = None,
    status: Literal["ok", "any"] = "ok",
    min_calls: Annotated[int, Field(ge=1)] = 1,
    result_contains: list[str] | None = None,
) -> CheckResult:
    """At least ``min_calls`` recorded calls of the benchmark tool ``name`` meet the tests.

    A call counts when its status is ``ok`` (or any status, with ``status: any``), each
    dotted path of ``arguments`` names a field of its validated arguments that passes
    its :class:`ArgumentTest`, and its recorded result holds every string of
    ``result_contains``. The evidence is the counting calls (``execution``, by index).
    Null when a test asks for a private answer and there is no task oracle. An item
    using it says ``requires: [execution]``: the calls, not a file, are its evidence.
    """
    tests = dict(arguments or {})
    answers: dict[str, Any] | None = None
    if any(t.equals_answer is not None for t in tests.values()):
        if ctx.task is None:
            raise CheckUnscorable("no task oracle: the private answers are unavailable")
        answers = ctx.task.answers
    uses: list[ToolUseRecord] = [u for u in ctx.record.tool_uses if u.name == name]
    if not uses:
        raise CheckFailed(f"the tool {name!r} was never called")

    def counts(u: ToolUseRecord) -> bool:
        if status == "ok" and not u.succeeded:
            return False
        if any(s not in u.output for s in result_contains or ()):
            return False
        return all(_passes(_get(u.arguments, p), t, answers) for p, t in tests.items())

    good = [u for u in uses if counts(u)]
    what = f"call(s) of {name!r}" + (
        f" with {', '.join(sorted(tests))} as required" if tests else ""
    )
    if len(good) < min_calls:
        failed = [u for u in uses if u.status != "ok"]
        why = f"; {len(failed)} of its {len(uses)} calls did not succeed" if failed else ""
        raise CheckFailed(
            f"{len(good)} {what}, fewer than {min_calls}{why}",
            tuple(Evidence.execution(u.index) for u in uses[-3:]),
        )
    return CheckResult.ok(
        f"{len(good)} {what}: call(s) #{', #'.join(str(u.index) for u in good[:5])}",
        tuple(Evidence.execution(u.index) for u in good),
    )
