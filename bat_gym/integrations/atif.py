"""Stored episodes as ATIF trajectories (Agent Trajectory Interchange Format, v1.7).

ATIF is the trajectory format Harbor, NeMo Gym and several trace viewers read: one JSON
document per agent run, with ``agent``, numbered ``steps`` (``system``, ``user`` and
``agent`` messages; an agent step's ``tool_calls`` and the ``observation`` whose
``results`` answer them by ``source_call_id``), ``final_metrics`` and free ``extra``
fields. Harbor ships the reference pydantic model
(``harbor.models.trajectories.Trajectory``); the tests validate every document written
here against it.

What is converted (every episode the project stores):

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
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bat_gym.errors import BatGymError
from bat_gym.evaluation.episodes import EPISODES_DIR
from bat_gym.files import write_atomic

__all__ = [
    "ATIF_VERSION",
    "AtifExportError",
    "bank_trajectories",
    "episode_trajectory",
    "export_atif",
    "messages_to_steps",
    "verdict_lines",
]

ATIF_VERSION = "ATIF-v1.7"
"""The schema version written: 1.7 adds ``extra`` on tool calls and results, used here."""


class AtifExportError(BatGymError):
    """A directory that holds no episode the ATIF export knows, with what it looks for."""


def _bat_gym_version() -> str:
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
    from bat_gym.rubrics.verifier import Verdict

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
    from bat_gym.rubrics.verifier import Verdict

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
    return _document(
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


def _document(
    steps: list[dict[str, Any]],
    *,
    agent: Mapping[str, Any] | None,
    session_id: str | None,
    trajectory_id: str,
    extra: dict[str, Any],
    metrics: dict[str, Any],
) -> dict[str, Any]:
    who = {"name": "bat_gym", "version": _bat_gym_version(), **(agent or {})}
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


def _demonstration_steps(turns: Sequence[Any], protocol: str, first_id: int) -> list[dict]:
    """Agent steps of a demonstration's actions (protocol text), parsed into calls."""
    from bat_gym.protocol import get_protocol

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


