"""__NAME__'s own tests: seeded tasks, contracts, and what the teacher and the naive earn.

Run them from this directory with ``python -m pytest tests`` after
``python -m pip install -e '.[test]'``: the benchmark is loaded through its entry point,
as every ``bat-gym`` command loads it.
"""

import pytest

from bat_gym.catalog import get_benchmark
from bat_gym.evaluation import EvalConfig, evaluate
from bat_gym.policies import make_policy


@pytest.fixture(scope="module")
def bench():
    return get_benchmark("__NAME__")


def test_tasks_are_seeded_and_the_answers_stay_private(bench, tmp_path):
    task = bench.make_task("units", 0, "train")
    assert task == bench.make_task("units", 0, "train")
    assert task.task_id != bench.make_task("units", 1, "train").task_id
    bench.write_public_files(task, tmp_path)
    public = "".join(p.read_text() for p in sorted(tmp_path.rglob("*")) if p.is_file())
    for case, score in bench.private_answers(task)["scores"].items():
        assert case in public and f"{score:.4f}" not in public


def test_every_stage_and_e2e_has_a_contract(bench):
    library = bench.contract_library()
    assert [library.for_focus(f) is not None for f in bench.spec.focuses] == [True] * len(
        bench.spec.focuses
    )


@pytest.mark.parametrize(("policy", "low", "high"), [("teacher", 0.95, 1.0), ("naive", 0.0, 0.2)])
def test_held_out_rewards(bench, tmp_path, policy, low, high):
    # Two held-out tasks, played as `bat-gym eval --policy POLICY` plays them.
    cfg = EvalConfig(repeats=2, workers=1, progress=False)
    report = evaluate(bench, make_policy(policy), tmp_path, cfg)
    assert low <= report.aggregates.overall <= high
