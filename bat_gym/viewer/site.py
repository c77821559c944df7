"""The viewer's pages by name: one table of routes for the server and the static export.

Every page sits at the top level of the site under a flat name, so its links are
plain relative names and the same files work served and opened from disk:

====================================  =============================================
``index.html``                        the runs
``viewer.css``, ``viewer.js``         style and the filtering / sorting script
``r0.html``, ``r0-p2.html``           a run's overview (GRPO: page 2 of its steps)
``r0-ep-KEY.html``                    an evaluation cell's episode
``r0-traj-N.html``                    a Stage Bank teacher trajectory
``r0-step-S.html``                    a GRPO step's kept rollouts
``r0-step-S-N.html``                  one of them
``r0-vs-r1.html``                     two evaluations compared on paired cells
``r0-img-SHA-KIND.png``               an image artifact drawn as PNG
``r0.eval.json``, ``r0-ep-KEY.eval.json``  Inspect eval logs (:mod:`bat_gym.viewer.export`)
====================================  =============================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from bat_gym.viewer import pages
from bat_gym.viewer.episode import render_episode
from bat_gym.viewer.html import fmt, h, page, pill, stage_pill
from bat_gym.viewer.images import ImageError, to_png
from bat_gym.viewer.runs import Run, load_runs

__all__ = ["Site"]

_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".png": "image/png",
          ".json": "application/json"}  # fmt: skip
_ROUTE = re.compile(
    r"^(?P<rid>r\d+)(?:"
    r"(?P<overview>)|-p(?P<page>\d+)|-ep-(?P<key>[A-Za-z0-9_.:-]+?)|-traj-(?P<traj>\d+)"
    r"|-step-(?P<step>\d+)(?:-(?P<n>\d+))?|-vs-(?P<other>r\d+)"
    r"|-img-(?P<sha>[0-9a-f]{64})-(?P<kind>png|jpg|nii|dcm))"
    r"(?P<ext>\.html|\.png|\.eval\.json)$"
)
_IMAGE_NAME = {"png": "x.png", "jpg": "x.jpg", "nii": "x.nii.gz", "dcm": "x.dcm"}


def _image_kind(path: str) -> str:
    p = path.lower()
    if p.endswith((".nii", ".nii.gz")):
        return "nii"
    if p.endswith(".dcm"):
        return "dcm"
    return "jpg" if p.endswith((".jpg", ".jpeg")) else "png"


class Site:
    """The pages of the viewer over some run directories.

    Args:
        paths: run directories (see :func:`~bat_gym.viewer.runs.load_runs`).
    """

    def __init__(self, paths: list[str | Path]) -> None:
        self.runs = load_runs(paths)
        self.by_id = {r.id: r for r in self.runs}
        self._items = lru_cache(maxsize=8)(self._item_outcomes)

    # ------------------------------------------------------------------ routing
    def get(self, name: str) -> tuple[bytes, str] | None:
        """The page ``name`` as ``(content, content type)``; None if there is none."""
        name = name.lstrip("/") or "index.html"
        if name == "index.html":
            return self._html("bat-gym view", pages.index_page(self.runs), ())
        if name in ("viewer.css", "viewer.js"):
            data = resources.files("bat_gym.viewer").joinpath("static", name).read_bytes()
            return data, _TYPES[Path(name).suffix]
        m = _ROUTE.match(name)
        if m is None or m["rid"] not in self.by_id:
            return None
        run = self.by_id[m["rid"]]
        try:
            body = self._route(run, m)
        except (KeyError, IndexError, ValueError, ImageError):
            return None
        if body is None:
            return None
        if isinstance(body, bytes):
            return body, "image/png"
        if m["ext"] == ".eval.json":
            return body.encode(), "application/json"
        return body.encode(), _TYPES[".html"]

    def _crumbs(self, run: Run) -> list[tuple[str, str]]:
        out = [("runs", "index.html")]
        if run.parent:
            out.append((self.by_id[run.parent].title, f"{run.parent}.html"))
        out.append((run.title, f"{run.id}.html"))
        return out

    def _html(self, title: str, body: str, crumbs: Any) -> tuple[bytes, str]:
        return page(title, body, crumbs=crumbs).encode(), _TYPES[".html"]

    def _route(self, run: Run, m: re.Match[str]) -> str | bytes | None:
        ext = m["ext"]
        if m["sha"]:
            data = run.blob(m["sha"])
            return None if data is None else to_png(data, _IMAGE_NAME[m["kind"]])
        if ext == ".eval.json":
            from bat_gym.viewer.export import inspect_log, rollouts_log

            if m["step"] and m["n"] is None and run.kind == "grpo":
                rollouts = run.rollouts(int(m["step"]))
                return (
                    json.dumps(rollouts_log(run, int(m["step"]), rollouts), indent=1)
                    if rollouts
                    else None
                )

            if m["overview"] is not None and run.kind == "eval":
                return json.dumps(inspect_log(run, [c for c in run.cells]), indent=1)
            if m["key"] and run.kind == "eval":
                cell = run.cell(m["key"])
                return None if cell is None else json.dumps(inspect_log(run, [cell]), indent=1)
            return None
        if ext != ".html":
            return None
        crumbs = self._crumbs(run)
        if m["overview"] is not None or m["page"]:
            body = self._overview(run, int(m["page"] or 1))
            return None if body is None else page(run.title, body, crumbs=crumbs[:-1])
        if m["key"]:
            return self._cell_episode(run, m["key"], crumbs)
        if m["traj"]:
            return self._trajectory(run, int(m["traj"]), crumbs)
        if m["step"]:
            step = int(m["step"])
            rollouts = run.rollouts(step)
            if not rollouts:
                return None
            if m["n"] is None:
                return page(
                    f"GRPO step {step}", pages.grpo_step(run, step, rollouts), crumbs=crumbs
                )
            trace = rollouts[int(m["n"])]
            crumbs.append((f"step {step}", f"{run.id}-step-{step}.html"))
            head = (f'<div class="banner train-side">Training rollout: step {step}, group '
                    f"{h(trace.get('group'))}, pool {h(trace.get('pool'))}, state {h(trace.get('state_id'))}, "
                    f"ended {h(trace.get('stop_reason'))}, reward {fmt(trace.get('reward'))}</div>")  # fmt: skip
            body = render_episode(
                trace, blob=lambda _: None, image_href=lambda _: None, header=head
            )
            return page(f"step {step} rollout {m['n']}", body, crumbs=crumbs)
        if m["other"]:
            other = self.by_id.get(m["other"])
            if other is None or run.kind != "eval" or other.kind != "eval":
                return None
            body = pages.compare_page(run, other, self._items(run.id), self._items(other.id))
            return page(f"{run.id} vs {other.id}", body, crumbs=crumbs)
        return None

    def _overview(self, run: Run, page_no: int) -> str | None:
        if run.kind == "eval":
            return pages.eval_overview(run, self.runs)
        if run.kind == "bank":
            return pages.bank_overview(run)
        if run.kind == "grpo":
            return pages.grpo_overview(run, page_no)
        kids = "".join(
            f"<li><a href='{k}.html'>{h(self.by_id[k].title)}</a></li>" for k in run.children
        )
        if run.kind == "study":
            return pages.study_overview(run) + f"<h2>Runs of this study</h2><ul>{kids}</ul>"
        return pages.loop_overview(run, self.runs) + f"<h2>Runs of this loop</h2><ul>{kids}</ul>"

    def _cell_episode(self, run: Run, key: str, crumbs: list[tuple[str, str]]) -> str | None:
        cell, trace = run.cell(key), run.episode(key)
        if trace is None:
            return None
        rid = run.id

        def image_href(f: dict[str, Any]) -> str:
            return f"{rid}-img-{f['sha256']}-{_image_kind(f['path'])}.png"

        fails = ", ".join((cell or {}).get("failures", [])) or "none"
        head = (
            pages.EVAL_BANNER
            + f'<div class="card"><b>{h(key)}</b> task {h(trace.get("task_id"))} · '
            f"overall {fmt((cell or {}).get('overall'))} · reward {fmt(trace.get('reward'))} · "
            f"{pill((cell or {}).get('finished'), 'finished' if (cell or {}).get('finished') else 'did not finish')}"
            f" · ended {h(trace.get('stop_reason'))} · failures: {h(fails)} · <a href='{rid}-ep-{h(key)}.eval.json' download>Inspect log</a></div>"
        )
        body = render_episode(trace, blob=run.blob, image_href=image_href, header=head)
        return page(f"{key}", body, crumbs=crumbs)

    def _trajectory(self, run: Run, n: int, crumbs: list[tuple[str, str]]) -> str | None:
        name, rows = sorted(run.trajectories().items())[n]
        longest = rows[-1]
        bounds = [
            (len(r["messages"]), r["focus"], f"start state {r['state_id']}")
            for r in rows
            if r["focus"] != "E2E"
        ]
        trace = {
            "messages": list(longest["messages"]),
            "prefix_messages": 2,
            "focus": "E2E",
            "verdict": None,
            "files": [],
        }
        head = (pages.TRAIN_BANNER + f'<div class="card"><b>{h(name)}</b>: the teacher\'s turns up to the '
                "last stage boundary; each dashed line is where a Stage Bank row starts (its prefix is "
                "everything above it).</div>")  # fmt: skip
        side = (
            '<div class="card"><h2>Stage Bank rows</h2><p class="muted">Each row starts an episode '
            "at its stage, with the messages above its line as the replayed prefix.</p><ul>"
            + "".join(
                f"<li>{stage_pill(r['focus'])} <a href='#boundary-{h(r['focus'])}'>{h(r['state_id'])}</a> "
                f"<span class='muted'>{len(r['messages'])} messages</span></li>"
                for r in rows
                if r["focus"] != "E2E"
            )
            + "</ul></div>"
        )
        body = render_episode(
            trace,
            blob=lambda _: None,
            image_href=lambda _: None,
            boundaries=bounds,
            header=head,
            side=side,
        )
        return page(name, body, crumbs=crumbs)

    def _item_outcomes(self, rid: str) -> dict[str, dict[str, bool | None]]:
        """Cell key -> ``"stage/item"`` -> passed, from an evaluation's traces."""
        run = self.by_id[rid]
        out: dict[str, dict[str, bool | None]] = {}
        for c in run.cells:
            key = pages._key(c)
            verdict = run.verdict(key) or {}
            out[key] = {
                f"{s['stage']}/{it['id']}": it.get("passed")
                for s in verdict.get("stages", [])
                for it in s.get("items", [])
            }
        return out

    # ------------------------------------------------------------------ export
    def names(self) -> Iterator[str]:
        """Every page name of the site (what a static export writes)."""
        yield from ("index.html", "viewer.css", "viewer.js")
        for run in self.runs:
            yield f"{run.id}.html"
            if run.kind == "eval":
                yield f"{run.id}.eval.json"
                for c in run.cells:
                    key = pages._key(c)
                    trace = run.episode(key)
                    if trace is None:
                        continue
                    yield f"{run.id}-ep-{key}.html"
                    yield f"{run.id}-ep-{key}.eval.json"
                    for f in trace.get("files") or []:
                        if f.get("kind") == "image" and f.get("stored"):
                            yield f"{run.id}-img-{f['sha256']}-{_image_kind(f['path'])}.png"
                for other in self.runs:
                    if other.kind == "eval" and other is not run:
                        yield f"{run.id}-vs-{other.id}.html"
            elif run.kind == "bank":
                yield from (f"{run.id}-traj-{i}.html" for i in range(len(run.trajectories())))
            elif run.kind == "grpo":
                steps = sorted({int(r["step"]) for r in run.metrics} | set(run.rollout_steps()))
                pages_ = max(1, -(-len(steps) // pages.STEPS_PER_PAGE))
                yield from (f"{run.id}-p{p}.html" for p in range(2, pages_ + 1))
                for s in run.rollout_steps():
                    yield f"{run.id}-step-{s}.html"
                    yield f"{run.id}-step-{s}.eval.json"
                    yield from (f"{run.id}-step-{s}-{n}.html" for n in range(len(run.rollouts(s))))

    def export(self, out: str | Path) -> int:
        """Write every page into ``out`` (created); returns how many files were written.

        Pages that fail to render (an unreadable image) are left out, and links to them
        show as broken, as a served viewer would answer 404.
        """
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        n = 0
        for name in self.names():
            got = self.get(name)
            if got is not None:
                (folder / name).write_bytes(got[0])
                n += 1
        return n
