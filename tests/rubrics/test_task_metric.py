"""Benchmark.task_score: the toy metric, read from a frozen workspace."""

import pytest

from bat_gym.rubrics.contract.workspace import FrozenWorkspace


@pytest.fixture
def scored(toy, store):
    task = toy.make_task("lookup", 3, "train")
    labels = toy.private_answers(task)["scores"]

    def score(content):
        files = {} if content is None else {"outputs/submission.csv": content}
        return toy.task_score(task, FrozenWorkspace.from_files(store, files))

    return score, labels


def csv_of(labels):
    return "id,score\n" + "".join(f"{c},{y:.4f}\n" for c, y in labels.items())


def test_agreement_with_the_private_scores(scored):
    score, labels = scored
    assert score(csv_of(labels)) == 1.0
    first = next(iter(labels))
    moved = {**labels, first: labels[first] + 0.01}
    assert score(csv_of(moved)) == pytest.approx((len(labels) - 1) / len(labels))
    garbled = csv_of(labels).replace(f"{first},{labels[first]:.4f}", f"{first},one")
    assert score(garbled) == pytest.approx((len(labels) - 1) / len(labels))


@pytest.mark.parametrize(
    "broken",
    [
        None,  # no submission
        "",
        "case,prediction\nx,1\n",  # wrong columns
        b"\xff\xfe\x00",  # not text
    ],
)
def test_a_missing_or_garbled_submission_scores_0(scored, broken):
    score, _ = scored
    assert score(broken) == 0.0


def test_a_missing_or_repeated_case_scores_0(scored):
    score, labels = scored
    rows = csv_of(labels).splitlines(keepends=True)
    assert score("".join(rows[:-1])) == 0.0
    assert score("".join(rows) + rows[1]) == 0.0


def test_the_default_benchmark_has_no_metric(toy, store):
    from bat_gym.benchmark import Benchmark

    task = toy.make_task("lookup", 3, "train")
    assert Benchmark.task_score(toy, task, FrozenWorkspace.from_files(store, {})) is None
