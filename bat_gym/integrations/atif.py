"""Stored episodes as ATIF trajectories (Agent Trajectory Interchange Format, v1.7).

ATIF is the trajectory format Harbor, NeMo Gym and several trace viewers read: one JSON
document per agent run, with ``agent``, numbered ``steps`` (``system``, ``user`` and
``agent`` messages; an agent step's ``tool_calls`` and the ``observation`` whose
``results`` answer them by ``source_call_id``), ``final_metrics`` and free ``extra``
fields. Harbor ships the reference pydantic model
(``harbor.models.trajectories.Trajectory``); the tests validate every document written
here against it.

What is converted (every episode the project stores; ``atif_export`` reads them from
their run directories and writes the files):

* an evaluation's traces, ``OUT/episodes/<cell key>.json``
  (:mod:`bat_gym.evaluation.episodes`), and an MCP session's (``bat-gym serve mcp
  --out``, the same traces beside ``agent.json``);
* a GRPO run's rollout sample, ``rollouts/step_NNNNNN.jsonl``
  (:mod:`bat_gym.trainers.rollout_log`), one trajectory per kept rollout;
* a Stage Bank's demonstrations: each row's replayed prefix followed by the actions of
  the demonstration that admitted it (``provenance["demonstration"]``, its reward and
  verdict in brief). A demonstration keeps actions only, so its steps have no
  observations.

Mapping: a message becomes one step, in order; an assistant message's OpenAI
``tool_calls`` become ``tool_calls`` (arguments parsed from their JSON string) and
the ``tool`` messages that answer them become that step's ``observation``. The
execution record's entries of a turn (exit code, duration, files written) ride in the
step's ``extra["executions"]``. Steps the start state replayed (earlier stages' turns)
are marked ``is_copied_context``. A last ``system`` step carries the verdict: its
one-line summary and the items that failed, with their details; the reward, the
verdict in brief and the stage credits are also in ``extra`` and ``final_metrics``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = [
    "ATIF_VERSION",
    "bat_gym_version",
    "brief_lines",
    "demonstration_steps",
    "episode_trajectory",
    "messages_to_steps",
    "trajectory_document",
    "verdict_lines",
]

ATIF_VERSION = "ATIF-v1.7"
"""The schema version written: 1.7 adds ``extra`` on tool calls and results, used here."""


def bat_gym_version() -> str:
    """The installed bat-gym's version (the default agent version of a trajectory)."""
    try:
        return version("bat-gym")
    except PackageNotFoundError:  # a source tree run without installing
        return "0+unknown"


