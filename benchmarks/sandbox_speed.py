"""How fast sandboxes reset and step, next to the naive way of doing the same.

For each backend that is available here it measures, in one run:

* reset: restoring a 5 MB, 50-file workspace snapshot after agent code changed a few
  files, next to ``shutil.rmtree`` + ``shutil.copytree`` of the same files; and the
  same reset after 10 and after 1,000 earlier steps, which must cost the same;
* step: ``execute_code("bash", "true")`` and ``("python", "pass")``, each with the
  ``digest()`` before and after that the environment takes for its execution record,
  next to ``subprocess.run(["bash", "-c", "true"])``; and the python step again with a
  30 ms pause before each call, as a policy's turn leaves between calls;
* provenance: ``execute_code("bash", "/bin/true")`` (one program run, which the
  sandbox records with its argv and exit status) with ``observe=True`` (the default)
  next to the same sandbox made with ``observe=False``;
* throughput: steps/s of ``bash: true`` summed over 8 processes, each owning one
  sandbox, next to 8 processes making plain subprocess calls.

Usage: python benchmarks/sandbox_speed.py [--backend local|docker|all] [--iters N]
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path

from bat_gym.core.errors import SandboxUnavailable
from bat_gym.core.sandbox import Sandbox, Snapshot, WorkspaceIndex, make_sandbox

FILES = 50
FILE_BYTES = 100 * 1024  # 50 x 100 KiB = 5 MiB
WORKERS = 8
THINK_S = 0.03  # a pause before each step of the "after a pause" row
HISTORY_BUDGET_S = 60.0  # per history length; bounds a slow machine's 1,000-step episodes
# What an agent does between resets: edit two files, delete one, add one.
AGENT_EDITS = "echo edit >> d0/f00.bin; echo edit >> d3/f31.bin; rm d4/f42.bin; echo new > new.txt"
TARGETS = {
    "reset_p50_ms": {"local": 5.0, "docker": 30.0},
    "reset_p99_ms": {"local": 10.0},
    "bash_p50_ms": {"local": 0.5, "docker": 5.0},
    "python_p50_ms": {"local": 5.0, "docker": 5.0},
    "bash_ratio_p50": {"local": 0.25},
    "steps_per_s": {"local": 5000.0},
}


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (0 < q <= 100)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def timed(
    fn: Callable[[], object], iters: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Milliseconds per call of ``fn``, each after an untimed ``before``."""
    gc.collect()
    out = []
    for _ in range(iters):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def progress(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def make_files(root: Path) -> None:
    """The benchmark workspace: 50 files of random bytes in 5 directories."""
    for i in range(FILES):
        path = root / f"d{i // 10}" / f"f{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(FILE_BYTES))


def seed_workspace(sb: Sandbox, tmp: Path) -> Snapshot:
    """Put the benchmark files in the sandbox's workspace, owned as restores own them."""
    src = tmp / f"seed-{sb.backend}"
    src.mkdir()
    make_files(src)
    snap = WorkspaceIndex(src).capture(sb.store)
    sb.restore(snap)
    assert sb.digest() == snap.digest
    return snap


def agent_edits(sb: Sandbox) -> None:
    r = sb.execute_code("bash", AGENT_EDITS)
    assert r.exit_code == 0, r.output


def step(sb: Sandbox, language: str, code: str) -> None:
    """One step as the environment takes it: digest, call, digest."""
    sb.digest()
    r = sb.execute_code(language, code)  # type: ignore[arg-type]
    sb.digest()
    if r.exit_code != 0:
        raise RuntimeError(f"{language} step failed: {r}")


def namespace_cpu_s(pid_ns: str) -> float:
    """CPU seconds used by the processes of a PID namespace, their reaped children included."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != pid_ns:
                continue
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def cpu_per_step(sb: Sandbox, steps: int) -> float:
    """CPU seconds one bash step costs, in this process and in the sandbox together.

    The number of CPUs divided by this is the most steps per second that sandboxes can
    make together on an otherwise idle machine; other load is why a measured rate can
    fall short of it.
    """
    pid_ns = sb.execute_code("bash", "readlink /proc/self/ns/pid").output.strip()
    sandbox0, host0 = namespace_cpu_s(pid_ns), time.process_time()
    for _ in range(steps):
        step(sb, "bash", "true")
    return (namespace_cpu_s(pid_ns) - sandbox0 + time.process_time() - host0) / steps


@dataclass
class Row:
    """One metric of the table.

    ``cells`` holds the text per column, ``ok`` whether a cell meets its target, and
    ``p50`` the median in milliseconds behind a latency cell.
    """

    label: str
    cells: dict[str, str] = field(default_factory=dict)
    ok: dict[str, bool] = field(default_factory=dict)
    p50: dict[str, float] = field(default_factory=dict)


def ms(p50: float, p99: float) -> str:
    return f"{p50:.2f} / {p99:.2f} ms"


def bench_backend(backend: str, iters: int, tmp: Path, rows: dict[str, Row]) -> None:
    sb = make_sandbox(backend)
    try:
        snap = seed_workspace(sb, tmp)

        progress(f"{backend}: reset")
        reset = timed(lambda: sb.restore(snap), iters, before=lambda: agent_edits(sb))
        p50, p99 = percentile(reset, 50), percentile(reset, 99)
        rows["reset"].cells[backend] = ms(p50, p99)
        ok = p50 < TARGETS["reset_p50_ms"][backend]
        if backend in TARGETS["reset_p99_ms"]:
            ok = ok and p99 < TARGETS["reset_p99_ms"][backend]
        rows["reset"].ok[backend] = ok

        progress(f"{backend}: reset after 10 and after 1,000 steps")
        after, count = {}, {}
        for steps in (10, 1000):
            samples: list[float] = []
            budget = time.monotonic() + HISTORY_BUDGET_S
            # Every sample is a whole episode of `steps` steps; a slow backend gets fewer.
            while len(samples) < max(5, iters // 20) and (not samples or time.monotonic() < budget):
                for _ in range(steps - 1):
                    step(sb, "bash", "true")
                samples += timed(lambda: sb.restore(snap), 1, lambda: agent_edits(sb))
            after[steps], count[steps] = percentile(samples, 50), len(samples)
        rows["reset_history"].cells[backend] = (
            f"{after[10]:.2f} / {after[1000]:.2f} ms ({after[1000] / after[10]:.2f}x,"
            f" n={count[10]}/{count[1000]})"
        )
        # "Does not grow": within noise of the short history, never a trend.
        rows["reset_history"].ok[backend] = after[1000] < 1.5 * after[10] + 0.5

        for language, code, key in (("bash", "true", "bash"), ("python", "pass", "python")):
            progress(f"{backend}: {language} steps")
            for _ in range(20):  # warm caches and the forked-ahead shell
                step(sb, language, code)
            samples = timed(lambda: step(sb, language, code), iters)  # noqa: B023
            rows[key].cells[backend] = ms(percentile(samples, 50), percentile(samples, 99))
            rows[key].p50[backend] = percentile(samples, 50)
            target = TARGETS[f"{key}_p50_ms"].get(backend)
            if target is not None:
                rows[key].ok[backend] = rows[key].p50[backend] <= target

        # As in an episode, where the policy takes a while to answer: what the sandbox
        # does between calls (a local sandbox forks the next python call ahead) counts.
        progress(f"{backend}: python steps after a pause")
        samples = timed(
            lambda: step(sb, "python", "pass"), iters, before=lambda: time.sleep(THINK_S)
        )
        rows["python_idle"].cells[backend] = ms(percentile(samples, 50), percentile(samples, 99))

        progress(f"{backend}: a program run, observed and not")
        blind = make_sandbox(backend, observe=False)
        try:
            p50 = {}
            for name, box in (("on", sb), ("off", blind)):
                for _ in range(20):
                    step(box, "bash", "/bin/true")
                samples = timed(lambda: step(box, "bash", "/bin/true"), iters)  # noqa: B023
                p50[name] = percentile(samples, 50)
            rows["exec"].cells[backend] = (
                f"{p50['on']:.2f} / {p50['off']:.2f} ms (+{p50['on'] - p50['off']:.2f} ms)"
            )
        finally:
            blind.close()

        # Both backends run every call under a supervisor in the sandbox's own PID
        # namespace, so its CPU (children reaped included) is that namespace's.
        per_step = cpu_per_step(sb, iters * 5)
        rows["cpu"].cells[backend] = (
            f"{per_step * 1e6:.0f} us (idle ceiling {os.cpu_count() / per_step:,.0f}/s)"
        )
    finally:
        sb.close()


def throughput_worker(
    backend: str | None, duration_s: float, start: Barrier, out: mp.Queue
) -> None:
    """Count steps for ``duration_s``: sandbox steps, or plain subprocesses if no backend."""
    sb = make_sandbox(backend) if backend else None
    try:
        if sb is not None:
            step(sb, "bash", "true")
        start.wait()
        n, deadline = 0, time.monotonic() + duration_s
        while time.monotonic() < deadline:
            if sb is not None:
                step(sb, "bash", "true")
            else:
                subprocess.run(["bash", "-c", "true"], check=True)
            n += 1
        out.put(n)
    finally:
        if sb is not None:
            sb.close()


def throughput(backend: str | None, duration_s: float) -> float:
    """Aggregate steps/s of ``WORKERS`` spawned processes running at once."""
    progress(f"{backend or 'baseline'}: {WORKERS} processes for {duration_s:g} s")
    ctx = mp.get_context("spawn")
    # The timeout breaks the barrier for all if one worker cannot start its sandbox.
    start, out = ctx.Barrier(WORKERS, timeout=120), ctx.Queue()
    procs = [
        ctx.Process(target=throughput_worker, args=(backend, duration_s, start, out))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    counts = [out.get(timeout=duration_s + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(counts) / duration_s


def bench_baselines(iters: int, tmp: Path, rows: dict[str, Row]) -> None:
    progress("baseline: rmtree + copytree, subprocess.run")
    pristine, work = tmp / "pristine", tmp / "baseline-ws"
    make_files(pristine)
    shutil.copytree(pristine, work)

    def edit() -> None:
        with open(work / "d0/f00.bin", "ab") as f:
            f.write(b"edit\n")
        with open(work / "d3/f31.bin", "ab") as f:
            f.write(b"edit\n")
        (work / "d4/f42.bin").unlink()
        (work / "new.txt").write_bytes(b"new\n")

    def reset() -> None:
        shutil.rmtree(work)
        shutil.copytree(pristine, work)

    samples = timed(reset, iters, before=edit)
    rows["reset"].cells["baseline"] = ms(percentile(samples, 50), percentile(samples, 99))
    rows["reset_history"].cells["baseline"] = "-"
    rows["python_idle"].cells["baseline"] = "-"
    bash = timed(lambda: subprocess.run(["bash", "-c", "true"], check=True), iters)
    rows["bash"].cells["baseline"] = ms(percentile(bash, 50), percentile(bash, 99))
    rows["bash"].p50["baseline"] = percentile(bash, 50)


def print_table(rows: dict[str, Row], columns: list[str], skipped: dict[str, str]) -> None:
    targets = {
        "reset": "local p50 < 5, p99 < 10 ms; docker p50 <= 30 ms",
        "reset_history": "no growth",
        "bash": "local p50 < 0.5 ms; docker p50 <= 5 ms",
        "exec": "-",
        "ratio": "local bash <= 0.25x",
        "python": "local p50 <= 5 ms; docker p50 <= 5 ms",
        "python_idle": "-",
        "throughput": "local >= 5,000/s",
        "cpu": "-",
    }

    def cell(row: Row, col: str) -> str:
        if col in skipped:
            return "skipped"
        text = row.cells.get(col, "-")
        if col in row.ok:
            text += "  ok" if row.ok[col] else "  MISS"
        return text

    header = ["metric", *columns, "target"]
    table = [header] + [
        [row.label, *(cell(row, c) for c in columns), targets[key]] for key, row in rows.items()
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for n, r in enumerate(table):
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    for backend, reason in skipped.items():
        print(f"\n{backend} skipped: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["local", "docker", "all"], default="all")
    parser.add_argument("--iters", type=int, default=300, help="timed calls per latency metric")
    parser.add_argument(
        "--duration", type=float, default=3.0, help="seconds of the 8-process throughput run"
    )
    args = parser.parse_args()
    backends = ["local", "docker"] if args.backend == "all" else [args.backend]

    rows = {
        "reset": Row("reset p50 / p99 (5 MB, 50 files, 4 edited)"),
        "reset_history": Row("reset p50 after 10 / 1,000 steps"),
        "bash": Row("step bash `true` p50 / p99 (+2 digests)"),
        "ratio": Row("step / baseline at p50 (bash / python)"),
        "exec": Row("step bash `/bin/true` p50, observed / not"),
        "python": Row("step python `pass` p50 / p99 (+2 digests)"),
        "python_idle": Row(f"the same, each after {THINK_S * 1e3:g} ms idle"),
        "throughput": Row(f"bash steps/s, {WORKERS} processes at once"),
        "cpu": Row("CPU per bash step, host + sandbox"),
    }
    skipped: dict[str, str] = {}
    print(
        f"bat_gym sandbox speed: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{args.iters} iterations, load average {os.getloadavg()[0]:.1f} at start\n"
    )
    with tempfile.TemporaryDirectory(prefix="bat_gym_bench_") as tmp_name:
        tmp = Path(tmp_name)
        bench_baselines(args.iters, tmp, rows)
        rows["throughput"].cells["baseline"] = f"{throughput(None, args.duration):,.0f}/s"
        for backend in backends:
            try:
                make_sandbox(backend).close()
            except (SandboxUnavailable, ImportError) as exc:
                skipped[backend] = str(exc)
                continue
            bench_backend(backend, args.iters, tmp, rows)
            base = rows["bash"].p50["baseline"]
            ratio = rows["bash"].p50[backend] / base
            rows["ratio"].cells[backend] = (
                f"{ratio:.2f}x / {rows['python'].p50[backend] / base:.2f}x"
            )
            if backend in TARGETS["bash_ratio_p50"]:
                rows["ratio"].ok[backend] = ratio <= TARGETS["bash_ratio_p50"][backend]
            rate = throughput(backend, args.duration)
            rows["throughput"].cells[backend] = f"{rate:,.0f}/s"
            if backend in TARGETS["steps_per_s"]:
                rows["throughput"].ok[backend] = rate >= TARGETS["steps_per_s"][backend]
    rows["ratio"].cells["baseline"] = "1.00x"
    rows["cpu"].cells["baseline"] = "-"
    rows["exec"].cells["baseline"] = "-"
    print_table(rows, ["baseline", *backends], skipped)


if __name__ == "__main__":
    sys.exit(main())
