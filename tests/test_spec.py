import pytest

from bat_gym.core.errors import SpecError, StageNotFound
from bat_gym.core.spec import BenchmarkSpec, Budgets, SeedRange, Splits, StageState, load_model

GOOD = {
    "name": "mini",
    "version": "1",
    "stages": [
        {"id": "S1", "name": "Plan", "weight": 0.5, "skill": "plan it"},
        {"id": "S2", "name": "Do", "weight": 0.5, "skill": "do it"},
    ],
    "tracks": [{"name": "only", "metric": "accuracy"}],
    "splits": {"train": {"start": 0, "stop": 10}, "heldout": {"start": 100, "stop": 120}},
}


def test_a_valid_spec_loads_from_yaml(tmp_path):
    import yaml

    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    spec = load_model(BenchmarkSpec, path)
    assert spec.focuses == ("S1", "S2", "E2E")
    assert spec.stage("plan").id == "S1" and spec.focus("e2e") == "E2E"
    assert spec.budgets == Budgets()  # the reference runtime's budgets by default


def test_every_problem_is_reported_with_file_and_field_path(tmp_path):
    bad = {**GOOD, "stages": [{"id": "S1", "name": "plan", "weight": 2, "skill": ""}], "extra": 1}
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError) as info:
        load_model(BenchmarkSpec, path)
    msg = str(info.value)
    assert str(path) in msg
    paths = [p for p, _ in info.value.problems]
    assert "stages[0].name" in paths and "stages[0].weight" in paths and "stages[0].skill" in paths
    assert "extra" in paths
    assert "less than or equal to 1" in msg


def test_broken_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: mini\nstages: [\n  - id: S1\n")
    with pytest.raises(SpecError, match=r"(?s)broken.yaml.*not valid YAML at line 3"):
        load_model(BenchmarkSpec, path)


def test_missing_file_and_non_mapping_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="cannot read the file"):
        load_model(BenchmarkSpec, tmp_path / "nope.yaml")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_model(BenchmarkSpec, tmp_path / "list.json")


def test_stage_order_and_split_disjointness_are_enforced():
    with pytest.raises(SpecError, match="stage ids must be S1..S2 in order"):
        load_model(BenchmarkSpec, {**GOOD, "stages": GOOD["stages"][::-1]})
    with pytest.raises(SpecError, match="overlap"):
        load_model(
            BenchmarkSpec,
            {
                **GOOD,
                "splits": {
                    "train": {"start": 0, "stop": 200},
                    "heldout": {"start": 100, "stop": 120},
                },
            },
        )
    assert not SeedRange(start=0, stop=10).overlaps(SeedRange(start=10, stop=20))
    assert (
        5 in Splits(train=SeedRange(start=0, stop=10), heldout=SeedRange(start=10, stop=30)).train
    )


def test_unknown_stage_suggests_close_names():
    spec = load_model(BenchmarkSpec, GOOD)
    with pytest.raises(StageNotFound, match="Did you mean 'Plan'"):
        spec.stage("Plann")


def test_stage_state_rejects_a_bad_snapshot_digest():
    with pytest.raises(SpecError, match="snapshot"):
        load_model(
            StageState,
            {
                "state_id": "x",
                "benchmark": "b",
                "benchmark_version": "1",
                "focus": "S1",
                "track": "t",
                "task_id": "t",
                "messages": [{"role": "user", "content": "hi"}],
                "snapshot": "not-a-digest",
            },
        )
