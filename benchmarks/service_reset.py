"""Reset latency with and without service state, on the radiology suite.

Plays one radiology E2E state: each round stores a finding on the server and writes a
file (so reset has both to undo), then times ``reset``. "workspace" is the same
benchmark with its service switched off (the workspace restore alone); "workspace +
Orthanc" restores the server too. Needs Debian's ``orthanc``.

    python benchmarks/service_reset.py --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from bat_gym.bank.states import MemoryStates, initial_state
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.core.sandbox.snapshot import BlobStore
from bat_gym.env import StageEnv
from bat_gym.envs.radiology import Radiology

__all__ = ["main"]


class WorkspaceOnly(Radiology):
    """The radiology suite without its server: the workspace-only reset."""

    def make_service(self):  # noqa: D102
        return None


def _time(bench, state, store, rounds: int) -> list[float]:
    hermes = get_protocol("hermes")
    uses_service = bench.make_service() is not None
    env = StageEnv("E2E", benchmark=bench, states=MemoryStates(store, [state]))
    times = []
    try:
        env.reset(options={"state_id": state.state_id})
        studies = bench.service_blobs(bench.task_of_state(state))
        study_uid, series_uid = next(iter(studies)).split("/")[1:3]
        for _ in range(rounds):
            calls = [
                ToolCall(
                    name="execute_code",
                    arguments={"language": "bash", "code": "echo x > scratch.txt"},
                )
            ]
            if uses_service:
                args = {
                    "study_uid": study_uid,
                    "series_uid": series_uid,
                    "lesion_diameter_mm": 1.0,
                    "change": "stable",
                }
                calls.append(ToolCall(name="submit_finding", arguments=args))
            env.step(hermes.render("", calls))
            t0 = time.perf_counter()
            env.reset(options={"state_id": state.state_id})
            times.append(time.perf_counter() - t0)
    finally:
        env.close()
    return times


def main() -> None:
    """Print reset p50 and p90 (ms) with and without the server's state."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    store = BlobStore(tempfile.mkdtemp(prefix="bat-gym-reset-"))
    state = initial_state(Radiology(), args.seed, "lesion_growth", store, "hermes")
    for label, bench, st in (
        ("workspace", WorkspaceOnly(), state.model_copy(update={"service": None})),
        ("workspace + Orthanc", Radiology(), state),
    ):
        times = sorted(_time(bench, st, store, args.rounds))
        p50 = statistics.median(times) * 1000
        p90 = times[int(0.9 * (len(times) - 1))] * 1000
        print(f"{label:22s} reset p50 {p50:7.1f} ms  p90 {p90:7.1f} ms  (n={len(times)})")


if __name__ == "__main__":
    main()
