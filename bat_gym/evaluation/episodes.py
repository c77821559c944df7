"""Episode traces: what a played episode did, kept so a person can look at it later.

An evaluation writes one trace per scored cell to ``OUT/episodes/<cell key>.json``;
GRPO keeps a sample of its rollouts in the same shape (``rollouts/step_NNNNNN.jsonl``,
see :mod:`bat_gym.trainers.rollout_log`). ``bat-gym view`` reads both. A trace is a
JSON object (format :data:`EPISODE_FORMAT`)::

    format           "bat_gym.episode/1"
    state_id, task_id, track, focus, benchmark, contract
    prefix_messages  how many leading messages the start state replayed (system, user,
                     earlier stages' turns); the policy's own turns follow them
    messages         the whole conversation, OpenAI chat format
    turns, tool_calls, response_tokens
    stop_reason      why the episode ended (bat_gym.env.StopReason: finished, turn_budget,
                     tool_call_budget, token_budget, workspace_rejected); None: the
                     actor stopped first, or a wrapper's time limit did
    refused_turns    turns whose calls the env refused to run (a ``[tool call error]``)
    record           the ExecutionRecord (every call: code, output, exit, duration,
                     writes, reads, runs)
    verdict          the Verdict (stages, items, evidence, gates, task score, reward)
    reward           the episode's reward (None: a null verdict)
    files            the workspace files the calls wrote or the verdict cites, at the
                     end: path, sha256, size, kind (text, image, binary) and
                     before_sha256 (the start state's content, None if new); contents up
                     to a size cap are stored by sha256 under ``blobs/`` beside the
                     traces, so text diffs and image previews need no workspace

Traces hold held-out task files and outputs: they are evaluation-side, like the
cells. Nothing here is read by training. Writing one never fails a cell: a trace
that cannot be written is reported on stderr and the cell keeps its score.
"""

from __future__ import annotations

import json
import posixpath
import sys
from pathlib import Path
from typing import Any

from bat_gym.core.files import write_atomic

__all__ = [
    "BLOBS_DIR",
    "EPISODES_DIR",
    "EPISODE_FORMAT",
    "IMAGE_SUFFIXES",
    "VERDICT_KEY",
    "episode_trace",
    "file_kind",
    "prefix_length",
    "write_episode",
]

EPISODES_DIR = "episodes"
BLOBS_DIR = "blobs"
EPISODE_FORMAT = "bat_gym.episode/1"
#: How the verdict's key is written; it precedes ``messages``, ``record`` and ``files``.
VERDICT_KEY = '"verdict": '
#: File names shown as pictures (NIfTI and DICOM rendered to PNG by the viewer).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".nii", ".nii.gz", ".dcm")
_TEXT_SUFFIXES = (
    ".txt", ".md", ".py", ".sh", ".json", ".jsonl", ".yaml", ".yml", ".csv", ".tsv",
    ".toml", ".cfg", ".ini", ".log", ".html", ".xml", ".r", ".js",
)  # fmt: skip
# Stored contents are capped so a trace directory stays a few MB per episode: a text
# file past 256 KiB is not worth a diff, an image past 16 MiB not worth a preview.
MAX_TEXT_BYTES = 256 << 10
MAX_IMAGE_BYTES = 16 << 20
MAX_EPISODE_BYTES = 64 << 20


def file_kind(path: str) -> str:
    """``"image"``, ``"text"`` or ``"binary"``, by the file name."""
    name = path.lower()
    if name.endswith(IMAGE_SUFFIXES):
        return "image"
    if name.endswith(_TEXT_SUFFIXES) or "." not in posixpath.basename(name):
        return "text"
    return "binary"


def prefix_length(messages: list[dict[str, Any]], turns: int) -> int:
    """Messages before the policy's first own turn: the start state's replayed prefix.

    The policy's ``turns`` assistant messages are the last ``turns`` in the
    conversation, so the prefix ends where the ``turns``-th assistant message from
    the end begins (the whole conversation when ``turns`` is 0).
    """
    if turns <= 0:
        return len(messages)
    seen = 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            seen += 1
            if seen == turns:
                return i
    return 0


def _dump(model: Any) -> Any:
    if model is None:
        return None
    if hasattr(model, "model_dump"):
        return model.model_dump(mode="json")
    return model


