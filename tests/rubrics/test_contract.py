import textwrap

import pytest
import yaml

from bat_gym.core.errors import ContractNotFound, RubricContractError, SpecError
from bat_gym.core.spec import ContractRef
from bat_gym.rubrics.contract.model import (
    REFERENCE_DIR,
    ContractLibrary,
    RubricContract,
    load_contract,
)

MINIMAL = {
    "id": "mine",
    "version": "1",
    "focus": "S1",
    "items": [
        {"id": "plan", "check": "file_exists", "args": {"path": "plan/plan.md"}},
        {
            "id": "ran",
            "check": "command_ran",
            "args": {"mentions": ["plan"]},
            "requires": ["execution"],
        },
    ],
}


def write(tmp_path, data, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else textwrap.dedent(data))
    return path


def test_the_reference_library_covers_every_stage_and_e2e():
    lib = ContractLibrary.reference()
    assert lib.ids == ["e2e", "s1_plan", "s2_setup", "s3_validate", "s4_infer", "s5_submit"]
    assert [lib.for_focus(f).id for f in ("S1", "S2", "S3", "S4", "S5", "E2E")] == [
        "s1_plan",
        "s2_setup",
        "s3_validate",
        "s4_infer",
        "s5_submit",
        "e2e",
    ]
    s3 = lib.by_id("s3_validate")
    assert s3.aggregation == "levels" and [lv.score for lv in s3.levels] == [0.0, 0.2, 0.5, 1.0]
    e2e = lib.by_id("e2e")
    assert [c.contract for c in e2e.components] == [
        "s1_plan",
        "s2_setup",
        "s3_validate",
        "s4_infer",
        "s5_submit",
    ]
    assert e2e.task_score and e2e.gates == ("successful_change",)
    assert all(c.gates == ("successful_change",) for c in lib)
    assert lib.for_focus("S9") is None


def test_the_toy_benchmark_and_its_bank_pin_the_reference_contracts(toy, toy_bank):
    lib = ContractLibrary.reference()
    for focus in toy.spec.focuses:
        assert toy.contract_ref(focus) == lib.for_focus(focus).ref
    assert all(row.contract == lib.for_focus(row.focus).ref for row in toy_bank)


def test_the_digest_is_of_the_canonical_validated_model(tmp_path):
    a = load_contract(write(tmp_path, MINIMAL, "a.yaml"))
    reordered = dict(reversed(list(MINIMAL.items())))
    b = load_contract(write(tmp_path, reordered, "b.yaml"))
    # Defaults written out explicitly validate to the same model, hence the same digest.
    c = load_contract(write(tmp_path, {**MINIMAL, "aggregation": "mean", "gates": []}, "c.yaml"))
    assert a.sha256 == b.sha256 == c.sha256
    assert len(a.sha256) == 64 and a.ref == ContractRef(id="mine", version="1", sha256=a.sha256)
    heavier = {**MINIMAL, "items": [{**MINIMAL["items"][0], "weight": 2}, MINIMAL["items"][1]]}
    assert load_contract(write(tmp_path, heavier, "d.yaml")).sha256 != a.sha256
    # A copy made without validation gets its own digest, not a cached one.
    assert a.model_copy(update={"version": "2"}).sha256 != a.sha256


def test_an_unknown_check_fails_at_load_time_naming_file_item_and_known_checks(tmp_path):
    bad = {
        **MINIMAL,
        "items": [MINIMAL["items"][0], {"id": "x", "check": "file_exist", "args": {"path": "a"}}],
    }
    path = write(tmp_path, bad)
    with pytest.raises(SpecError) as exc:
        load_contract(path)
    msg = str(exc.value)
    assert str(path) in msg and "items[1].check" in msg
    assert "unknown check 'file_exist'" in msg and "Did you mean 'file_exists'" in msg
    assert "csv_schema" in msg and "receipt_valid" in msg  # the known names are listed


@pytest.mark.parametrize(
    ("item", "where", "what"),
    [
        ({"id": "x", "check": "file_exists", "args": {}}, "items[0].args", "path: Field required"),
        (
            {"id": "x", "check": "file_exists", "args": {"path": "a", "pth": "b"}},
            "items[0].args",
            "pth: Extra inputs",
        ),
        (
            {"id": "x", "check": "csv_schema", "args": {"path": "a", "columns": "id"}},
            "items[0].args",
            "columns.list[str]: Input should be a valid list",
        ),
        (
            {"id": "x", "check": "file_exists", "args": {"path": "a"}, "requires": ["prose"]},
            "items[0].requires[0]",
            "'artifact' or 'execution'",
        ),
        (
            {"id": "x", "check": "file_exists", "args": {"path": "a"}, "weight": -1},
            "items[0].weight",
            "greater than or equal to 0",
        ),
        (
            {"id": "x", "check": "file_exists", "args": {"path": "a"}, "colour": "red"},
            "items[0].colour",
            "Extra inputs",
        ),
    ],
)
def test_item_errors_name_the_item_index_and_field(tmp_path, item, where, what):
    path = write(tmp_path, {**MINIMAL, "items": [item]})
    with pytest.raises(SpecError) as exc:
        load_contract(path)
    assert str(path) in str(exc.value)
    assert any(loc == where and what in msg for loc, msg in exc.value.problems), exc.value.problems


