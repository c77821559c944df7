"""Episodes as an Inspect eval log, so Inspect's viewer and analysis tools open bat_gym runs.

Format: Inspect's JSON eval log, version 2 (``inspect_ai.log.EvalLog``; documented at
inspect.aisi.org.uk, "Eval Logs" and "Log File Format"). One evaluation is one log and
each cell one sample, which is how Inspect itself stores an evaluation: ``eval`` holds
the task (the benchmark), the model (the policy) and the dataset; each sample holds
the conversation as Inspect chat messages (assistant tool calls, tool results), one
score named ``bat_gym`` whose value is the reward, and the per-stage verdict in the
score's metadata; ``results`` carries the headline scores.

Why Inspect's format and not Harbor's ATIF: both are documented and read by other
tools, and ATIF's per-trajectory shape would fit an episode as well; but Inspect's
reader (``inspect_ai.log.read_eval_log``) installs on every Python bat_gym supports,
so the export is checked by the tool itself (Harbor needs Python 3.12 or later), and
an evaluation of cells maps onto a log of samples one to one.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from bat_gym.rubrics.verifier.verdict import Verdict
from bat_gym.viewer.runs import Run

__all__ = [
    "INSPECT_LOG_VERSION",
    "inspect_log",
    "inspect_messages",
    "rollouts_log",
    "score_explanation",
]

INSPECT_LOG_VERSION = 2


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {"raw": raw}
    return raw if isinstance(raw, dict) else {"raw": raw}


def score_explanation(verdict: Verdict | dict[str, Any] | None) -> str | None:
    """A score's ``explanation``: the verdict's one line, then each failed item and why.

    ``<summary> | FAIL S3 item_id [check]: detail | ...``, the items in the
    verdict's order (null items, which were not judged, are not failures). Inspect's
    viewer shows it beside the score; the same line is written by the
    ``bat_gym.integrations.inspect`` scorer and by this export. None: no verdict.
    """
    if verdict is None or verdict == {}:
        return None
    if not isinstance(verdict, Verdict):
        verdict = Verdict.model_validate(verdict)
    failed = [
        f"FAIL {s.stage} {i.id} [{i.check}]: {i.detail}".rstrip(": ")
        for s in verdict.stages
        for i in s.items
        if i.passed is False
    ]
    return " | ".join([verdict.summary(), *failed])


def inspect_messages(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's conversation as Inspect ``ChatMessage`` objects (JSON).

    Assistant tool calls become ``ToolCall`` s; each tool result names the call and
    function it answers, with the exit status in its metadata; messages of the
    replayed prefix carry ``metadata.bat_gym_prefix = true``.
    """
    prefix = int(trace.get("prefix_messages") or 0)
    record = {f"call_{c['index']}": c for c in (trace.get("record") or {}).get("calls", [])}
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for i, m in enumerate(trace.get("messages") or []):
        role = m.get("role")
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content) if content else ""
        meta: dict[str, Any] = {"bat_gym_prefix": i < prefix}
        if role == "assistant":
            calls = []
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                names[tc.get("id", "")] = fn.get("name", "")
                calls.append({"id": tc.get("id", f"call_{len(calls)}"), "function": fn.get("name", ""),
                              "arguments": _arguments(fn.get("arguments")), "type": "function"})  # fmt: skip
            msg: dict[str, Any] = {"role": "assistant", "content": text, "source": "generate"}
            if calls:
                msg["tool_calls"] = calls
        elif role == "tool":
            rec = record.get(m.get("tool_call_id", ""))
            if rec is not None:
                meta.update(exit_code=rec.get("exit_code"), duration_s=rec.get("duration_s"),
                            writes=rec.get("writes"))  # fmt: skip
            msg = {"role": "tool", "content": text, "tool_call_id": m.get("tool_call_id"),
                   "function": m.get("name") or names.get(m.get("tool_call_id", ""))}  # fmt: skip
        elif role in ("system", "user"):
            msg = {"role": role, "content": text}
        else:
            continue
        msg["metadata"] = meta
        out.append(msg)
    return out


def _sample(run: Run, cell: dict[str, Any], epoch: int) -> dict[str, Any]:
    c = cell["cell"]
    key = f"{c['track']}-{c['seed']}-r{c['repeat']}"
    trace = run.episode(key) or {}
    messages = inspect_messages(trace) if trace else []
    first_user = next(
        (m["content"] for m in messages if m["role"] == "user"), cell.get("task_id", "")
    )
    verdict = trace.get("verdict") or {}
    score = {
        "value": cell.get("reward") if cell.get("reward") is not None else 0.0,
        "explanation": score_explanation(verdict),
        "metadata": {
            "overall": cell.get("overall"),
            "task": cell.get("task"),
            "agentic": cell.get("agentic"),
            "stages": cell.get("stages"),
            "failures": list(cell.get("failures") or []),
            "finished": cell.get("finished"),
            "contract": verdict.get("contract"),
            "verdict": verdict or None,
        },
    }
    return {
        "id": key,
        "epoch": epoch,
        "input": first_user,
        "target": "",
        "messages": messages,
        "scores": {"bat_gym": score},
        "metadata": {
            "track": c["track"],
            "seed": c["seed"],
            "repeat": c["repeat"],
            "task_id": cell.get("task_id"),
            "state_id": trace.get("state_id"),
            "stop_reason": trace.get("stop_reason"),
            "valid": cell.get("valid"),
            "heldout": True,
        },  # fmt: skip
        "total_time": cell.get("wall_s"),
        "error": {"message": cell["error"], "traceback": "", "traceback_ansi": ""}
        if not cell.get("valid") and cell.get("error")
        else None,
    }


