import pytest

from bat_gym.evaluation import EvalConfig, evaluate
from bat_gym.policies import make_policy


@pytest.mark.slow
def test_eval_on_ray_actors_scores_like_in_process(local_ray, toy, tmp_path):
    here = evaluate(
        toy, make_policy("teacher"), tmp_path / "here", EvalConfig(repeats=1, progress=False)
    )
    cfg = EvalConfig(repeats=1, progress=False, ray="local")
    there = evaluate(toy, make_policy("teacher"), tmp_path / "ray", cfg)
    assert there.aggregates.valid
    assert there.aggregates.overall == pytest.approx(here.aggregates.overall)
    assert there.aggregates.cells_digest == here.aggregates.cells_digest
