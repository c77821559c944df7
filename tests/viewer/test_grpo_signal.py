"""A GRPO run's overview shows the cut and zero-advantage figures that explain a flat curve."""

import json

from bat_gym.viewer import Site


def _run(tmp_path, records):
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    got = Site([run]).get("r0.html")
    assert got is not None
    return got[0].decode()


def test_the_step_table_shows_cut_and_zero_advantage_and_names_flat_steps(tmp_path):
    flat = {"reward": 0.0, "length_cut": 1.0, "zero_advantage_groups": 1.0}
    taught = {"reward": 0.3, "length_cut": 0.25, "zero_advantage_groups": 0.5}
    html = _run(tmp_path, [{"step": 1, **flat}, {"step": 2, **taught}])
    assert "<th class='num'>cut</th><th class='num'>zero-adv groups</th>" in html
    assert "<td class='num'>0.25</td><td class='num'>0.50</td>" in html
    assert "1 of 2 steps had no learning signal" in html
    assert "1 of them with every episode cut by a token limit" in html


def test_a_run_that_taught_on_every_step_has_no_such_line(tmp_path):
    html = _run(tmp_path, [{"step": 1, "reward": 0.3, "zero_advantage_groups": 0.25}])
    assert "no learning signal" not in html
