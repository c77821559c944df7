"""One episode as a page: the stage timeline, the trace, and the verdict beside it.

The trace (left) is the conversation: the start state's replayed prefix shown apart
and folded, then each of the policy's turns coloured by its stage, each tool call with
its code highlighted, its output, exit status, duration, what it ran and read, and the
files it wrote (a diff for text, a picture for images). The verdict (right) gives per
stage every rubric item passed / failed / null with its evidence linked to the call or
file it points at, the evidence-completeness discount (score x eta = credit), the
gates, the task score, the reward, and the contract's id and digest.

Which stage a turn belongs to: in a stage episode, its focus; in an E2E episode, the
stage whose items first cite one of the turn's calls as evidence (a turn citing none
keeps the stage before it); in a Stage Bank trajectory, the rows' boundaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from bat_gym.viewer.html import diff_html, fmt, h, highlight, pill, stage_pill

__all__ = ["render_episode", "file_anchor", "stage_of_calls"]

Blob = Callable[[str], bytes | None]
ImageHref = Callable[[dict[str, Any]], str | None]


def file_anchor(path: str) -> str:
    """The element id of a file's block."""
    return "file-" + re.sub(r"[^A-Za-z0-9_-]", "_", path)


def stage_of_calls(
    verdict: dict[str, Any] | None, record: dict[str, Any] | None = None
) -> dict[int, str]:
    """Call index -> the first stage (in verdict order) whose items cite it.

    An item citing a file cites the last call that wrote it (when the record says).
    """
    last_writer: dict[str, int] = {}
    for c in (record or {}).get("calls", []):
        for path in c.get("writes") or ():
            last_writer[path] = int(c["index"])
    out: dict[int, str] = {}
    for stage in (verdict or {}).get("stages", []):
        for item in stage.get("items", []):
            for e in item.get("evidence", []):
                call = (
                    e.get("call")
                    if e.get("call") is not None
                    else last_writer.get(e.get("path") or "")
                )
                if call is not None:
                    out.setdefault(int(call), stage["stage"])
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = (call.get("function") or {}).get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return {"code": args}
    return args if isinstance(args, dict) else {}


def _file_block(f: dict[str, Any], blob: Blob, image_href: ImageHref) -> str:
    state = "new file" if f.get("before_sha256") is None else "changed"
    head = (
        f'<div class="file" id="{h(file_anchor(f["path"]))}"><b>{h(f["path"])}</b> '
        f'<span class="muted">{state}, {f.get("size", 0):,} bytes, sha256 '
        f'<span title="{h(f.get("sha256"))}">{h(str(f.get("sha256"))[:12])}</span></span>'
    )
    body = ""
    if not f.get("stored"):
        body = '<div class="muted">content not kept (binary, or past the size cap)</div>'
    elif f.get("kind") == "image":
        src = image_href(f)
        body = (
            f'<div><img class="artifact" alt="{h(f["path"])}" src="{h(src)}"></div>'
            if src
            else '<div class="muted">no preview</div>'
        )
    elif f.get("kind") == "text":
        after = blob(f["sha256"])
        before = blob(f["before_sha256"]) if f.get("before_sha256") else None
        if after is not None:
            body = diff_html(
                None if before is None else before.decode("utf-8", "replace"),
                after.decode("utf-8", "replace"),
                f["path"],
            )
    return head + body + "</div>"


