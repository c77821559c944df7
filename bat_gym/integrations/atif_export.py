"""Every stored episode of a run directory written as ATIF files (``bat-gym export atif``).

Reads what the project stores (:mod:`bat_gym.integrations.atif` says how each becomes
a trajectory):

* an evaluation (``bat-gym eval --out``) or an MCP session (``bat-gym serve mcp
  --out``): ``episodes/<key>.json``, one file each;
* a GRPO run: ``rollouts/step_NNNNNN.jsonl``, one file per kept rollout
  (``step_NNNNNN-IIII.json``);
* a Stage Bank: one file per row that stores its demonstration (the state id);
* a BiCuRL run: its evaluations and GRPO rounds, each in a sub-folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bat_gym.core.errors import BatGymError
from bat_gym.core.files import write_atomic
from bat_gym.evaluation.episodes import EPISODES_DIR
from bat_gym.integrations.atif import (
    brief_lines,
    demonstration_steps,
    episode_trajectory,
    messages_to_steps,
    trajectory_document,
)

__all__ = ["AtifExportError", "bank_trajectories", "export_atif"]


class AtifExportError(BatGymError):
    """A directory that holds no episode the ATIF export knows, with what it looks for."""


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
        steps += demonstration_steps(turns, protocol, len(steps) + 1)
        stored = json.loads(bank.store.read_blob(row.provenance["demonstration"]["blob"]))
        brief = stored.get("verdict")
        reward = stored.get("reward")
        summary = f"demonstration reward {reward} of an attainable {stored.get('attainable')}"
        steps.append(
            {
                "step_id": len(steps) + 1,
                "source": "system",
                "message": summary + brief_lines(brief),
                "extra": {"reward": reward, "verdict": brief},
            }
        )
        yield (
            state_id,
            trajectory_document(
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
