"""The run overviews: evaluation, Stage Bank, GRPO, BiCuRL, and the comparison of two evaluations.

Each function returns a page body (HTML); :mod:`bat_gym.viewer.site` wraps it and
names it. Links follow the site's flat naming (``r0.html``, ``r0-ep-KEY.html``, ...).
"""

from __future__ import annotations

from typing import Any

from bat_gym.viewer.html import bar_chart, fmt, h, line_chart, pill, stage_pill
from bat_gym.viewer.runs import Run

__all__ = [
    "STEPS_PER_PAGE",
    "bank_overview",
    "compare_page",
    "eval_overview",
    "grpo_overview",
    "grpo_step",
    "index_page",
    "loop_overview",
    "study_overview",
]

#: Steps listed per page of a GRPO overview.
STEPS_PER_PAGE = 100
EVAL_BANNER = (
    '<div class="banner eval-side">Held-out evaluation: the evaluation side of the firewall. '
    "Only its aggregates.json may reach training; the viewer writes nothing here.</div>"
)
TRAIN_BANNER = (
    '<div class="banner train-side">Training side: Stage Bank states and training rollouts '
    "(no held-out tasks).</div>"
)


def _key(c: dict[str, Any]) -> str:
    return f"{c['cell']['track']}-{c['cell']['seed']}-r{c['cell']['repeat']}"


