import json
import re
import threading
import urllib.request

import pytest
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.evaluation.episodes import EPISODE_FORMAT, file_kind, prefix_length
from bat_gym.viewer import Site, ViewerError, make_server


def page(site, name):
    got = site.get(name)
    assert got is not None, name
    return got[0].decode()


def test_evaluation_keeps_a_trace_per_cell(eval_ok):
    cells = sorted(p.stem for p in (eval_ok / "cells").glob("*.json"))
    traces = sorted(p.stem for p in (eval_ok / "episodes").glob("*.json"))
    assert cells == traces and cells
    trace = json.loads((eval_ok / "episodes" / f"{cells[0]}.json").read_text())
    assert trace["format"] == EPISODE_FORMAT
    assert trace["prefix_messages"] == 2  # system and task: an E2E start state
    assert trace["record"]["calls"] and trace["verdict"]["stages"]
    written = {f["path"]: f for f in trace["files"]}
    assert "outputs/submission.csv" in written
    f = written["outputs/submission.csv"]
    assert f["before_sha256"] is None and f["stored"]
    assert (eval_ok / "episodes" / "blobs" / f["sha256"]).is_file()


def test_prefix_length_counts_the_replayed_messages():
    msgs = [
        {"role": "system"},
        {"role": "user"},
        {"role": "assistant"},
        {"role": "tool"},
        {"role": "assistant"},
        {"role": "tool"},
        {"role": "assistant"},
    ]
    assert prefix_length(msgs, 2) == 4
    assert prefix_length(msgs, 0) == len(msgs)
    assert file_kind("a/b.nii.gz") == "image" and file_kind("x.py") == "text"
    assert file_kind("model.bin") == "binary"


def test_overview_lists_every_cell_with_its_episode(eval_ok):
    site = Site([eval_ok])
    html = page(site, "r0.html")
    for p in (eval_ok / "cells").glob("*.json"):
        assert f'href="r0-ep-{p.stem}.html"' in html
    assert "evaluation side of the firewall" in html
    assert "<svg" in html  # the stage chart


def test_episode_page_links_failed_evidence_to_its_call(eval_fail):
    site = Site([eval_fail])
    key = sorted(p.stem for p in (eval_fail / "episodes").glob("*.json"))[0]
    html = page(site, f"r0-ep-{key}.html")
    trace = json.loads((eval_fail / "episodes" / f"{key}.json").read_text())
    failed = [it for s in trace["verdict"]["stages"] for it in s["items"] if it["passed"] is False]
    assert failed, "the failure script fails some item"
    for call in trace["record"]["calls"]:
        assert f'id="call-{call["index"]}"' in html
    for m in re.finditer(r'class="evidence" href="#(call-\d+|file-[^"]+)"', html):
        assert f'id="{m.group(1)}"' in html, m.group(1)
    assert trace["verdict"]["contract"]["sha256"] in html


def test_hostile_output_is_shown_not_run(eval_ok, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(eval_ok, run)
    path = sorted((run / "episodes").glob("*.json"))[0]
    trace = json.loads(path.read_text())
    trace["messages"][2]["content"] = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    trace["record"]["calls"][0]["output"] = "</pre><script>steal()</script>"
    path.write_text(json.dumps(trace))
    html = page(Site([run]), f"r0-ep-{path.stem}.html")
    assert "<script>alert" not in html and "<script>steal" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_static_export_is_self_contained(eval_ok, eval_fail, tmp_path):
    out = tmp_path / "site"
    n = Site([eval_ok, eval_fail]).export(out)
    assert n == len(list(out.iterdir()))
    for html in out.glob("*.html"):
        text = html.read_text()
        assert "http://" not in text and "https://" not in text, html.name  # no CDN
        for href in re.findall(r'(?:href|src)="((?!data:)[^"#]+)', text):
            assert (out / href).is_file(), f"{html.name} links {href}"
    assert (out / "r0-vs-r1.html").is_file()


def test_compare_names_the_flipped_items(eval_ok, eval_fail):
    html = page(Site([eval_ok, eval_fail]), "r0-vs-r1.html")
    assert "flip-down" in html and "True → False" in html


def test_view_refuses_to_write_inside_a_run(eval_ok, tmp_path):
    result = CliRunner().invoke(app, ["view", str(eval_ok), "--static", str(eval_ok / "site")])
    assert result.exit_code != 0
    assert not (eval_ok / "site").exists()
    ok = CliRunner().invoke(app, ["view", str(eval_ok), "--static", str(tmp_path / "site")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "site" / "index.html").is_file()


def test_unknown_directory_says_what_it_expected(tmp_path):
    with pytest.raises(ViewerError, match="bat-gym eval --out"):
        Site([tmp_path])


def test_server_answers_on_loopback(eval_ok):
    server = make_server(Site([eval_ok]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as r:
            assert b"toy_pipeline evaluation" in r.read()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/../../etc/passwd")
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_bank_shows_each_trajectory_with_its_row_boundaries(toy_bank):
    site = Site([toy_bank.root])
    html = page(site, "r0.html")
    assert "r0-traj-0.html" in html and "Training side" in html
    traj = page(site, "r0-traj-0.html")
    for stage in ("S2", "S3", "S4", "S5"):
        assert f'id="boundary-{stage}"' in traj
    assert 'id="call-0"' in traj


def grpo_run(tmp_path, steps=250, per_step=8):
    from types import SimpleNamespace

    from bat_gym.trainers.rollout_log import log_rollouts

    run = tmp_path / "grpo"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "reward": s / steps, "loss": 0.1}) + "\n"
            for s in range(1, steps + 1)
        )
    )
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "<b>turn</b>"}]  # fmt: skip
    for s in range(1, steps + 1, 10):
        rollouts = [
            SimpleNamespace(
                state_id=f"t.S3.success.{i // 2}",
                reward=0.5,
                reward_or_none=0.5,
                verdict=None,
                stop_reason="terminated",
                response_mask=[1],
                messages=msgs,
                info={"turns": 1, "stage": "S3", "verdict": None, "record": None},
            )  # fmt: skip
            for i in range(per_step)
        ]
        log_rollouts(run, s, rollouts, ["target"] * per_step)
    return run