def episode_trace(info: dict[str, Any], *, reward: float | None = None) -> dict[str, Any]:
    """The trace of an episode from its env's last ``info`` (no files).

    Args:
        info: the final step's info (``messages``, ``record``, ``verdict``, ...).
        reward: the reward to record; default the verdict's.
    """
    verdict = info.get("verdict")
    messages = list(info.get("messages") or [])
    turns = int(info.get("turns") or 0)
    contract = info.get("contract")
    return {
        "format": EPISODE_FORMAT,
        "state_id": info.get("state_id"),
        "task_id": None if not info.get("state_id") else str(info["state_id"]).split(".")[0],
        "track": info.get("track"),
        "focus": info.get("stage"),
        "benchmark": info.get("benchmark"),
        "contract": _dump(contract),
        "reward": reward if reward is not None else getattr(verdict, "reward", None),
        "turns": turns,
        "tool_calls": int(info.get("tool_calls") or 0),
        "response_tokens": int(info.get("response_tokens") or 0),
        "stop_reason": info.get("stop_reason"),
        "refused_turns": int(info.get("refused_turns") or 0),
        # The verdict before the long fields, so a reader wanting only it (a comparison
        # of two evaluations) parses the head of the file: see VERDICT_KEY.
        "verdict": _dump(verdict),
        "prefix_messages": prefix_length(messages, turns),
        "messages": messages,
        "record": _dump(info.get("record")),
        "files": [],
    }


def _cited_paths(trace: dict[str, Any]) -> set[str]:
    paths: set[str] = set()
    for call in (trace.get("record") or {}).get("calls", []):
        paths.update(call.get("writes") or ())
    for stage in (trace.get("verdict") or {}).get("stages", []):
        for item in stage.get("items", []):
            paths.update(e["path"] for e in item.get("evidence", []) if e.get("path"))
    return paths


def capture_files(env: Any, trace: dict[str, Any], blobs: Path) -> list[dict[str, Any]]:
    """The end contents of the files ``trace`` mentions, stored in ``blobs`` by sha256.

    ``env`` is the episode's env, still holding its sandbox (before the next reset).
    An env without a local sandbox (a Ray actor's) yields no files.
    """
    base = getattr(env, "unwrapped", None)
    sandbox = getattr(base, "sandbox", None)
    state = getattr(base, "state", None)
    if sandbox is None or state is None:
        return []
    wanted = _cited_paths(trace)
    if not wanted:
        return []
    final = sandbox.freeze()  # the scoring freeze's blobs were kept only while scoring
    store = sandbox.frozen_store
    try:
        start = {e.path: e for e in base.states.store.get_snapshot(state.snapshot).entries}
    except Exception:  # noqa: BLE001 - a diff without its "before" side is still useful
        start = {}
    blobs.mkdir(parents=True, exist_ok=True)
    out, budget = [], MAX_EPISODE_BYTES
    for entry in final.entries:
        if entry.kind != "f" or entry.path not in wanted:
            continue
        kind = file_kind(entry.path)
        before = start.get(entry.path)
        row = {
            "path": entry.path,
            "sha256": entry.digest,
            "size": entry.size,
            "kind": kind,
            "before_sha256": before.digest if before is not None and before.kind == "f" else None,
            "stored": False,
        }
        cap = MAX_IMAGE_BYTES if kind == "image" else MAX_TEXT_BYTES
        if kind != "binary" and entry.size <= min(cap, budget):
            for digest, source in (
                (entry.digest, store),
                (row["before_sha256"], base.states.store),
            ):
                if digest is None or (blobs / digest).exists():
                    continue
                data = source.read_blob(digest)
                if len(data) > cap:
                    continue
                write_atomic(blobs / digest, data)
                budget -= len(data)
            row["stored"] = (blobs / entry.digest).exists()
        out.append(row)
    return out


def write_episode(out_dir: str | Path, key: str, info: dict[str, Any], env: Any = None) -> None:
    """Write ``OUT/episodes/<key>.json`` (and its files' contents under ``episodes/blobs``).

    Never raises: a trace is for people, and a cell's score must not depend on it.
    """
    episodes = Path(out_dir) / EPISODES_DIR
    try:
        trace = episode_trace(info)
        if env is not None:
            try:
                trace["files"] = capture_files(env, trace, episodes / BLOBS_DIR)
            except Exception as exc:  # noqa: BLE001 - the trace without files still helps
                trace["files_error"] = f"{type(exc).__name__}: {exc}"
        episodes.mkdir(parents=True, exist_ok=True)
        write_atomic(episodes / f"{key}.json", json.dumps(trace, default=str))
    except Exception as exc:  # noqa: BLE001 - see the docstring
        print(f"bat-gym eval: the trace of {key} was not written ({exc})", file=sys.stderr)
