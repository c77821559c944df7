"""What runs inside an exported Harbor task: the MCP sidecar and the separate verifier.

``bat-gym harbor serve TASK_JSON`` (the sidecar) rebuilds the task's state and serves
its episode as MCP tools (:func:`bat_gym.integrations.mcp_server.serve`), keeping the
ended episode's trace under ``--out``.

``bat-gym harbor verify TASK_JSON --trace DIR --logs DIR`` (the verifier's
``tests/test.sh``) trusts none of what the sidecar concluded: it rebuilds the state,
replays the calls recorded in the trace, one per turn as the MCP server stepped them,
through a fresh ``RubricReward(StageEnv)`` with the one episode loop
(:func:`bat_gym.rollout.run_episode`), so the final workspace and the execution
record are its own, and the state's contract scores them. It writes Harbor's
``reward.json`` (numbers only: ``reward``, ``task_score`` and each stage's credit) and
``verdict.json`` (the verdict's summary, the failed items with their details, and the
reward the sidecar reported, for comparison).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bat_gym.core.errors import BatGymError
from bat_gym.core.files import write_atomic
from bat_gym.evaluation.episodes import EPISODES_DIR
from bat_gym.integrations.harbor import HarborTask, load_state

__all__ = [
    "HarborRuntimeError",
    "VerifyResult",
    "read_json",
    "read_task",
    "recorded_actions",
    "serve_task",
    "verify_task",
]


class HarborRuntimeError(BatGymError):
    """A task file or trace the sidecar or verifier cannot read, and what it expected."""


def read_task(path: str | Path) -> HarborTask:
    """The task file an export wrote (``tests/task.json``, ``environment/mcp/task.json``)."""
    try:
        return HarborTask.model_validate_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarborRuntimeError(
            f"{path}: not a task file of `bat-gym export harbor` ({exc}); export the task again"
        ) from None


def _env(bench: Any, states: Any, protocol: str) -> Any:
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.verifier.reward import RubricReward

    return RubricReward(StageEnv(benchmark=bench, states=states, protocol=protocol))


def serve_task(task: HarborTask, *, port: int | None, out: str | Path | None) -> Any:
    """Serve the task's episode over MCP (stdio without ``port``); returns the ended episode."""
    from bat_gym.catalog import get_benchmark
    from bat_gym.integrations.mcp_server import serve

    bench = get_benchmark(task.benchmark)
    with tempfile.TemporaryDirectory(prefix="bat-harbor-") as store:
        states, state = load_state(bench, task, store)
        return serve(_env(bench, states, task.protocol), state.state_id, http_port=port, out=out)


def recorded_actions(trace: dict[str, Any], protocol: str) -> list[str]:
    """The policy's own turns of a trace, each written in ``protocol`` as the env read it.

    An MCP session steps one call per turn with no text (:class:`McpEpisode`); a text
    policy's turn holds its content and calls. Both are rendered back the same way.
    """
    from bat_gym.core.protocol import ToolCall, get_protocol

    proto = get_protocol(protocol)
    prefix = int(trace.get("prefix_messages") or 0)
    actions = []
    for m in (trace.get("messages") or [])[prefix:]:
        if m.get("role") != "assistant":
            continue
        calls = []
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            parsed = json.loads(args) if isinstance(args, str) else dict(args or {})
            calls.append(ToolCall(name=fn.get("name", ""), arguments=parsed, id=call.get("id", "")))
        actions.append(proto.render(str(m.get("content") or ""), calls))
    return actions


class VerifyResult(dict):
    """What the verifier wrote to ``verdict.json`` (a dict; ``reward`` is the score)."""


