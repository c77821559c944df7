"""How long the verifier takes to score one finished rollout.

Scores a 20-file frozen workspace with a 24-call execution record against a 10-item
stage contract (and, for comparison, the reference E2E contract: five stage contracts,
27 items, plus the task metric). Every repeat builds a fresh CheckContext, so no file
read or parsed result is reused between rollouts; the blob store and the OS page cache
are warm, as they are during training. Target: p50 under 10 ms.

``--medbench`` also times the whole verification of real MedBench-Lite E2E episodes
played by the teacher (one per track): the freeze, the reference run (cached per task
after its first use), the verifier's reproduction of the shipped pipeline in a fresh
sandbox, and the task metric; first verification of a task next to a second one of
the same final workspace, and one after the shipped pipeline was edited, which the
verifier must then run again.

    python benchmarks/verifier_speed.py [--repeats 2000] [--medbench]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from bat_gym.core.record import ExecutionRecord, ToolCallRecord
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.envs.toy_pipeline.suite import SPEC
from bat_gym.rubrics.contract.context import CheckContext, TaskOracle
from bat_gym.rubrics.contract.model import ContractLibrary, RubricContract
from bat_gym.rubrics.contract.workspace import FrozenWorkspace
from bat_gym.rubrics.verifier.verdict import verify

CASES = [f"case{i:03d}" for i in range(40)]
LABELS = {c: i % 2 for i, c in enumerate(CASES)}
SUBMISSION = "id,label\n" + "".join(f"{c},{y}\n" for c, y in LABELS.items())
PILOT = f"id,label\n{CASES[0]},{LABELS[CASES[0]]}\n"

START = {
    "task.json": json.dumps({"submission": {"columns": ["id", "label"], "case_ids": CASES}}),
    "TASK.md": "# task\n\nScore every case.\n",
    "data/cases.csv": "id,value\n" + "".join(f"{c},{i * 0.37:.3f}\n" for i, c in enumerate(CASES)),
    "model/model.json": json.dumps({"kind": "threshold", "threshold": 2.5, "unit": "cm"}),
    "model/MODEL_CARD.md": "# Model card\n\nThresholds a measurement in centimetres.\n",
}


def receipt(stage: str, artifact: str, content: str) -> str:
    sha = hashlib.sha256(content.encode()).hexdigest()
    return json.dumps({"schema_version": 1, "stage": stage, "artifact": artifact, "sha256": sha})


FINAL = {
    **START,
    "plan/plan.md": "# Plan\n\n## Preprocess\nunits\n\n## Inference\nrun\n\n## Postprocess\nwrite\n",
    "setup/environment.json": json.dumps({"python": "3.11.9", "numpy": "2.1.0"}),
    "pipeline/infer.py": "import csv, json, sys\n" * 40,
    "validation/pilot.csv": PILOT,
    "validation/s3_validation.json": receipt("S3", "validation/pilot.csv", PILOT),
    "outputs/predictions.csv": SUBMISSION,
    "validation/s4_completion.json": receipt("S4", "outputs/predictions.csv", SUBMISSION),
    "outputs/submission.csv": SUBMISSION,
    "validation/s5_submission.json": receipt("S5", "outputs/submission.csv", SUBMISSION),
    **{f"scratch/note{i}.txt": f"note {i}\n" * 20 for i in range(6)},
}
assert len(FINAL) == 20

CODES = [
    "cat task.json; head data/cases.csv",
    "cat > plan/plan.md <<EOF ... EOF",
    "python write_setup.py setup/environment.json pipeline/infer.py",
    "python pipeline/infer.py validation/pilot.csv case000 && receipt validation/s3_validation.json",
    "python pipeline/infer.py outputs/predictions.csv && receipt validation/s4_completion.json",
    "cp outputs/predictions.csv outputs/submission.csv && receipt validation/s5_submission.json",
]
CALLS = [
    ToolCallRecord(
        index=i,
        turn=i,
        language="bash",
        code=CODES[i % len(CODES)] + f"  # step {i}",
        exit_code=1 if i % 7 == 6 else 0,
        duration_s=0.05,
        output="ok\n" * 50,
        output_bytes=150,
        digest_before=f"{i:064x}",
        digest_after=f"{i + (i % 4 != 0):064x}",
    )
    for i in range(24)
]

IDS = {"file": "task.json", "key": "submission.case_ids"}
TEN_ITEMS = RubricContract.model_validate(
    {
        "id": "speed",
        "version": "1",
        "focus": "S5",
        "gates": ["successful_change"],
        "items": [
            {
                "id": "plan",
                "check": "markdown_sections",
                "args": {
                    "path": "plan/plan.md",
                    "sections": ["Preprocess", "Inference", "Postprocess"],
                },
            },
            {
                "id": "env",
                "check": "json_valid",
                "args": {"path": "setup/environment.json", "keys": {"python": "string"}},
            },
            {"id": "pipeline", "check": "file_nonempty", "args": {"path": "pipeline/infer.py"}},
            {
                "id": "pilot",
                "check": "matches_answers",
                "args": {"path": "validation/pilot.csv", "answers_key": "labels"},
            },
            {
                "id": "ran",
                "check": "command_ran",
                "args": {"mentions": ["pipeline/infer.py", "predictions"]},
                "requires": ["execution"],
            },
            {
                "id": "complete",
                "check": "csv_schema",
                "args": {
                    "path": "outputs/predictions.csv",
                    "columns": ["id", "label"],
                    "case_ids": IDS,
                },
            },
            {
                "id": "schema",
                "check": "csv_schema",
                "args": {
                    "path": "outputs/submission.csv",
                    "columns": ["id", "label"],
                    "types": {"label": "int"},
                    "case_ids": IDS,
                },
            },
            {
                "id": "receipt",
                "check": "receipt_valid",
                "args": {
                    "path": "validation/s5_submission.json",
                    "artifact": "outputs/submission.csv",
                    "stage": "S5",
                },
                "requires": ["artifact", "execution"],
            },
            {
                "id": "written",
                "check": "written_by_tool",
                "args": {"paths": ["outputs/submission.csv", "validation/s5_submission.json"]},
                "requires": ["artifact", "execution"],
            },
            {
                "id": "inputs",
                "check": "unchanged",
                "args": {"paths": ["data/", "model/", "task.json", "TASK.md"]},
                "guard": True,
            },
        ],
    }
)


def accuracy(ws: FrozenWorkspace) -> float:
    rows = dict(line.split(",") for line in ws.read_text("outputs/submission.csv").splitlines()[1:])
    return sum(int(rows[c]) == y for c, y in LABELS.items()) / len(LABELS)


# What each stage row starts without: its own artifacts and every later stage's.
LATER = {
    "S3": ("validation/pilot.csv", "validation/s3_validation.json"),
    "S4": ("outputs/predictions.csv", "validation/s4_completion.json"),
    "S5": ("outputs/submission.csv", "validation/s5_submission.json"),
}


def stage_start(focus: str) -> dict[str, str]:
    """The FINAL workspace as a ``focus`` stage row would start from it."""
    stages = list(LATER)
    dropped = {p for s in stages[stages.index(focus) :] for p in LATER[s]}
    return {p: c for p, c in FINAL.items() if p not in dropped}


def measure(contract: RubricContract, store: BlobStore, start, final, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ctx = CheckContext(
            workspace=FrozenWorkspace(final, store),
            start=FrozenWorkspace.load(store, start.digest),
            record=ExecutionRecord(start_digest=start.digest, calls=CALLS),
            task=TaskOracle(lambda: {"labels": LABELS}, accuracy),
            spec=SPEC,
        )
        verdict = verify(contract, ctx)
        times.append((time.perf_counter() - t0) * 1e3)
        if verdict.reward != 1.0:
            raise SystemExit(f"expected reward 1.0, got {verdict.reward}: {verdict.notes}")
    return times


def report(name: str, times: list[float]) -> None:
    ordered = sorted(times)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(f"{name:<44} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   ({len(times)} rollouts)")


def medbench_episodes() -> None:
    """Whole E2E verifications of teacher episodes, one per MedBench-Lite track."""
    from bat_gym.catalog import get_benchmark
    from bat_gym.core.protocol import get_protocol
    from bat_gym.env import StageEnv
    from bat_gym.rubrics.verifier.reward import RubricReward

    bench = get_benchmark("medbench_lite")
    proto = get_protocol("hermes")
    env = RubricReward(StageEnv("E2E", benchmark=bench))
    try:
        print("MedBench-Lite E2E episode, whole verification (first / again):")
        for track in [t.name for t in bench.spec.tracks]:
            ids = [
                i for i in env.unwrapped.states.select(focus="E2E", track=track) if "success" in i
            ]
            env.reset(options={"state_id": ids[0]})
            task = bench.task_of_state(env.unwrapped.state)
            for turn in bench.teacher_turns(task)[:-1]:  # all but finish: scored below
                env.step(proto.render(turn.content, list(turn.calls)))
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                verdict = env.score_episode()
                times.append(time.perf_counter() - t0)
            # A shipped pipeline that differs from the reference run's (one comment more)
            # is run again by the verifier in a fresh sandbox.
            edit = '{"name": "execute_code", "arguments": {"language": "bash", "code": "echo >> pipeline/infer.py"}}'
            env.step(f"<tool_call>{edit}</tool_call>")
            t0 = time.perf_counter()
            env.score_episode()
            rerun = time.perf_counter() - t0
            print(
                f"  {track:<15} {times[0]:6.2f} s / {times[1]:6.2f} s; with a reproduction "
                f"{rerun:6.2f} s   reward {verdict.reward:.3f}"
            )
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000, help="rollouts scored per contract")
    parser.add_argument("--medbench", action="store_true", help="also time MedBench-Lite episodes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bat-verifier-speed-") as tmp:
        store = BlobStore(Path(tmp))
        start = FrozenWorkspace.from_files(store, START).snapshot
        final = FrozenWorkspace.from_files(store, FINAL).snapshot
        print(f"workspace: {len(FINAL)} files; record: {len(CALLS)} calls")
        report("10-item stage contract", measure(TEN_ITEMS, store, start, final, args.repeats))
        library = ContractLibrary.reference()
        for focus in LATER:  # the stage contracts on stage rows (no reference run here)
            row_start = FrozenWorkspace.from_files(store, stage_start(focus)).snapshot
            report(
                f"reference {focus} contract (stage row)",
                measure(library.for_focus(focus), store, row_start, final, args.repeats),
            )
        e2e = library.by_id("e2e")
        report(
            "reference E2E contract (5 stages, 27 items)",
            measure(e2e, store, start, final, args.repeats),
        )
    if args.medbench:
        medbench_episodes()


if __name__ == "__main__":
    main()