def _call_block(
    index: int | None,
    args: dict[str, Any],
    rec: dict[str, Any] | None,
    reply: str | None,
    files: list[dict[str, Any]],
    blob: Blob,
    image_href: ImageHref,
    stage: str | None,
) -> str:
    language = (rec or {}).get("language") or args.get("language") or "text"
    code = (rec or {}).get("code") or args.get("code") or json.dumps(args, indent=1)
    anchor = f' id="call-{index}"' if index is not None else ""
    head = [f"<b>call {index if index is not None else '?'}</b>", h(language)]
    if stage:
        head.append(stage_pill(stage))
    if rec is not None:
        code_ = rec.get("exit_code")
        cls = "exit-ok" if code_ == 0 else "exit-bad"
        head.append(f'<span class="{cls}">exit {"killed" if code_ is None else code_}</span>')
        head.append(f"{float(rec.get('duration_s') or 0):.2f} s")
        if rec.get("timed_out"):
            head.append('<span class="exit-bad">timed out</span>')
        if rec.get("digest_before") != rec.get("digest_after"):
            head.append("changed the workspace")
    out = [f'<div class="call"{anchor}><div class="head">{" ".join(head)}</div><div class="body">']
    out.append(highlight(code, language))
    output = (rec or {}).get("output") if rec is not None else reply
    if output:
        more = ""
        if rec is not None and rec.get("output_bytes", 0) > len(output.encode()):
            more = (
                f' <span class="muted">({rec["output_bytes"]:,} bytes written, shown capped)</span>'
            )
        out.append(f"<div class='muted'>output{more}</div><pre>{h(output)}</pre>")
    if rec is not None:
        facts = []
        if rec.get("runs"):
            runs = ", ".join(
                f"{h(' '.join(map(str, r.get('argv') or [])))[:120]} → {h(r.get('exit_code'))}"
                for r in rec["runs"][:12]
            )
            facts.append(f"<dt>ran</dt><dd>{runs}</dd>")
        if rec.get("reads"):
            facts.append(f"<dt>read</dt><dd>{h(', '.join(rec['reads'][:30]))}</dd>")
        if rec.get("writes") is not None:
            facts.append(f"<dt>wrote</dt><dd>{h(', '.join(rec['writes']) or 'nothing')}</dd>")
        if facts:
            out.append(f'<dl class="kv">{"".join(facts)}</dl>')
    out += [_file_block(f, blob, image_href) for f in files]
    out.append("</div></div>")
    return "".join(out)


def _verdict_panel(trace: dict[str, Any], files: set[str]) -> str:
    v = trace.get("verdict")
    if not v:
        return '<div class="card"><h2>Verdict</h2><p class="muted">no verdict recorded</p></div>'
    c = v.get("contract") or {}
    out = [
        '<div class="card"><h2>Verdict</h2><dl class="kv">',
        f"<dt>reward</dt><dd><b>{fmt(v.get('reward'))}</b></dd>",
        f"<dt>task score</dt><dd>{fmt(v.get('task_score'))}</dd>",
        f"<dt>stage score</dt><dd>{fmt(v.get('stage_score'))}</dd>",
        f"<dt>evidence η</dt><dd>{fmt(v.get('eta'))}</dd>",
        f"<dt>contract</dt><dd>{h(c.get('id'))} v{h(c.get('version'))}</dd>",
        f"<dt>digest</dt><dd><code>{h(c.get('sha256'))}</code></dd>",
    ]
    if v.get("rejected"):
        out.append(f"<dt>rejected</dt><dd>{pill(False, v['rejected'])}</dd>")
    out.append("</dl>")
    if v.get("gates"):
        out.append("<h3>Gates</h3>")
        for g in v["gates"]:
            out.append(f'<div class="item">{pill(g.get("passed"))} {h(g.get("gate"))} '
                       f'<div class="detail">{h(g.get("reason"))}</div></div>')  # fmt: skip
    for s in v.get("stages", []):
        out.append(
            f'<h3 id="stage-{h(s["stage"])}">{stage_pill(s["stage"])} score {fmt(s.get("score"))} × '
            f"η {fmt(s.get('eta'))} = credit <b>{fmt(s.get('credit'))}</b></h3>"
        )
        for it in s.get("items", []):
            evidence = []
            for e in it.get("evidence", []):
                if e.get("call") is not None:
                    evidence.append(
                        f'<a class="evidence" href="#call-{int(e["call"])}">call {int(e["call"])}</a>'
                    )
                elif e.get("path") in files:
                    evidence.append(
                        f'<a class="evidence" href="#{h(file_anchor(e["path"]))}">{h(e["path"])}</a>'
                    )
                elif e.get("path"):
                    evidence.append(f'<span title="{h(e.get("sha256"))}">{h(e["path"])}</span>')
            flags = []
            if it.get("guard"):
                flags.append("guard")
            if it.get("requires"):
                flags.append("needs " + "+".join(it["requires"]))
            if it.get("passed") and not it.get("evidence_complete", True):
                flags.append("evidence incomplete")
            out.append(
                f'<div class="item" data-passed="{h(it.get("passed"))}">{pill(it.get("passed"))} '
                f'<b>{h(it.get("id"))}</b> <span class="muted">{h(it.get("check"))}, weight '
                f"{h(it.get('weight'))}{'; ' + h(', '.join(flags)) if flags else ''}</span>"
                f'<div class="ev">evidence: {", ".join(evidence) or "<span class=muted>none</span>"}</div>'
                f'<div class="detail">{h(it.get("detail"))}</div></div>'
            )
        if s.get("skipped"):
            out.append(f'<div class="muted">skipped: {h(", ".join(s["skipped"]))}</div>')
    if v.get("notes"):
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{h(n)}</li>" for n in v["notes"]) + "</ul>")
    out.append("</div>")
    return "".join(out)