def _text(content: Any) -> str:
    """A message's content as text (OpenAI content parts joined; None as "")."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)


def _arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as a JSON object (OpenAI sends a JSON string)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"_raw": str(raw)}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def _executions(record: Mapping[str, Any] | None) -> dict[int, list[dict[str, Any]]]:
    """The execution record's entries by the policy's turn (0-based), briefly."""
    by_turn: dict[int, list[dict[str, Any]]] = {}
    if not record:
        return by_turn
    for call in record.get("calls") or []:
        by_turn.setdefault(int(call["turn"]), []).append(
            {
                "index": call["index"],
                "program": call.get("tool") or f"execute_code ({call.get('language')})",
                "exit_code": call.get("exit_code"),
                "duration_s": call.get("duration_s"),
                "timed_out": call.get("timed_out", False),
                "writes": call.get("writes"),
            }
        )
    for use in record.get("tool_uses") or []:
        by_turn.setdefault(int(use["turn"]), []).append(
            {
                "index": use["index"],
                "program": use["name"],
                "status": use["status"],
                "duration_s": use.get("duration_s"),
            }
        )
    return by_turn


def messages_to_steps(
    messages: Sequence[Mapping[str, Any]],
    *,
    prefix: int = 0,
    record: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """ATIF steps of an OpenAI-format conversation (see the module docstring).

    Args:
        messages: the conversation, ``{"role", "content", "tool_calls"?, "tool_call_id"?}``.
        prefix: how many leading messages the start state replayed; their agent steps
            are marked ``is_copied_context``.
        record: the episode's execution record (``ExecutionRecord`` as JSON), whose
            entries are attached to the agent step of their turn.

    Returns:
        Steps as JSON objects, ``step_id`` from 1.
    """
    executions = _executions(record)
    steps: list[dict[str, Any]] = []
    open_calls: dict[str, dict[str, Any]] = {}  # call id -> the agent step that made it
    own_turn = 0
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            step = open_calls.get(str(m.get("tool_call_id")))
            result: dict[str, Any] = {"content": _text(m.get("content"))}
            if step is not None:
                result["source_call_id"] = str(m.get("tool_call_id"))
            else:  # a reply to no call of the step before it: keep it, unattached
                step = next((s for s in reversed(steps) if s["source"] == "agent"), None)
                if step is None:
                    steps.append({"source": "system", "message": result["content"]})
                    continue
            step.setdefault("observation", {"results": []})["results"].append(result)
            continue
        if role == "assistant":
            step = {"source": "agent", "message": _text(m.get("content"))}
            calls = []
            for n, call in enumerate(m.get("tool_calls") or []):
                call_id = str(call.get("id") or f"step{len(steps) + 1}_call{n}")
                fn = call.get("function") or {}
                calls.append(
                    {
                        "tool_call_id": call_id,
                        "function_name": str(fn.get("name", "")),
                        "arguments": _arguments(fn.get("arguments")),
                    }
                )
                open_calls[call_id] = step
            if calls:
                step["tool_calls"] = calls
            if i < prefix:
                step["is_copied_context"] = True
            else:
                if own_turn in executions:
                    step["extra"] = {"executions": executions[own_turn]}
                own_turn += 1
            steps.append(step)
            continue
        source = "system" if role == "system" else "user"
        steps.append({"source": source, "message": _text(m.get("content"))})
    for n, step in enumerate(steps, 1):
        step["step_id"] = n
    return steps


def verdict_lines(verdict: Mapping[str, Any] | None) -> str:
    """The verdict as text: its one-line summary, then each item that did not pass.

    A null verdict (the episode was never scored) says so.
    """
    if not verdict:
        return "No verdict: the episode was not scored."
    from bat_gym.rubrics.verifier.verdict import Verdict

    parsed = Verdict.model_validate(verdict)
    lines = [parsed.summary()]
    for stage in parsed.stages:
        for item in stage.items:
            if item.passed is True and item.evidence_complete:
                continue
            status = {True: "no evidence", False: "FAIL", None: "null"}[item.passed]
            lines.append(f"{status} {stage.stage}.{item.id} ({item.check}): {item.detail}")
    return "\n".join(lines)


def _brief(verdict: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not verdict:
        return None
    from bat_gym.bank.replay import verdict_summary
    from bat_gym.rubrics.verifier.verdict import Verdict

    return verdict_summary(Verdict.model_validate(verdict))


def episode_trajectory(
    trace: Mapping[str, Any],
    *,
    agent: Mapping[str, Any] | None = None,
    session_id: str | None = None,
    source: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ATIF trajectory of one episode trace (format ``bat_gym.episode/1``).

    Args:
        trace: an evaluation trace or a GRPO rollout line.
        agent: ``name``, ``version`` and ``model_name`` of who played it; default
            ``bat_gym`` with the library's version.
        session_id: the run it belongs to (an evaluation's or GRPO run's directory name).
        source: where it was read from (kind, path, step...), kept in ``extra``.
    """
    steps = messages_to_steps(
        trace.get("messages") or [],
        prefix=int(trace.get("prefix_messages") or 0),
        record=trace.get("record"),
    )
    verdict = trace.get("verdict")
    reward = trace.get("reward")
    brief = _brief(verdict)
    steps.append(
        {
            "step_id": len(steps) + 1,
            "source": "system",
            "message": verdict_lines(verdict),
            "extra": {"reward": reward, "verdict": brief},
        }
    )
    meta = {
        k: trace.get(k)
        for k in ("benchmark", "state_id", "task_id", "track", "focus", "stop_reason")
    }
    stages = (brief or {}).get("stages") or {}
    return trajectory_document(
        steps,
        agent=agent,
        session_id=session_id,
        trajectory_id=str(trace.get("state_id") or "episode"),
        extra={
            **meta,
            "reward": reward,
            "verdict_summary": steps[-1]["message"].splitlines()[0],
            "verdict": brief,
            "contract": trace.get("contract"),
            "turns": trace.get("turns"),
            "tool_calls": trace.get("tool_calls"),
            "refused_turns": trace.get("refused_turns"),
            "source": dict(source or {}),
        },
        metrics={
            "total_completion_tokens": int(trace.get("response_tokens") or 0) or None,
            "extra": {"reward": reward, "stage_credit": stages},
        },
    )


def trajectory_document(
    steps: list[dict[str, Any]],
    *,
    agent: Mapping[str, Any] | None,
    session_id: str | None,
    trajectory_id: str,
    extra: dict[str, Any],
    metrics: dict[str, Any],
) -> dict[str, Any]:
    """One ATIF document: ``steps`` with the agent, ids, ``final_metrics`` and ``extra``.

    ``agent`` defaults to ``bat_gym`` at the installed version; ``metrics`` entries that
    are None are left out; ``total_steps`` is always the number of steps.
    """
    who = {"name": "bat_gym", "version": bat_gym_version(), **(agent or {})}
    final = {"total_steps": len(steps), **{k: v for k, v in metrics.items() if v is not None}}
    doc = {
        "schema_version": ATIF_VERSION,
        "session_id": session_id,
        "trajectory_id": trajectory_id,
        "agent": {k: v for k, v in who.items() if v is not None},
        "steps": steps,
        "final_metrics": final,
        "extra": extra,
    }
    return {k: v for k, v in doc.items() if v is not None}


def demonstration_steps(turns: Sequence[Any], protocol: str, first_id: int) -> list[dict]:
    """Agent steps of a demonstration's actions (protocol text), parsed into calls."""
    from bat_gym.core.protocol import get_protocol

    proto = get_protocol(protocol)
    steps = []
    for n, turn in enumerate(turns):
        parsed = proto.parse(turn.text)
        step: dict[str, Any] = {
            "step_id": first_id + n,
            "source": "agent",
            "message": parsed.content if parsed.calls else turn.text,
            "extra": {"stage": turn.stage},
        }
        if parsed.calls:
            step["tool_calls"] = [
                {
                    "tool_call_id": c.id or f"step{first_id + n}_call{k}",
                    "function_name": c.name,
                    "arguments": dict(c.arguments),
                }
                for k, c in enumerate(parsed.calls)
            ]
        steps.append(step)
    return steps


def brief_lines(brief: Mapping[str, Any] | None) -> str:
    """A verdict in brief's items that did not pass, one line each after a newline."""
    if not brief:
        return ""
    out = [
        f"{i['status']} {i['stage']}.{i['item']} ({i['check']}): {i['detail']}"
        for i in brief.get("items", [])
    ]
    return "".join("\n" + line for line in out)
