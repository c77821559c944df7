"""``evaluate``: one policy, one benchmark's held-out cells, a results directory.

Writes into ``out_dir``:

* ``cells/<key>.json``: one result per finished cell (what makes a rerun resume);
* ``manifest.json``: policy identity, benchmark and contract digests, cells and seeds,
  settings, versions and timings: what reproduces every figure;
* ``report.json``, ``report.md``, ``stages.png``: the evaluation-side report;
* ``aggregates.json``: the firewall output, the only file training may read.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bat_gym.benchmark import Benchmark
from bat_gym.core.errors import BatGymError
from bat_gym.evaluation.aggregates import aggregate
from bat_gym.evaluation.cells import Cell
from bat_gym.evaluation.harness import EvalConfig, held_out_cells, run_cells
from bat_gym.evaluation.manifest import EvalManifest, Timing, read_manifest
from bat_gym.evaluation.report import (
    EvalReport,
    bootstrap_interval,
    write_markdown,
    write_stage_chart,
)
from bat_gym.policies.base import Policy

__all__ = ["evaluate", "evaluate_spec", "AGGREGATES_FILE", "REPORT_FILE", "MANIFEST_FILE"]

AGGREGATES_FILE = "aggregates.json"
REPORT_FILE = "report.json"
MANIFEST_FILE = "manifest.json"
_IDENTITY_FILE = "run.json"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def _versions() -> dict[str, str]:
    names = ["bat-gym", "gymnasium", "pydantic", "numpy"]
    # Only report the heavy libraries when this process actually uses them.
    names += [m for m in ("torch", "transformers", "vllm") if m in sys.modules]
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _identity(
    bench: Benchmark, policy: Policy, cells: list[Cell], cfg: EvalConfig
) -> dict[str, Any]:
    """What must not change between a run and its resumption."""
    library = bench.contract_library()
    return {
        "policy": {"name": policy.name, **policy.identity()},
        "benchmark": {
            "name": bench.name,
            "version": bench.spec.version,
            "contracts": {c.id: c.ref.sha256 for c in library},
        },
        "cells": [c.model_dump() for c in cells],
        "settings": {
            "protocol": cfg.protocol,
            "backend": cfg.backend,
            "budgets": (cfg.budgets or bench.spec.budgets).model_dump(),
        },
    }


def _check_resumable(out: Path, identity: dict[str, Any]) -> None:
    path = out / _IDENTITY_FILE
    if not path.exists():
        path.write_text(_dumps(identity), encoding="utf-8")
        return
    before = json.loads(path.read_text(encoding="utf-8"))
    # Compare through JSON so tuples and lists, ints and floats compare as written.
    now = json.loads(_dumps(identity))
    changed = sorted(k for k in now if before.get(k) != now[k])
    if changed:
        raise BatGymError(
            f"{out} holds an evaluation with another {', '.join(changed)}; finished cells of a "
            "different run cannot be mixed in. Use a new --out directory, or delete this one."
        )


def _timing(out: Path, started: str, wall_s: float) -> Timing:
    """This invocation's timing, added to what earlier invocations of the run recorded.

    ``started`` is the first invocation's start, ``wall_s`` the seconds of every
    invocation together and ``invocations`` their count, so a resumed evaluation
    reports its whole cost, not only what its last part took.
    """
    try:
        before = read_manifest(out / MANIFEST_FILE).timing
    except BatGymError:
        # No manifest (the first invocation, or one killed before writing it) or an
        # unreadable one: the run's time is counted from this invocation.
        return Timing(started=started, wall_s=wall_s, invocations=1)
    return Timing(
        started=before.started, wall_s=wall_s + before.wall_s, invocations=before.invocations + 1
    )


def evaluate(
    benchmark: str | Benchmark | None,
    policy: Policy,
    out_dir: str | Path,
    cfg: EvalConfig | None = None,
) -> EvalReport:
    """Evaluate ``policy`` on the benchmark's held-out cells; resume what ``out_dir`` holds.

    Args:
        benchmark: a registered name, an instance, or None for the default benchmark.
        policy: the policy (see :func:`bat_gym.policies.make_policy`).
        out_dir: the results directory (created; reused to resume).
        cfg: cells and settings; default :class:`EvalConfig()` (every track, the
            benchmark's ``splits.heldout_repeats`` repeats).

    Returns:
        The report (also written to ``out_dir``).

    Raises:
        BatGymError: ``out_dir`` holds a run of another policy, benchmark or cell set.
        UnsupportedPolicy: the policy cannot play this benchmark (checked before any
            cell runs: say, ``naive`` on a benchmark without a naive baseline).
    """
    from bat_gym.catalog import get_benchmark

    cfg = cfg or EvalConfig()
    bench = benchmark if isinstance(benchmark, Benchmark) else get_benchmark(benchmark)
    policy.check_benchmark(bench)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = held_out_cells(bench, cfg)
    identity = _identity(bench, policy, cells, cfg)
    _check_resumable(out, identity)
    policy.check_ready()  # a server that is down: one error now, not one per cell

    started, t0 = datetime.now(UTC), time.perf_counter()
    results = run_cells(bench, policy, cells, out, cfg)
    timing = _timing(out, started.isoformat(), time.perf_counter() - t0).model_copy(
        update={"episode_wall_s_total": sum(r.wall_s for r in results)}
    )

    aggregates = aggregate(results, bench.spec)
    metrics = ["overall", "task", "agentic", *aggregates.stages]
    intervals = {m: bootstrap_interval(results, m) for m in metrics}
    manifest = EvalManifest.model_validate(
        {
            **json.loads(_dumps(identity)),
            # What the policy reported while playing (an external agent's own name).
            "policy": json.loads(_dumps({**identity["policy"], **policy.observed()})),
            "cells": [
                {**c.model_dump(), "task_id": r.task_id}
                for c, r in zip(cells, results, strict=True)
            ],
            "settings": json.loads(
                _dumps(
                    {
                        **identity["settings"],
                        **{k: v for k, v in asdict(cfg).items() if k != "budgets"},
                    }
                )
            ),
            "versions": _versions(),
            "timing": timing,
        }
    ).to_json()
    report = EvalReport(
        manifest=json.loads(manifest),
        aggregates=aggregates,
        intervals=intervals,
        cells=tuple(results),
    )
    (out / MANIFEST_FILE).write_text(manifest, encoding="utf-8")
    (out / REPORT_FILE).write_text(report.model_dump_json(indent=1) + "\n", encoding="utf-8")
    write_stage_chart(aggregates, intervals, out / "stages.png")
    write_markdown(report, out / "report.md", chart="stages.png")
    aggregates.write(out / AGGREGATES_FILE)
    return report


def evaluate_spec(
    benchmark: str | Benchmark | None,
    spec: str,
    out_dir: str | Path,
    cfg: EvalConfig | None = None,
    **options: Any,
) -> EvalReport:
    """:func:`evaluate` the policy a spec names, built for this run and closed after it.

    How a checkpoint is scored on the held-out cells: ``evaluate_spec(bench,
    "hf:runs/sft/final", "runs/eval", cfg, max_new_tokens=256, temperature=0.7, seed=0)``.

    Args:
        benchmark: as for :func:`evaluate`.
        spec: the policy spec (``hf:DIR``, ``vllm:DIR``, ``teacher``; see
            :func:`bat_gym.policies.make_policy`).
        out_dir: the results directory (resumed as :func:`evaluate` resumes it).
        cfg: cells and settings, as for :func:`evaluate`.
        **options: the policy kind's build options (``max_new_tokens``,
            ``temperature``, ``seed``, ``max_batch_size``, ...).
    """
    from bat_gym.policies import make_policy

    policy = make_policy(spec, **options)
    try:
        return evaluate(benchmark, policy, out_dir, cfg)
    finally:
        policy.close()