def render_episode(
    trace: dict[str, Any],
    *,
    blob: Blob,
    image_href: ImageHref,
    boundaries: Sequence[tuple[int, str, str]] = (),
    header: str = "",
    side: str | None = None,
) -> str:
    """The body of an episode page (see the module docstring).

    Args:
        trace: an episode trace (:mod:`bat_gym.evaluation.episodes`).
        blob: a file content kept beside the trace, by sha256 (None if not kept).
        image_href: the link of an image file's preview (None: no preview).
        boundaries: ``(message index, stage, label)`` of Stage Bank rows: the stage
            starting at that message.
        header: HTML put above the timeline (the cell's scores, links).
        side: HTML of the right-hand panel instead of the verdict.
    """
    messages = trace.get("messages") or []
    prefix = int(trace.get("prefix_messages") or 0)
    record = trace.get("record") or {}
    calls = {int(c["index"]): c for c in record.get("calls", [])}
    by_id = {f"call_{i}": c for i, c in calls.items()}
    asked = {tc.get("id") for m in messages for tc in m.get("tool_calls") or []}
    replies = {
        m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"
    }
    files = {f["path"]: f for f in trace.get("files") or []}
    placed: dict[int, list[dict[str, Any]]] = {}
    for path, f in files.items():  # a file's block goes under the last call that wrote it
        writers = [i for i, c in calls.items() if path in (c.get("writes") or ())]
        if writers:
            placed.setdefault(max(writers), []).append(f)
    unplaced = [f for p, f in files.items() if not any(f in v for v in placed.values())]
    cited = stage_of_calls(trace.get("verdict"), record)
    focus = trace.get("focus") or "E2E"
    bounds = sorted(boundaries)

    def stage_at(i: int, turn_calls: list[int], previous: str | None) -> str | None:
        if bounds:
            return next((s for at, s, _ in reversed(bounds) if at <= i), previous)
        if focus != "E2E":
            return focus
        return next((cited[c] for c in turn_calls if c in cited), previous)

    blocks, segments, turn, stage = [], [], 0, None
    pre: list[str] = []
    for i, m in enumerate(messages):
        for at, s, label in bounds:
            if at == i:
                blocks.append(
                    f'<div class="boundary" id="boundary-{h(s)}">{stage_pill(s)} {h(label)}</div>'
                )
        role = m.get("role")
        in_prefix = i < prefix
        if role == "tool" and m.get("tool_call_id") in by_id:
            continue  # shown with its call
        if role == "tool" and m.get("tool_call_id") in asked:
            continue  # shown as its call's output
        html_: list[str] = []
        colour = "var(--line)"
        anchor = ""
        if role == "assistant":
            ids = [tc.get("id") for tc in m.get("tool_calls") or []]
            turn_calls = [int(by_id[x]["index"]) for x in ids if x in by_id]
            # A stage episode's replayed turns belong to earlier stages, which the trace
            # does not name: they stay uncoloured rather than take the focus's colour.
            stage = (
                None
                if in_prefix and focus != "E2E" and not bounds
                else stage_at(i, turn_calls, stage)
            )
            colour = f"var(--{stage or 'E2E'}, #7f7f7f)"
            label = "replayed" if in_prefix else f"turn {turn}"
            anchor = f"turn-{turn}" if not in_prefix else f"prefix-{i}"
            html_.append(
                f'<div class="who"><b>assistant</b> {h(label)} {stage_pill(stage) if stage else ""}</div>'
            )
            if _text(m.get("content")).strip():
                html_.append(f'<pre class="text">{h(_text(m.get("content")))}</pre>')
            for tc in m.get("tool_calls") or []:
                rec = by_id.get(tc.get("id"))
                m_id = re.fullmatch(r"call_(\d+)", str(tc.get("id")))
                index = int(rec["index"]) if rec else (int(m_id.group(1)) if m_id else None)
                html_.append(
                    _call_block(
                        index,
                        _arguments(tc),
                        rec,
                        replies.get(tc.get("id")),
                        placed.get(index, []) if index is not None else [],
                        blob,
                        image_href,
                        stage,
                    )  # fmt: skip
                )
            segments.append(
                f'<a href="#{anchor}" class="{"prefix" if in_prefix else ""}" '
                f'style="background:{colour}" title="{h(label)} {h(stage or "")}"></a>'
            )
            if not in_prefix:
                turn += 1
        else:
            anchor = f"msg-{i}"
            text = _text(m.get("content"))
            html_.append(f'<div class="who"><b>{h(role)}</b></div>')
            if role == "system":
                html_.append(f"<details><summary>system prompt ({len(text):,} chars)</summary>"
                             f'<pre class="text">{h(text)}</pre></details>')  # fmt: skip
            else:
                html_.append(f'<pre class="text">{h(text)}</pre>')
        block = (
            f'<div class="msg {"prefix" if in_prefix else ""}" id="{anchor}" '
            f'style="border-left-color:{colour}">{"".join(html_)}</div>'
        )
        (pre if in_prefix and prefix < len(messages) and not bounds else blocks).append(block)
    for at, s, label in bounds:  # a row whose prefix is the whole trajectory shown
        if at >= len(messages):
            blocks.append(
                f'<div class="boundary" id="boundary-{h(s)}">{stage_pill(s)} {h(label)}</div>'
            )
    legend = sorted(
        {s for _, s, _ in bounds} | set(cited.values()) | ({focus} if focus != "E2E" else set())
    )
    top = [
        header,
        '<div class="card"><b>Stage timeline</b> <span class="muted">one block per assistant '
        "turn; hatched: the start state's replayed prefix</span>",
        f'<div class="timeline">{"".join(segments)}</div>',
        '<div class="legend">'
        + "".join(
            f'<span><i style="background:var(--{h(s)},#7f7f7f)"></i>{h(s)}</span>' for s in legend
        )
        + "</div></div>",
    ]
    if pre:
        top.append(
            f'<details class="prefix-block"><summary>replayed prefix: {len(pre)} messages of the '
            "start state (system, task, earlier stages' turns)</summary>"
            + "".join(pre)
            + "</details>"
        )
    if unplaced:
        blocks.append('<h2>Other files the verdict cites</h2>' + "".join(
            _file_block(f, blob, image_href) for f in unplaced))  # fmt: skip
    left = "".join(top) + "".join(blocks)
    return f'<div class="layout"><div class="trace">{left}</div><aside class="side">{side if side is not None else _verdict_panel(trace, set(files))}</aside></div>'