def inspect_log(run: Run, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """An Inspect eval log (version 2, JSON) of ``cells`` of the evaluation ``run``."""
    man = run.report.get("manifest") or {}
    bench, policy = man.get("benchmark") or {}, man.get("policy") or {}
    created = (man.get("timing") or {}).get("started") or datetime.now(UTC).isoformat()
    samples = [_sample(run, c, 1) for c in cells]
    rewards = [s["scores"]["bat_gym"]["value"] for s in samples]
    agg = run.report.get("aggregates") or {}
    metrics = {"mean": {"name": "mean", "value": sum(rewards) / len(rewards) if rewards else 0.0}}
    for name in ("overall", "task"):
        if agg.get(name) is not None:
            metrics[name] = {"name": name, "value": agg[name]}
    # A stable id per run directory, so two exports of one run say they are one eval.
    eval_id = uuid.uuid5(uuid.NAMESPACE_URL, f"bat-gym:{run.path}").hex[:22]
    return {
        "version": INSPECT_LOG_VERSION,
        "status": "success" if all(c.get("valid") for c in cells) else "error",
        "eval": {
            "eval_id": eval_id,
            "run_id": eval_id,
            "created": created,
            "task": f"bat_gym/{bench.get('name', 'benchmark')}",
            "task_id": eval_id,
            "task_version": 0,
            "task_attribs": {
                "benchmark_version": bench.get("version"),
                "contracts": bench.get("contracts"),
            },
            "dataset": {
                "name": bench.get("name"),
                "samples": len(cells),
                "sample_ids": [s["id"] for s in samples],
                "shuffled": False,
            },  # fmt: skip
            "model": str(policy.get("name") or policy.get("kind") or "policy"),
            "config": {},
            "metadata": {
                "bat_gym": {"policy": policy, "settings": man.get("settings"), "heldout": True}
            },
            "packages": {"bat-gym": (man.get("versions") or {}).get("bat-gym", "")},
        },
        "results": {
            "total_samples": len(cells),
            "completed_samples": sum(1 for c in cells if c.get("valid")),
            "scores": [{"name": "bat_gym", "scorer": "bat_gym_rubric", "metrics": metrics}],
        },
        "stats": {"started_at": created, "completed_at": created},
        "samples": samples,
    }


def rollouts_log(run: Run, step: int, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
    """An Inspect eval log of a GRPO step's kept rollouts (training side: no held-out task).

    Each rollout is a sample ``step{S}-{N}`` scored with its reward; its step, group,
    pool, start state and ending are in the sample's metadata.
    """
    samples = []
    for n, t in enumerate(rollouts):
        messages = inspect_messages(t)
        verdict = t.get("verdict") or {}
        samples.append(
            {
                "id": f"step{step}-{n}",
                "epoch": 1,
                "input": next((m["content"] for m in messages if m["role"] == "user"), ""),
                "target": "",
                "messages": messages,
                "scores": {
                    "bat_gym": {
                        "value": t.get("reward") if t.get("reward") is not None else 0.0,
                        "explanation": score_explanation(verdict),
                        "metadata": {
                            "verdict": verdict or None,
                            "shaped_reward": t.get("shaped_reward"),
                        },
                    }
                },
                "metadata": {
                    k: t.get(k)
                    for k in (
                        "step",
                        "index",
                        "group",
                        "pool",
                        "state_id",
                        "stop_reason",
                        "focus",
                        "track",
                    )
                },  # fmt: skip
            }
        )
    rewards = [s["scores"]["bat_gym"]["value"] for s in samples]
    eval_id = uuid.uuid5(uuid.NAMESPACE_URL, f"bat-gym:{run.path}:{step}").hex[:22]
    created = datetime.fromtimestamp(run.path.stat().st_mtime, UTC).isoformat()
    return {
        "version": INSPECT_LOG_VERSION,
        "status": "success",
        "eval": {
            "eval_id": eval_id,
            "run_id": eval_id,
            "created": created,
            "task": f"bat_gym/grpo-step-{step}",
            "task_id": eval_id,
            "task_version": 0,
            "dataset": {
                "name": "rollouts",
                "samples": len(samples),
                "sample_ids": [s["id"] for s in samples],
                "shuffled": False,
            },  # fmt: skip
            "model": "policy",
            "config": {},
            "metadata": {"bat_gym": {"run": str(run.path), "step": step, "heldout": False}},
        },
        "results": {
            "total_samples": len(samples),
            "completed_samples": len(samples),
            "scores": [
                {
                    "name": "bat_gym",
                    "scorer": "bat_gym_rubric",
                    "metrics": {
                        "mean": {
                            "name": "mean",
                            "value": sum(rewards) / len(rewards) if rewards else 0.0,
                        }
                    },
                }
            ],
        },  # fmt: skip
        "samples": samples,
    }
