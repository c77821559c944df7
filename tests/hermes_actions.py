"""Assistant messages the vector-env and Ray tests send: a bash call, finish, the plan."""

from __future__ import annotations

from bat_gym import ToolCall
from bat_gym.core.protocol import get_protocol

HERMES = get_protocol("hermes")
FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


def bash(code: str) -> str:
    """A message that runs ``code`` with bash."""
    return HERMES.render(
        "", [ToolCall(name="execute_code", arguments={"language": "bash", "code": code})]
    )


def teacher_plan(toy, bank, state_id: str) -> str:
    """The teacher's S1 message for a state: it earns the Plan contract's reward."""
    task = toy.task_of_state(bank.get(state_id))
    (turn,) = [t for t in toy.teacher_turns(task) if t.stage == "S1"]
    return HERMES.render(turn.content, list(turn.calls))
