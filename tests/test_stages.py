"""The reference stage set in the core, and the suites that reuse it."""

import pytest

from bat_gym.catalog import STAGE_ENV_NAMES, get_benchmark
from bat_gym.core.errors import ConfigError
from bat_gym.core.stages import (
    REFERENCE_ARTIFACTS,
    REFERENCE_STAGE_NAMES,
    REFERENCE_WEIGHTS,
    reference_stage,
    reference_stages,
)
from bat_gym.scaffold import STAGE_SETS

SKILLS = {f"S{i}": f"skill {i}" for i in range(1, 6)}


def test_the_reference_stages_in_order_with_their_weights_and_artifacts():
    stages = reference_stages(SKILLS)
    assert [(s.id, s.name) for s in stages] == [
        ("S1", "Plan"), ("S2", "Setup"), ("S3", "Validate"), ("S4", "Infer"), ("S5", "Submit"),
    ]  # fmt: skip
    assert [s.weight for s in stages] == [0.25, 0.15, 0.35, 0.15, 0.10]
    assert sum(REFERENCE_WEIGHTS.values()) == pytest.approx(1.0)
    assert stages[2].artifacts == ("validation/pilot.csv", "validation/s3_validation.json")
    assert [s.skill for s in stages] == list(SKILLS.values())
    # The names are the ones the stage env ids serve, and the scaffold's full set.
    assert STAGE_ENV_NAMES[:5] == REFERENCE_STAGE_NAMES == STAGE_SETS[5]


def test_a_suite_names_its_own_artifacts_where_they_differ():
    stages = reference_stages(SKILLS, artifacts={"S3": ("pilot.csv",)})
    assert stages[2].artifacts == ("pilot.csv",)
    assert stages[3].artifacts == REFERENCE_ARTIFACTS["Infer"]
    one = reference_stage("Submit", id="S2", skill="s", artifacts=("out.csv",), weight=0.5)
    assert (one.id, one.name, one.weight, one.artifacts) == ("S2", "Submit", 0.5, ("out.csv",))


@pytest.mark.parametrize(
    ("skills", "artifacts", "message"),
    [
        ({k: v for k, v in SKILLS.items() if k != "S4"}, None, "missing: ['S4']"),
        ({**SKILLS, "S6": "x"}, None, "got: ['S6']"),
        (SKILLS, {"S7": ()}, "got: ['S7']"),
    ],
)
def test_stage_ids_outside_the_reference_set_are_refused(skills, artifacts, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        reference_stages(skills, artifacts=artifacts)
    with pytest.raises(ConfigError, match="not a reference stage"):
        reference_stage("Deploy", id="S1", skill="s")


@pytest.mark.parametrize("name", ["toy_pipeline", "skill_ladder", "medbench_lite"])
def test_the_suites_are_built_on_the_reference_stages(name):
    stages = get_benchmark(name).spec.stages
    assert tuple(s.name for s in stages) == REFERENCE_STAGE_NAMES
    assert {s.name: s.weight for s in stages} == REFERENCE_WEIGHTS