def _replay(
    bench: Any, task: HarborTask, states: Any, state: Any, actions: list[str], logs: Path
) -> tuple[Any, str]:
    """Play ``actions`` from ``state`` through the one episode loop; ``(Rollout, trace key)``.

    The replayed episode's trace (with the files its calls wrote) is kept under ``logs``
    as an evaluation keeps a cell's, for ``bat-gym harbor import``.
    """
    from bat_gym.core.completion import Completion
    from bat_gym.evaluation.episodes import write_episode
    from bat_gym.rollout import run_episode

    pending = iter(actions)

    def act(_info: dict[str, Any]) -> Completion | None:
        text = next(pending, None)  # None: the recorded calls ran out before the end
        return None if text is None else Completion(text)

    env = _env(bench, states, task.protocol)
    try:
        # A recorded episode is replayed as it was, a restarted sandbox included.
        end = run_episode(env, act, state_id=state.state_id, on_restart="ignore")
        key = _cell(task).key if task.source == "heldout" else state.state_id
        write_episode(logs, key, end.info, env)
        return end, key
    finally:
        env.close()


def _cell(task: HarborTask) -> Any:
    from bat_gym.evaluation.cells import Cell

    return Cell(track=task.track, seed=task.seed or 0, repeat=task.repeat or 0)


def _cell_result(bench: Any, task: HarborTask, state: Any, end: Any) -> Any:
    """The held-out cell's result, scored as ``bat-gym eval`` scores one."""
    from bat_gym.evaluation.cells import CellResult
    from bat_gym.evaluation.harness import _score

    scored = _score(end.info, bool(end.terminated), bench)
    return CellResult(cell=_cell(task), task_id=state.task_id, valid=True, **scored)


def verify_task(task: HarborTask, trace_dir: str | Path, logs: str | Path) -> VerifyResult:
    """Score the agent's episode of ``task`` and write ``reward.json`` and ``verdict.json``.

    Besides Harbor's ``reward.json`` and ``verdict.json``, ``logs`` gets the replayed
    episode's trace (``episodes/``) and, for a held-out cell, its ``cell.json``.

    Args:
        task: the exported task.
        trace_dir: what the sidecar kept (``episodes/<state id>.json``, ``agent.json``).
        logs: Harbor's verifier folder (``/logs/verifier``).

    Returns:
        The contents of ``verdict.json``.
    """
    from bat_gym.bank.replay import verdict_summary
    from bat_gym.catalog import get_benchmark

    bench = get_benchmark(task.benchmark)
    logs = Path(logs)
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bat-harbor-") as store:
        states, state = load_state(bench, task, store)
        trace_path = Path(trace_dir) / EPISODES_DIR / f"{state.state_id}.json"
        agent = read_json(Path(trace_dir) / "agent.json")
        trace = read_json(trace_path)
        result = VerifyResult(
            state_id=state.state_id,
            task=task.model_dump(mode="json"),
            agent=(agent or {}).get("agent"),
        )
        if trace is None:
            result.update(
                reward=0.0,
                summary=(
                    f"no ended episode at {trace_path}: the agent did not finish through the "
                    "bat-gym MCP tools (finish, or a budget running out); scored 0"
                ),
            )
            rewards = {"reward": 0.0}
        else:
            actions = recorded_actions(trace, task.protocol)
            end, key = _replay(bench, task, states, state, actions, logs)
            verdict = end.info.get("verdict")
            ended = end.terminated or end.truncated
            reward = float(end.reward or 0.0) if ended and verdict is not None else 0.0
            result.update(
                reward=reward,
                recorded_reward=trace.get("reward"),
                stop_reason=end.info.get("stop_reason"),
                summary=verdict.summary() if verdict is not None else "the replay did not end",
                explain=verdict.explain() if verdict is not None else None,
                verdict=verdict_summary(verdict) if verdict is not None else None,
                trace=f"{EPISODES_DIR}/{key}.json",
            )
            rewards = {"reward": reward}
            if verdict is not None:
                if verdict.task_score is not None:
                    rewards["task_score"] = float(verdict.task_score)
                rewards.update({f"stage_{s.stage}": float(s.credit or 0.0) for s in verdict.stages})
                if task.source == "heldout" and ended:
                    cell = _cell_result(bench, task, state, end)
                    write_atomic(logs / "cell.json", cell.model_dump_json(indent=1))
    write_atomic(logs / "reward.json", json.dumps(rewards, indent=2))
    write_atomic(logs / "verdict.json", json.dumps(result, indent=2, default=str))
    return result


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file the sidecar, the verifier or Harbor wrote; None when it is missing."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise HarborRuntimeError(f"{path} is not valid JSON ({exc})") from None