def index_page(runs: list[Run]) -> str:
    """The list of runs, nested under their loop."""
    rows = []
    for r in runs:
        indent = "&nbsp;&nbsp;&nbsp;&nbsp;" if r.parent else ""
        side = "evaluation side (held-out)" if r.heldout else "training side"
        rows.append(
            f"<tr><td>{indent}<a href='{r.id}.html'>{h(r.title)}</a></td><td>{h(r.kind)}</td>"
            f"<td>{side}</td><td class='muted'>{h(r.path)}</td></tr>"
        )
    return (
        "<table><thead><tr><th>run</th><th>kind</th><th>firewall</th><th>directory</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _select(name: str, label: str, values: list[str]) -> str:
    opts = "".join(f'<option value="{h(v)}">{h(v)}</option>' for v in values)
    return f'<label>{h(label)} <select data-filter="{h(name)}"><option value="">all</option>{opts}</select></label>'


def eval_overview(run: Run, runs: list[Run]) -> str:
    """Headline scores, the per-track table, the stage chart and the filterable cells."""
    rep = run.report
    man, agg, iv = (
        rep.get("manifest") or {},
        rep.get("aggregates") or {},
        rep.get("intervals") or {},
    )
    cells = run.cells
    stages = list((agg.get("stages") or {}) or (cells[0].get("stages", {}) if cells else {}))
    out = [EVAL_BANNER]
    bench, policy = man.get("benchmark") or {}, man.get("policy") or {}
    comp = agg.get("completion") or {}
    out.append(
        f'<div class="card"><dl class="kv"><dt>benchmark</dt><dd>{h(bench.get("name"))} '
        f"{h(bench.get('version'))}</dd><dt>policy</dt><dd><b>{h(policy.get('name'))}</b> "
        f"<span class='muted'>{h(', '.join(f'{k} {v}' for k, v in policy.items() if k != 'name'))}</span></dd>"
        f"<dt>cells</dt><dd>{len(cells)} ({h(comp.get('valid', '?'))} valid, "
        f"{h(comp.get('finished', '?'))} finished)</dd>"
        f"<dt>wall time</dt><dd>{fmt((man.get('timing') or {}).get('wall_s'), 1)} s</dd></dl>"
        f'<p><a href="{run.id}.eval.json" download>export as an Inspect eval log</a></p></div>'
    )
    others = [r for r in runs if r.kind == "eval" and r is not run]
    if others:
        out.append("<p>Compare with: " + ", ".join(
            f'<a href="{run.id}-vs-{o.id}.html">{h(o.title)} ({o.id})</a>' for o in others) + "</p>")  # fmt: skip
    if iv:
        bars = [(m, (iv.get(m) or {}).get("mean"), (iv.get(m) or {}).get("low"), (iv.get(m) or {}).get("high"))
                for m in [*stages, "task", "overall"]]  # fmt: skip
        heads = "".join(f"<tr><td>{h(m)}</td><td class='num'>{fmt(mean)}</td><td class='num'>"
                        f"[{fmt(lo)}, {fmt(hi)}]</td></tr>" for m, mean, lo, hi in bars)  # fmt: skip
        out.append(
            '<div class="card" style="display:flex;gap:30px;flex-wrap:wrap"><div><h2>Stage scores</h2>'
            f"{bar_chart(bars)}</div><div><h2>Means, 95% bootstrap CI</h2><table><thead><tr><th>metric"
            f"</th><th class='num'>mean</th><th class='num'>CI</th></tr></thead><tbody>{heads}</tbody></table></div></div>"
        )
    if agg.get("tracks"):
        rows = "".join(
            f"<tr><td>{h(t)}</td><td class='num'>{h((v.get('completion') or {}).get('valid'))}/"
            f"{h((v.get('completion') or {}).get('runs'))}</td><td class='num'>{fmt(v.get('overall'))}</td>"
            f"<td class='num'>{fmt(v.get('task'))}</td>"
            + "".join(f"<td class='num'>{fmt((v.get('stages') or {}).get(s))}</td>" for s in stages)
            + "</tr>"
            for t, v in agg["tracks"].items()
        )
        out.append(
            "<h2>Per track</h2><table><thead><tr><th>track</th><th class='num'>valid</th><th class='num'>"
            "overall</th><th class='num'>task</th>"
            + "".join(f"<th class='num'>{h(s)}</th>" for s in stages)
            + f"</tr></thead><tbody>{rows}</tbody></table>"
        )
    tracks = sorted({c["cell"]["track"] for c in cells})
    failures = sorted({f for c in cells for f in c.get("failures", [])})
    out.append(
        '<h2>Episodes</h2><form class="filters" id="cell-filters" onsubmit="return false">'
        + _select("track", "track", tracks)
        + _select("weak", "stage below 1", stages)
        + _select("outcome", "outcome", ["finished", "unfinished", "invalid"])
        + _select("failures", "failure", failures)
        + '<label>reward ≥ <input data-filter="min-reward" type="number" step="0.05" min="0" max="1" style="width:5em"></label>'
        + '<label>reward ≤ <input data-filter="max-reward" type="number" step="0.05" min="0" max="1" style="width:5em"></label>'
        + '<span class="count muted"></span></form>'
    )
    rows = []
    for c in cells:
        key = _key(c)
        has_trace = (run.path / "episodes" / f"{key}.json").is_file()
        name = f'<a href="{run.id}-ep-{h(key)}.html">{h(key)}</a>' if has_trace else h(key)
        outcome = (
            "invalid" if not c.get("valid") else ("finished" if c.get("finished") else "unfinished")
        )
        weak = " ".join(s for s, v in (c.get("stages") or {}).items() if v is not None and v < 1)
        reward = c.get("reward")
        rows.append(
            f'<tr data-track="{h(c["cell"]["track"])}" data-outcome="{outcome}" data-weak="{h(weak)}" '
            f'data-failures="{h(" ".join(c.get("failures", [])))}" data-min-reward="{"" if reward is None else reward}" '
            f'data-max-reward="{"" if reward is None else reward}">'
            f"<td>{name}</td><td>{h(c['cell']['track'])}</td><td>{h(outcome)}</td>"
            f"<td class='num' data-v='{'' if reward is None else reward}'>{fmt(reward)}</td>"
            f"<td class='num' data-v='{c.get('overall') if c.get('overall') is not None else ''}'>{fmt(c.get('overall'))}</td>"
            f"<td class='num' data-v='{c.get('task') if c.get('task') is not None else ''}'>{fmt(c.get('task'))}</td>"
            + "".join(
                f"<td class='num' data-v='{'' if (c.get('stages') or {}).get(s) is None else c['stages'][s]}'>"
                f"{fmt((c.get('stages') or {}).get(s), 2)}</td>"
                for s in stages
            )
            + f"<td class='num'>{h(c.get('turns'))}</td><td class='num'>{h(c.get('tool_calls'))}</td>"
            f"<td>{h(', '.join(c.get('failures', [])))}</td></tr>"
        )
    out.append(
        '<table class="sortable" id="cells" data-filters="cell-filters"><thead><tr>'
        '<th class="sortable">cell</th><th class="sortable">track</th><th class="sortable">outcome</th>'
        '<th class="sortable num">reward</th><th class="sortable num">overall</th><th class="sortable num">task</th>'
        + "".join(f'<th class="sortable num">{h(s)}</th>' for s in stages)
        + '<th class="sortable num">turns</th><th class="sortable num">calls</th><th>failures</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return "".join(out)


def bank_overview(run: Run) -> str:
    """A bank's manifest, its teacher trajectories (with stage boundaries) and its rows."""
    m = run.manifest
    out = [TRAIN_BANNER, '<div class="card"><dl class="kv">']
    for k in (
        "benchmark",
        "benchmark_version",
        "format",
        "outcomes",
        "rows",
        "trajectories",
        "rejected",
    ):
        if k in m:
            out.append(f"<dt>{h(k)}</dt><dd>{h(m[k])}</dd>")
    out.append("</dl></div><h2>Teacher trajectories</h2><table class='sortable'><thead><tr>"
               "<th class='sortable'>trajectory</th><th class='sortable'>track</th><th>rows (stage start states)"
               "</th><th class='sortable num'>messages</th></tr></thead><tbody>")  # fmt: skip
    for i, (name, rows) in enumerate(sorted(run.trajectories().items())):
        out.append(
            f"<tr><td><a href='{run.id}-traj-{i}.html'>{h(name)}</a></td><td>{h(rows[0]['track'])}</td>"
            f"<td>{''.join(stage_pill(r['focus']) for r in rows)}</td>"
            f"<td class='num'>{len(rows[-1]['messages'])}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def grpo_overview(run: Run, page_no: int = 1) -> str:
    """The reward curve (points link to the step's rollouts) and a page of the step table."""
    metrics = run.metrics
    kept = set(run.rollout_steps())
    series = {"reward": [(float(r["step"]), r.get("reward")) for r in metrics]}
    pools = sorted({p for r in metrics for p in (r.get("reward_by_pool") or {})})
    for p in pools:
        series[f"reward ({p})"] = [
            (float(r["step"]), (r.get("reward_by_pool") or {}).get(p)) for r in metrics
        ]
    links = {float(s): f"{run.id}-step-{s}.html" for s in kept}
    out = [TRAIN_BANNER, '<div class="card"><h2>Reward per step</h2>',
           line_chart(series, links=links, y_label="reward"),
           f'<p class="muted">{len(metrics)} steps logged, {len(kept)} with a kept rollout sample '
           "(points link to them)</p>", _flat_steps(metrics), "</div>"]  # fmt: skip
    steps = sorted({int(r["step"]) for r in metrics} | kept)
    pages = max(1, -(-len(steps) // STEPS_PER_PAGE))
    page_no = min(max(1, page_no), pages)
    shown = steps[(page_no - 1) * STEPS_PER_PAGE : page_no * STEPS_PER_PAGE]
    by_step = {int(r["step"]): r for r in metrics}
    out.append(_pager(run.id, page_no, pages))
    out.append("<table><thead><tr><th>step</th><th class='num'>reward</th><th class='num'>scored</th>"
               "<th class='num'>loss</th><th class='num'>turns</th><th class='num'>finished</th>"
               "<th class='num'>cut</th><th class='num'>zero-adv groups</th>"
               "<th>rollouts</th></tr></thead><tbody>")  # fmt: skip
    for s in shown:
        r = by_step.get(s, {})
        link = (
            f"<a href='{run.id}-step-{s}.html'>sample</a>"
            if s in kept
            else "<span class='muted'>-</span>"
        )
        out.append(
            f"<tr><td>{s}</td><td class='num'>{fmt(r.get('reward'))}</td><td class='num'>"
            f"{h(r.get('scored_rollouts', ''))}</td><td class='num'>{fmt(r.get('loss'), 4)}</td>"
            f"<td class='num'>{fmt(r.get('turns'), 1)}</td><td class='num'>{fmt(r.get('finished'), 2)}</td>"
            f"<td class='num'>{fmt(r.get('length_cut'), 2)}</td>"
            f"<td class='num'>{fmt(r.get('zero_advantage_groups'), 2)}</td>"
            f"<td>{link}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _flat_steps(metrics: list[dict[str, Any]]) -> str:
    """A line naming the steps that taught nothing (every group's rewards equal), and why."""
    flat = [r for r in metrics if (r.get("zero_advantage_groups") or 0) >= 1.0]
    if not flat:
        return ""
    cut = sum((r.get("length_cut") or 0) >= 1.0 for r in flat)
    return (
        f'<p class="muted">{len(flat)} of {len(metrics)} steps had no learning signal (zero-adv '
        f"groups 1.00: every group's rollouts earned the same reward), {cut} of them with every "
        "episode cut by a token limit (cut 1.00). A flat curve there is the sizes, not the "
        "trainer: raise --max-new-tokens, or SFT the model first.</p>"
    )


def _pager(rid: str, page_no: int, pages: int) -> str:
    if pages <= 1:
        return ""
    items = []
    for p in range(1, pages + 1):
        if p == page_no:
            items.append(f'<span class="cur">{p}</span>')
        elif p in (1, pages) or abs(p - page_no) <= 3:
            items.append(f'<a href="{rid}{"" if p == 1 else f"-p{p}"}.html">{p}</a>')
        elif abs(p - page_no) == 4:
            items.append("<span>…</span>")
    return f'<div class="pager">{"".join(items)}</div>'


def grpo_step(run: Run, step: int, rollouts: list[dict[str, Any]]) -> str:
    """The kept rollouts of one step: reward, verdict in brief, links to each episode."""
    steps = run.rollout_steps()
    i = steps.index(step) if step in steps else -1
    nav = []
    if i > 0:
        nav.append(f"<a href='{run.id}-step-{steps[i - 1]}.html'>← step {steps[i - 1]}</a>")
    if 0 <= i < len(steps) - 1:
        nav.append(f"<a href='{run.id}-step-{steps[i + 1]}.html'>step {steps[i + 1]} →</a>")
    nav.append(
        f"<a href='{run.id}-step-{step}.eval.json' download>export as an Inspect eval log</a>"
    )
    out = [TRAIN_BANNER, f'<div class="pager">{"".join(nav)}</div>', "<table class='sortable'><thead><tr>"
           "<th class='sortable'>rollout</th><th class='sortable num'>group</th><th class='sortable'>pool</th>"
           "<th>state</th><th class='sortable num'>reward</th><th class='sortable'>ended</th>"
           "<th class='sortable num'>turns</th><th>stages</th></tr></thead><tbody>"]  # fmt: skip
    for n, r in enumerate(rollouts):
        stages = " ".join(
            f"{stage_pill(s['stage'])}{fmt(s.get('credit'), 2)}"
            for s in (r.get("verdict") or {}).get("stages", [])
        )
        out.append(
            f"<tr><td><a href='{run.id}-step-{step}-{n}.html'>#{h(r.get('index'))}</a></td>"
            f"<td class='num'>{h(r.get('group'))}</td><td>{h(r.get('pool'))}</td><td>{h(r.get('state_id'))}</td>"
            f"<td class='num' data-v='{r.get('reward') if r.get('reward') is not None else ''}'>{fmt(r.get('reward'))}</td>"
            f"<td>{h(r.get('stop_reason'))}</td><td class='num'>{h(r.get('turns'))}</td><td>{stages}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def loop_overview(run: Run, runs: list[Run]) -> str:
    """The round curve and each round's target, decision and reasons, with links."""
    st = run.loop_state
    rounds = st.get("rounds", [])
    by_path = {str(r.path): r for r in runs}
    series = {
        "candidate overall": [(float(r["round"]), r.get("candidate_overall")) for r in rounds],
        "retained overall": [(float(r["round"]), r.get("best_overall")) for r in rounds],
    }
    out = [
        '<div class="card"><dl class="kv">'
        f"<dt>phase</dt><dd>{h(st.get('phase'))}</dd><dt>incumbent</dt><dd>{h(st.get('incumbent'))}</dd>"
        f"<dt>next target</dt><dd>{stage_pill(st.get('target')) if st.get('target') else '-'}</dd></dl></div>",
        '<div class="card"><h2>Rounds</h2>' + line_chart(series, y_label="overall") + "</div>",
        "<table><thead><tr><th>round</th><th>target</th><th>decision</th><th class='num'>incumbent</th>"
        "<th class='num'>candidate</th><th>failed checks</th><th>next</th><th>runs</th></tr></thead><tbody>",
    ]
    start = by_path.get(str((run.path / "evals" / "start").resolve()))
    incumbent = start
    for r in rounds:
        i = int(r.get("round", 0))
        grpo = by_path.get(str((run.path / "rounds" / f"round-{i:02d}" / "grpo").resolve()))
        cand = by_path.get(str(run.round_eval(r).resolve()))
        links = []
        if grpo:
            links.append(f"<a href='{grpo.id}.html'>GRPO</a>")
        if cand:
            links.append(f"<a href='{cand.id}.html'>evaluation</a>")
        if cand and incumbent:
            links.append(f"<a href='{incumbent.id}-vs-{cand.id}.html'>compare</a>")
        checks = (r.get("gate") or {}).get("checks", [])
        failed = "".join(
            f"<div>{pill(False, c['name'])} drop {fmt(c.get('drop'))} &gt; {fmt(c.get('threshold'))}"
            f"{' (' + h(c['note']) + ')' if c.get('note') else ''}</div>"
            for c in checks
            if not c.get("passed")
        )
        detail = ""
        if checks:  # every check behind the decision, with its numbers
            rows_ = "".join(
                f"<tr><td>{pill(c.get('passed'), c.get('name'))}</td><td class='num'>{fmt(c.get('baseline'))}"
                f"</td><td class='num'>{fmt(c.get('candidate'))}</td><td class='num'>{fmt(c.get('drop'))}</td>"
                f"<td class='num'>{fmt(c.get('threshold'))}</td></tr>"
                for c in checks
            )
            detail = (
                f"<details><summary>{len(checks)} gate checks</summary><table><thead><tr><th>check</th>"
                "<th class='num'>incumbent</th><th class='num'>candidate</th><th class='num'>drop</th>"
                f"<th class='num'>bound</th></tr></thead><tbody>{rows_}</tbody></table></details>"
            )
        decision = r.get("decision", "training")
        out.append(
            f"<tr><td>{i}</td><td>{stage_pill(r.get('target'))}</td><td>{pill(decision == 'promote', decision)}</td>"
            f"<td class='num'>{fmt(r.get('incumbent_overall'))}</td><td class='num'>{fmt(r.get('candidate_overall'))}</td>"
            f"<td>{failed or '<span class=muted>none failed</span>'}{detail}</td>"
            f"<td>{stage_pill(r.get('next_target')) if r.get('next_target') else '-'}</td><td>{' · '.join(links)}</td></tr>"
        )
        if decision == "promote" and cand:
            incumbent = cand
    out.append("</tbody></table>")
    return "".join(out)


def study_overview(run: Run) -> str:
    """A study's table: held-out Overall per arm with its CI, the comparisons, BiCuRL's rounds."""
    res = run.study_results
    if not res:
        return "<p>No unit has finished yet.</p>"
    out = [
        f"<p>{h(res.get('benchmark'))}; every RL arm from one SFT checkpoint, "
        f"{h(res.get('token_budget'))} generated tokens per seed.</p>",
        "<table><thead><tr><th>arm</th><th class='num'>seeds</th><th class='num'>Overall</th>"
        "<th>95% CI</th><th class='num'>finish rate</th><th class='num'>tokens</th></tr></thead><tbody>",
    ]
    for row in res.get("arms", {}).values():
        low, high = row.get("overall_ci") or (None, None)
        out.append(
            f"<tr><td>{h(row.get('label'))}</td><td class='num'>{len(row.get('seeds', []))}</td>"
            f"<td class='num'>{fmt(row.get('overall'))}</td><td>[{fmt(low)}, {fmt(high)}]</td>"
            f"<td class='num'>{fmt(row.get('finish_rate'), 2)}</td>"
            f"<td class='num'>{fmt(row.get('generated_tokens'), 0)}</td></tr>"
        )
    out.append("</tbody></table><h2>Comparisons</h2><ul>")
    for name, c in res.get("comparisons", {}).items():
        low, high = c.get("ci") or (None, None)
        out.append(f"<li>{h(name)}: {fmt(c.get('difference'))} [{fmt(low)}, {fmt(high)}]</li>")
    out.append("</ul>")
    rounds = res.get("bicurl_rounds") or {}
    if rounds.get("raw_overall"):
        series = {
            name: [(float(i), v) for i, v in enumerate(rounds[key])]
            for name, key in (("raw", "raw_overall"), ("retained", "retained_overall"))
        }
        out.append("<h2>BiCuRL rounds</h2>" + line_chart(series, y_label="overall"))
    return "".join(out)


def compare_page(
    a: Run,
    b: Run,
    items_a: dict[str, dict[str, bool | None]],
    items_b: dict[str, dict[str, bool | None]],
) -> str:
    """Two evaluations on paired cells: per-stage deltas, cells and items that flipped.

    Args:
        a: the baseline evaluation (e.g. the incumbent's).
        b: the other evaluation (e.g. the candidate's).
        items_a: cell key -> ``"stage/item"`` -> passed, from ``a``'s traces.
        items_b: the same for ``b``.
    """
    ca, cb = {_key(c): c for c in a.cells}, {_key(c): c for c in b.cells}
    paired = [k for k in ca if k in cb]
    stages = sorted({s for c in [*ca.values(), *cb.values()] for s in (c.get("stages") or {})})
    out = [EVAL_BANNER, f"<p>Baseline <a href='{a.id}.html'>{h(a.title)} ({a.id})</a> against "
           f"<a href='{b.id}.html'>{h(b.title)} ({b.id})</a>: {len(paired)} paired cells "
           f"({len(ca) - len(paired)} only in the baseline, {len(cb) - len(paired)} only in the other).</p>"]  # fmt: skip

    def mean(cs: list[dict[str, Any]], get: Any) -> float | None:
        vals = [get(c) for c in cs if get(c) is not None]
        return sum(vals) / len(vals) if vals else None

    rows = []
    for m in ["overall", "task", *stages]:

        def get(c: dict[str, Any], m: str = m) -> float | None:
            return (c.get("stages") or {}).get(m) if m.startswith("S") else c.get(m)

        x, y = mean([ca[k] for k in paired], get), mean([cb[k] for k in paired], get)
        d = None if x is None or y is None else y - x
        cls = "" if not d else ("flip-up" if d > 0 else "flip-down")
        rows.append(f"<tr><td>{h(m)}</td><td class='num'>{fmt(x)}</td><td class='num'>{fmt(y)}</td>"
                    f"<td class='num {cls}'>{'-' if d is None else f'{d:+.3f}'}</td></tr>")  # fmt: skip
    out.append("<h2>Per-stage deltas (paired cells)</h2><table><thead><tr><th>metric</th><th class='num'>"
               f"{a.id}</th><th class='num'>{b.id}</th><th class='num'>delta</th></tr></thead><tbody>"
               f"{''.join(rows)}</tbody></table>")  # fmt: skip
    out.append("<h2>Cells</h2><table class='sortable'><thead><tr><th class='sortable'>cell</th>"
               f"<th class='sortable num'>{a.id} overall</th><th class='sortable num'>{b.id} overall</th>"
               "<th class='sortable num'>delta</th><th>items that flipped</th></tr></thead><tbody>")  # fmt: skip
    for k in paired:
        x, y = ca[k].get("overall"), cb[k].get("overall")
        d = None if x is None or y is None else y - x
        ia, ib = items_a.get(k, {}), items_b.get(k, {})
        flips = []
        for item in sorted(set(ia) | set(ib)):
            before, after = ia.get(item), ib.get(item)
            if before != after:
                up = after is True
                flips.append(f"<span class='{'flip-up' if up else 'flip-down'}'>{h(item)}: "
                             f"{h(before)} → {h(after)}</span>")  # fmt: skip
        link = lambda r, k=k: f"<a href='{r.id}-ep-{h(k)}.html'>{r.id}</a>"  # noqa: E731
        out.append(
            f"<tr><td>{h(k)} ({link(a)}, {link(b)})</td><td class='num'>{fmt(x)}</td><td class='num'>{fmt(y)}</td>"
            f"<td class='num' data-v='{'' if d is None else d}'>{'-' if d is None else f'{d:+.3f}'}</td>"
            f"<td>{'<br>'.join(flips) or '<span class=muted>none</span>'}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)