@pytest.mark.parametrize(
    ("update", "what"),
    [
        ({"aggregation": "levels"}, "needs levels"),
        (
            {"aggregation": "levels", "levels": [{"score": 1, "requires": ["nope"]}]},
            "levels[0] requires ['nope']",
        ),
        (
            {
                "aggregation": "levels",
                "levels": [{"score": 1, "requires": []}, {"score": 0.5, "requires": []}],
            },
            "ascending",
        ),
        ({"levels": [{"score": 1, "requires": []}]}, "only used with aggregation 'levels'"),
        ({"items": [MINIMAL["items"][0], MINIMAL["items"][0]]}, "repeated: ['plan']"),
        ({"focus": "E2E"}, "an E2E contract has components"),
        ({"task_score": True}, "E2E contracts only"),
        ({"focus": "S0"}, "should match pattern"),
    ],
)
def test_contract_level_problems_are_explained(update, what):
    with pytest.raises(SpecError, match="problem") as exc:
        from bat_gym.core.spec import load_model

        load_model(RubricContract, {**MINIMAL, **update})
    assert what in str(exc.value)


def test_a_guard_cannot_be_a_level_requirement_or_the_only_item():
    guard = {"id": "kept", "check": "unchanged", "args": {"paths": ["data/"]}, "guard": True}
    with pytest.raises(ValueError, match="not a guard"):
        RubricContract.model_validate({**MINIMAL, "items": [guard]})
    with pytest.raises(ValueError, match="guards apply to every level"):
        RubricContract.model_validate(
            {
                **MINIMAL,
                "items": [*MINIMAL["items"], guard],
                "aggregation": "levels",
                "levels": [{"score": 1, "requires": ["kept"]}],
            }
        )


def test_a_file_that_is_not_yaml_is_reported_with_its_line(tmp_path):
    path = write(tmp_path, "id: x\nitems: [\n")
    with pytest.raises(SpecError, match=r"not valid YAML at line"):
        load_contract(path)


def test_the_library_refuses_a_contract_whose_digest_differs():
    lib = ContractLibrary.reference()
    real = lib.by_id("s3_validate").ref
    pinned = real.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(RubricContractError) as exc:
        lib.get(pinned)
    assert "0" * 64 in str(exc.value) and real.sha256 in str(exc.value)
    assert exc.value.expected == "0" * 64 and exc.value.actual == real.sha256
    with pytest.raises(RubricContractError, match="version 0.9"):
        lib.get(real.model_copy(update={"version": "0.9"}))
    assert lib.get(real) is lib.by_id("s3_validate")
    with pytest.raises(ContractNotFound, match="Did you mean 's3_validate'"):
        lib.get(real.model_copy(update={"id": "s3_validat"}))


def test_an_edited_contract_file_no_longer_matches_the_pin(tmp_path):
    src = (REFERENCE_DIR / "s5_submit.yaml").read_text()
    assert "coverage: all" in src
    (tmp_path / "s5_submit.yaml").write_text(src.replace("coverage: all", "coverage: subset"))
    edited = ContractLibrary.from_dir(tmp_path)
    with pytest.raises(RubricContractError):
        edited.get(ContractLibrary.reference().by_id("s5_submit").ref)


def test_library_consistency(tmp_path):
    contract = load_contract(write(tmp_path, MINIMAL))
    with pytest.raises(RubricContractError, match="defined twice"):
        ContractLibrary([contract, contract])
    e2e = RubricContract.model_validate(
        {
            "id": "all",
            "version": "1",
            "focus": "E2E",
            "components": [{"contract": "mine", "version": "2"}],
        }
    )
    with pytest.raises(RubricContractError, match="pins version 2"):
        ContractLibrary([contract, e2e])
    missing = e2e.model_copy(
        update={"components": (e2e.components[0].model_copy(update={"contract": "theirs"}),)}
    )
    with pytest.raises(RubricContractError, match="not in the library"):
        ContractLibrary([contract, missing])
    twice = contract.model_copy(update={"id": "mine2"})
    with pytest.raises(RubricContractError, match="several contracts"):
        ContractLibrary([contract, twice]).for_focus("S1")
