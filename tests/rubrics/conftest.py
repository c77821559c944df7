"""Hand-made frozen workspaces and execution records for rubric tests."""

from __future__ import annotations

import json

import pytest

from bat_gym.core.record import ExecutionRecord, ToolCallRecord
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.envs.skill_ladder.tasks import label_accuracy
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.workspace import FrozenWorkspace

CASES = ["case001", "case002", "case003"]
LABELS = {"case001": 1, "case002": 0, "case003": 1}
START = {
    "task.json": json.dumps({"submission": {"columns": ["id", "label"], "case_ids": CASES}}),
    "data/cases.csv": "id,value\ncase001,4.2\ncase002,0.3\ncase003,9.9\n",
    "model/model.json": '{"threshold": 1.0}',
    "TASK.md": "# task\n",
}


def call(index, code, *, exit_code=0, changed=True, restarted=False, timed_out=False):
    """A tool call record; ``changed`` decides whether the workspace digest moved."""
    return ToolCallRecord(
        index=index,
        turn=index,
        language="bash",
        code=code,
        exit_code=None if (restarted or timed_out) else exit_code,
        duration_s=0.01,
        output="",
        output_bytes=0,
        timed_out=timed_out,
        restarted=restarted,
        digest_before=f"{index:064x}",
        digest_after=f"{index + (1 if changed else 0):064x}",
    )


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "store")


@pytest.fixture
def make_ctx(store):
    """Build a CheckContext: ``files`` are laid over ``start`` (None deletes a path)."""

    def make(files=None, *, start=None, calls=(), answers=None, metric=None, spec=None):
        start = dict(START if start is None else start)
        final = {**start, **(files or {})}
        final = {p: c for p, c in final.items() if c is not None}
        oracle = None
        if answers is not None or metric is not None:
            # The pilot is scored by label accuracy of its rows (as skill_ladder scores one).
            labels = (answers or {}).get("labels")
            pilot = None
            if labels is not None:

                def pilot(ws, path):
                    return label_accuracy(ws, path, labels, scored=None)

            oracle = TaskOracle(lambda: answers or {}, metric or (lambda ws: None), pilot)
        start_ws = FrozenWorkspace.from_files(store, start)
        return CheckContext(
            workspace=FrozenWorkspace.from_files(store, final),
            start=start_ws,
            record=ExecutionRecord(start_digest=start_ws.digest, calls=list(calls)),
            task=oracle,
            spec=spec,
        )

    return make
