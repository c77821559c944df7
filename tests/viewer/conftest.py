"""Fixtures of the viewer tests: real tiny evaluations of toy_pipeline, and runs built in code."""

import hashlib
import json
import shutil

import pytest

from bat_gym.evaluation import EvalConfig, evaluate
from bat_gym.policies import PolicyOutput, ScriptedPolicy, make_policy

from .artifacts import nifti_bytes, png_bytes

CFG = EvalConfig(repeats=1, workers=2, progress=False)


@pytest.fixture(scope="session")
def eval_ok(toy, tmp_path_factory):
    """The scripted teacher on one held-out task per track: every item passes."""
    out = tmp_path_factory.mktemp("view") / "eval-ok"
    evaluate(toy, make_policy("teacher"), out, CFG)
    return out


class Sloppy(ScriptedPolicy):
    """The teacher, but its Validate turn writes a wrong pilot and exits 1."""

    BAD = (
        '<tool_call>{"name": "execute_code", "arguments": {"language": "bash", "code": '
        '"mkdir -p validation && echo id,score > validation/pilot.csv && exit 1"}}</tool_call>'
    )

    def __init__(self) -> None:
        super().__init__("teacher")

    def act_batch(self, requests):
        out = super().act_batch(requests)
        return [
            PolicyOutput(self.BAD) if r.context.turn == 2 else o
            for r, o in zip(requests, out, strict=True)
        ]


@pytest.fixture(scope="session")
def eval_fail(toy, tmp_path_factory):
    """A sloppy Validate stage: items fail, with evidence pointing at calls."""
    out = tmp_path_factory.mktemp("view") / "eval-fail"
    evaluate(toy, Sloppy(), out, CFG)
    return out


@pytest.fixture(scope="session")
def eval_images(eval_fail, tmp_path_factory):
    """``eval_fail`` with a NIfTI mask and a PNG written by the first call of one episode."""
    out = tmp_path_factory.mktemp("view") / "eval-images"
    shutil.copytree(eval_fail, out)
    path = sorted((out / "episodes").glob("*.json"))[0]
    trace = json.loads(path.read_text())
    blobs = out / "episodes" / "blobs"
    call = trace["record"]["calls"][0]
    for name, data in (
        ("outputs/mask.nii.gz", nifti_bytes()),
        ("outputs/overlay.png", png_bytes()),
    ):
        sha = hashlib.sha256(data).hexdigest()
        (blobs / sha).write_bytes(data)
        trace["files"].append(
            {
                "path": name,
                "sha256": sha,
                "size": len(data),
                "kind": "image",
                "before_sha256": None,
                "stored": True,
            }
        )
        call["writes"] = [*(call.get("writes") or []), name]
    path.write_text(json.dumps(trace))
    return out