def test_grpo_pages_through_its_steps_and_rollouts(tmp_path):
    site = Site([grpo_run(tmp_path)])
    html = page(site, "r0.html")
    assert 'href="r0-step-11.html"' in html and 'href="r0-p3.html"' in html
    assert "<td>101</td>" not in html  # page 1 lists steps 1-100 only
    assert "<td>101</td>" in page(site, "r0-p2.html")
    step = page(site, "r0-step-11.html")
    assert "r0-step-11-7.html" in step and "r0-step-21.html" in step
    rollout = page(site, "r0-step-11-7.html")
    assert "&lt;b&gt;turn&lt;/b&gt;" in rollout and "step 11" in rollout
    assert site.get("r0-step-12.html") is None  # no sample kept for that step


def test_loop_links_its_rounds_to_their_runs(eval_ok, eval_fail, tmp_path):
    import shutil

    loop = tmp_path / "loop"
    shutil.copytree(eval_ok, loop / "evals" / "start")
    shutil.copytree(eval_fail, loop / "evals" / "round-00")
    grpo = grpo_run(tmp_path, steps=2)
    shutil.copytree(grpo, loop / "rounds" / "round-00" / "grpo")
    state = {
        "round": 1, "phase": "done", "incumbent": "tiny", "target": "S3",
        "incumbent_eval": str(loop / "evals" / "start"),
        "rounds": [{"round": 0, "target": "S3", "candidate": "c", "eval": str(loop / "evals" / "round-00"),
                    "decision": "reject", "failed_checks": ["overall"], "candidate_overall": 0.7,
                    "incumbent_overall": 1.0, "best_overall": 1.0, "next_target": "S3",
                    "gate": {"checks": [{"name": "overall", "passed": False, "drop": 0.3, "threshold": 0.01}]}}],
    }  # fmt: skip
    (loop / "loop_state.json").write_text(json.dumps(state))
    site = Site([loop])
    assert [r.kind for r in site.runs] == ["loop", "eval", "grpo", "eval"]
    html = page(site, "r0.html")
    assert "reject" in html and "r2.html" in html and "r1-vs-r3.html" in html
    assert "<svg" in html
    page(site, "r1-vs-r3.html")


def test_view_serves_until_interrupted(eval_ok):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cmd = [str(Path(sys.executable).parent / "bat-gym"), "view", str(eval_ok)]
    # Ctrl-C as a terminal sends it: a test run started in the background (`cmd &`)
    # hands its children SIGINT ignored, and Python then installs no handler for it.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "r0.html") as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopped" in out
    finally:
        proc.kill()


def test_verdicts_are_read_from_the_head_or_else_the_whole_trace(eval_fail, tmp_path):
    import shutil

    from bat_gym.viewer.runs import load_runs

    run_dir = tmp_path / "run"
    shutil.copytree(eval_fail, run_dir)
    key = sorted(p.stem for p in (run_dir / "episodes").glob("*.json"))[0]
    path = run_dir / "episodes" / f"{key}.json"
    trace = json.loads(path.read_text())
    (run,) = load_runs([run_dir])
    assert run.verdict(key) == trace["verdict"]
    # A trace laid out with its verdict last (as an older writer might) is read whole.
    reordered = {k: v for k, v in trace.items() if k != "verdict"} | {"verdict": trace["verdict"]}
    path.write_text(json.dumps(reordered))
    (run,) = load_runs([run_dir])
    assert run.verdict(key) == trace["verdict"]
    assert run.verdict("../../etc/passwd") is None