def bank_trajectories(bank_dir: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(state id, trajectory)`` of each bank row that stores a demonstration.

    The steps are the row's replayed prefix (marked ``is_copied_context``) followed by
    the demonstration's actions; the reward and verdict in brief are the
    demonstration's, as admission scored it.
    """
    from bat_gym.bank import StageBank
    from bat_gym.bank.demonstrate import load_demonstration

    bank = StageBank(bank_dir)
    protocol = str(bank.manifest.get("protocol") or "hermes")
    name = Path(bank_dir).resolve().name
    for state_id in bank.select():
        row = bank.get(state_id)
        turns = load_demonstration(bank.store, row)
        if turns is None:
            continue
        steps = messages_to_steps(row.messages, prefix=len(row.messages))
        steps += _demonstration_steps(turns, protocol, len(steps) + 1)
        stored = json.loads(bank.store.read_blob(row.provenance["demonstration"]["blob"]))
        brief = stored.get("verdict")
        reward = stored.get("reward")
        summary = f"demonstration reward {reward} of an attainable {stored.get('attainable')}"
        steps.append(
            {
                "step_id": len(steps) + 1,
                "source": "system",
                "message": summary + _brief_lines(brief),
                "extra": {"reward": reward, "verdict": brief},
            }
        )
        yield (
            state_id,
            _document(
                steps,
                agent={"name": f"bat_gym {bank.manifest.get('teacher', 'teacher')} teacher"},
                session_id=name,
                trajectory_id=state_id,
                extra={
                    "benchmark": row.benchmark,
                    "state_id": state_id,
                    "task_id": row.task_id,
                    "track": row.track,
                    "focus": row.focus,
                    "outcome": row.outcome,
                    "reward": reward,
                    "verdict_summary": summary,
                    "verdict": brief,
                    "source": {"kind": "bank", "path": str(Path(bank_dir).resolve())},
                },
                metrics={"extra": {"reward": reward}},
            ),
        )


def _brief_lines(brief: Mapping[str, Any] | None) -> str:
    if not brief:
        return ""
    out = [
        f"{i['status']} {i['stage']}.{i['item']} ({i['check']}): {i['detail']}"
        for i in brief.get("items", [])
    ]
    return "".join("\n" + line for line in out)


def _eval_agent(run_dir: Path) -> dict[str, Any] | None:
    """Who played an evaluation (its manifest's policy) or an MCP session (``agent.json``)."""
    try:
        played = json.loads((run_dir / "agent.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        played = None
    if played and played.get("agent"):
        client = played["agent"]
        return {
            "name": str(client.get("name") or "mcp client"),
            "version": str(client.get("version") or "unknown"),
        }
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    policy = manifest.get("policy") or {}
    model = policy.get("model") or policy.get("path")
    if policy.get("kind") == "harbor":  # a Harbor job read back: the agent as Harbor named it
        return {
            "name": str(policy.get("name")),
            "version": str(policy.get("version", "unknown")),
            "model_name": str(model) if model else None,
        }
    return {
        "name": f"bat_gym {policy.get('name', 'policy')}",
        "model_name": str(model) if model else None,
        "extra": {"policy": policy},
    }


def _episode_files(run_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((run_dir / EPISODES_DIR).glob("*.json")):
        yield path.stem, json.loads(path.read_text(encoding="utf-8"))


def _rollout_lines(run_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    trace = json.loads(line)
                    yield f"{path.stem}-{int(trace.get('index', 0)):04d}", trace


def _run_documents(run_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file stem, trajectory)`` of every episode stored in one run directory."""
    session = run_dir.name
    if (run_dir / "rows.jsonl").is_file() and (run_dir / "manifest.json").is_file():
        yield from bank_trajectories(run_dir)
        return
    if (run_dir / EPISODES_DIR).is_dir():
        agent = _eval_agent(run_dir)
        for key, trace in _episode_files(run_dir):
            source = {"kind": "episode", "path": str(run_dir / EPISODES_DIR / f"{key}.json")}
            yield key, episode_trajectory(trace, agent=agent, session_id=session, source=source)
    if (run_dir / "rollouts").is_dir():
        for key, trace in _rollout_lines(run_dir):
            source = {
                "kind": "grpo_rollout",
                "path": str(run_dir / "rollouts"),
                **{k: trace.get(k) for k in ("step", "index", "group", "pool", "shaped_reward")},
            }
            yield (
                key,
                episode_trajectory(
                    trace, agent={"name": "bat_gym grpo policy"}, session_id=session, source=source
                ),
            )


def _run_dirs(run_dir: Path) -> list[tuple[str, Path]]:
    """The run directory, or a BiCuRL run's evaluations and GRPO rounds, with sub-paths."""
    if not (run_dir / "loop_state.json").is_file():
        return [("", run_dir)]
    found = []
    for sub in [run_dir / "evals" / "start", *sorted((run_dir / "evals").glob("round-*"))]:
        found.append((str(sub.relative_to(run_dir)), sub))
    for grpo in sorted((run_dir / "rounds").glob("round-*/grpo")):
        found.append((str(grpo.relative_to(run_dir)), grpo))
    return [(rel, p) for rel, p in found if p.is_dir()]


def export_atif(run_dir: str | Path, out: str | Path) -> list[Path]:
    """Write every stored episode of ``run_dir`` as an ATIF file under ``out``.

    ``run_dir`` is an evaluation (``bat-gym eval --out``), an MCP session (``bat-gym
    serve mcp --out``), a GRPO run, a Stage Bank, or a BiCuRL run (its evaluations and
    GRPO rounds, each under its own sub-folder of ``out``). Files are named after the
    cell key, ``step_NNNNNN-IIII`` for a rollout, or the state id for a bank row.

    Returns:
        The files written, in order.

    Raises:
        AtifExportError: ``run_dir`` holds no stored episode.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise AtifExportError(f"{run_dir}: no such directory; give a run directory to export")
    written: list[Path] = []
    for rel, sub in _run_dirs(run_dir):
        target = Path(out) / rel
        for stem, doc in _run_documents(sub):
            target.mkdir(parents=True, exist_ok=True)
            path = target / f"{stem}.json"
            write_atomic(path, json.dumps(doc, indent=2, default=str))
            written.append(path)
    if not written:
        raise AtifExportError(
            f"{run_dir} holds no stored episode: give an evaluation (bat-gym eval --out, "
            "with episodes/), a GRPO run (rollouts/), a Stage Bank (bat-gym bank build "
            "--out) or an MCP session (bat-gym serve mcp --out)"
        )
    return written
