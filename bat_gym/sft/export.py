"""Train/validation splits grouped by source trajectory, and the JSONL export."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bat_gym.benchmark import Benchmark
from bat_gym.core.protocol import TOOLS, ToolProtocol, get_protocol
from bat_gym.sft.render import render_rows
from bat_gym.sft.rows import IGNORE_INDEX, SFTRejection, SFTRow, sft_rows

__all__ = ["split_rows", "export_sft"]


def split_rows(
    rows: Sequence[SFTRow], validation_fraction: float = 0.1
) -> tuple[list[SFTRow], list[SFTRow]]:
    """Split rows into train and validation, grouped by source trajectory.

    Trajectories are ordered by a hash of their id (stable across runs and machines,
    and independent of bank order); the first ``round(n * validation_fraction)`` (at
    least one when there are two or more trajectories and the fraction is positive)
    go to validation. Rows keep their input order within each split.

    Returns:
        ``(train, validation)``.
    """
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    ids = sorted(
        {r.trajectory_id for r in rows}, key=lambda t: hashlib.sha256(t.encode()).hexdigest()
    )
    n_val = round(len(ids) * validation_fraction)
    if validation_fraction > 0 and len(ids) >= 2:
        n_val = max(1, n_val)
    held = set(ids[:n_val])
    return (
        [r for r in rows if r.trajectory_id not in held],
        [r for r in rows if r.trajectory_id in held],
    )


def _line(row: SFTRow, enc: dict[str, list[int]]) -> str:
    # context and target go in as JSON strings: their message dicts differ in keys
    # (tool messages, calls with different arguments), which a columnar loader
    # would otherwise have to unify into sparse structs.
    record = {
        "row_id": row.row_id,
        "trajectory_id": row.trajectory_id,
        "stage": row.stage,
        "track": row.track,
        "outcome": row.outcome,
        "turn": row.turn,
        "context": json.dumps(list(row.context), ensure_ascii=False),
        "target": row.target.model_dump_json(),
        **enc,
    }
    return json.dumps(record, ensure_ascii=False) + "\n"


def export_sft(
    bank: Any,
    benchmark: Benchmark,
    tokenizer: Any,
    out_dir: str | Path,
    max_length: int,
    *,
    protocol: str | ToolProtocol | None = "hermes",
    validation_fraction: float = 0.1,
    rows: Sequence[SFTRow] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``train.jsonl``, ``validation.jsonl`` and ``manifest.json`` into ``out_dir``.

    Each line holds the row's metadata, its ``context`` and ``target`` (JSON strings)
    and the tokenized ``input_ids``, ``labels``, ``attention_mask`` (unpadded). Load
    with ``datasets.load_dataset("json", data_files={"train": ..., "validation": ...})``.

    Args:
        bank: the Stage Bank.
        benchmark: its benchmark.
        tokenizer: a Hugging Face tokenizer with a chat template.
        out_dir: where to write (created if missing).
        max_length: rows rendering longer than this are rejected, never clipped.
        protocol: tool-call syntax (see :func:`chat_messages`); it is also the protocol
            the replay uses, or ``hermes`` when ``None``.
        validation_fraction: share of trajectories held out for validation.
        rows: precomputed :func:`sft_rows` output (skips the replay).
        chat_template_kwargs: extra ``apply_chat_template`` arguments (e.g.
            ``{"enable_thinking": False}``); recorded in the manifest.

    Returns:
        The manifest: row counts per split, trajectories per split, the chat template
        arguments, and the rejections (counts by reason, and each rejected row with its
        detail).
    """
    if rows is None:
        rows = sft_rows(bank, benchmark, protocol=protocol if protocol is not None else "hermes")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, validation = split_rows(rows, validation_fraction)
    manifest: dict[str, Any] = {
        "benchmark": benchmark.name,
        "max_length": max_length,
        "protocol": get_protocol(protocol).name if protocol is not None else "template",
        "tokenizer": getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__,
        "chat_template_kwargs": dict(chat_template_kwargs or {}),
        "rows": len(rows),
        "splits": {},
        "rejected": 0,
        "rejected_by_reason": {},
        "rejections": [],
    }
    rejected_all: list[SFTRejection] = []
    for name, part in (("train", train), ("validation", validation)):
        rendered, rejected = render_rows(
            part,
            tokenizer,
            max_length,
            protocol,
            tools=TOOLS,
            chat_template_kwargs=chat_template_kwargs,
        )
        (out / f"{name}.jsonl").write_text("".join(_line(r, e) for r, e in rendered))
        rejected_all += rejected
        manifest["splits"][name] = {
            "rows": len(rendered),
            "trajectories": len({r.trajectory_id for r in part}),
            "tokens": sum(len(e["input_ids"]) for _, e in rendered),
            "target_tokens": sum(
                sum(1 for t in e["labels"] if t != IGNORE_INDEX) for _, e in rendered
            ),
        }
    manifest["rejected"] = len(rejected_all)
    manifest["rejected_by_reason"] = dict(sorted(Counter(r.reason for r in rejected_all).items()))
    manifest["rejections"] = [r.model_dump() for r in rejected_all]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest
