"""Harbor jobs read back as bat-gym evaluations (``bat-gym harbor import``).

A Harbor job folder holds one folder per trial (Harbor's ``TrialPaths``): its
``result.json`` (a ``TrialResult``: the agent's name, version and model) and its
``verifier/`` folder, where an exported task's verifier (``bat-gym harbor verify``)
wrote ``verdict.json``, ``reward.json``, the replayed episode's trace
(``episodes/<key>.json``, with the files its calls wrote under ``episodes/blobs``) and,
for a held-out cell, ``cell.json`` scored as ``bat-gym eval`` scores a cell.

:func:`import_job` gathers them into an evaluation's layout (``manifest.json``,
``cells/``, ``episodes/``), one run per agent, which ``bat-gym view``, ``bat-gym export
atif`` and any reader of evaluations open as they open ``bat-gym eval --out``. The
manifest names the agent (``policy.kind = "harbor"``) and the job it came from. The
folder is evaluation-side, like the job's held-out traces.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from bat_gym.core.errors import BatGymError
from bat_gym.core.files import write_atomic
from bat_gym.evaluation.episodes import BLOBS_DIR, EPISODES_DIR
from bat_gym.integrations.harbor_runtime import read_json

__all__ = ["HarborJobError", "import_job", "trial_dirs"]


class HarborJobError(BatGymError):
    """A folder that holds no trial of an exported bat-gym task, and what one looks like."""


def trial_dirs(job_dir: str | Path) -> list[Path]:
    """The trial folders of a job (or of a folder of jobs) whose verifier was bat-gym's."""
    root = Path(job_dir)
    return sorted({p.parent.parent for p in root.rglob("verifier/verdict.json")})


def _read(path: Path) -> dict[str, Any]:
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def _agent(trial: Path, verdict: dict[str, Any]) -> dict[str, Any]:
    """Who played the trial: Harbor's ``agent_info``, else the MCP client's own name."""
    info = _read(trial / "result.json").get("agent_info") or {}
    client = verdict.get("agent") or {}
    model = (info.get("model_info") or {}).get("name")
    return {
        "name": str(info.get("name") or client.get("name") or "harbor agent"),
        "version": str(info.get("version") or client.get("version") or "unknown"),
        "model": model,
        "mcp_client": client or None,
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def _copy_trial(trial: Path, verdict: dict[str, Any], run: Path) -> dict[str, Any] | None:
    """Copy one trial's cell, trace and blobs into ``run``; its cell as JSON (None: none)."""
    verifier = trial / "verifier"
    trace = verdict.get("trace")
    if trace:
        (run / EPISODES_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copy2(verifier / trace, run / EPISODES_DIR / Path(trace).name)
        blobs = verifier / EPISODES_DIR / BLOBS_DIR
        if blobs.is_dir():
            shutil.copytree(blobs, run / EPISODES_DIR / BLOBS_DIR, dirs_exist_ok=True)
    cell = _read(verifier / "cell.json")
    if not cell:
        return None
    key = "{track}-{seed}-r{repeat}".format(**cell["cell"])
    (run / "cells").mkdir(parents=True, exist_ok=True)
    write_atomic(run / "cells" / f"{key}.json", json.dumps(cell, indent=1))
    return cell


def import_job(job_dir: str | Path, out: str | Path) -> list[Path]:
    """Write the job's trials as evaluation runs under ``out``: one per agent; returns them.

    With one agent the run is ``out`` itself; with several, ``out/<agent name>``.

    Raises:
        HarborJobError: no trial of an exported bat-gym task is under ``job_dir``.
    """
    trials = trial_dirs(job_dir)
    if not trials:
        raise HarborJobError(
            f"{job_dir} holds no trial of a task `bat-gym export harbor` wrote (a trial folder "
            "with verifier/verdict.json); give the job folder `harbor run` wrote"
        )
    by_agent: dict[str, list[tuple[Path, dict[str, Any], dict[str, Any]]]] = {}
    for trial in trials:
        verdict = _read(trial / "verifier" / "verdict.json")
        agent = _agent(trial, verdict)
        by_agent.setdefault(agent["name"], []).append((trial, verdict, agent))
    runs = []
    for name, played in sorted(by_agent.items()):
        run = Path(out) if len(by_agent) == 1 else Path(out) / _safe(name)
        cells = [c for t, v, _ in played if (c := _copy_trial(t, v, run)) is not None]
        task = played[0][1].get("task") or {}
        agent = played[0][2]
        manifest = {
            "benchmark": {
                "name": task.get("benchmark"),
                "version": task.get("benchmark_version"),
                "contracts": task.get("contracts"),
            },
            "policy": {"kind": "harbor", **{k: v for k, v in agent.items() if v}},
            "cells": [c["cell"] for c in cells],
            "harbor": {
                "job": str(Path(job_dir).resolve()),
                "trials": [
                    {"trial": t.name, "state_id": v.get("state_id"), "reward": v.get("reward")}
                    for t, v, _ in played
                ],
            },
        }
        run.mkdir(parents=True, exist_ok=True)
        write_atomic(run / "manifest.json", json.dumps(manifest, indent=2))
        runs.append(run)
    return runs
