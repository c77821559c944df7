"""Nothing but aggregates crosses from evaluation to training."""

import json

import pytest
from pydantic import ValidationError

from bat_gym.evaluation import Aggregates, Cell, CellResult, aggregate
from bat_gym.evaluation.aggregates import cells_digest

CANARY = "CANARY-7f3a"


def leaky_results(toy):
    """Results whose every free-text field carries the canary."""
    out = []
    for i, track in enumerate(t.name for t in toy.spec.tracks):
        for r in range(3):
            out.append(
                CellResult(
                    cell=Cell(track=track, seed=1_000_000 + r, repeat=r),
                    task_id=f"{track}-{CANARY}-task",
                    valid=(i, r) != (0, 2),
                    error=f"/tmp/{CANARY}/workspace crashed: answer=42 {CANARY}",
                    overall=0.5 + 0.1 * r,
                    task=0.4,
                    agentic=0.6,
                    reward=0.5,
                    stages={"S1": 1.0, "S3": 0.25},
                    finished=True,
                    failures=("stage_incomplete",),
                    notes=(f"the answer is {CANARY}", f"/workspace/outputs/{CANARY}.csv"),
                )
            )
    return out


def test_no_task_id_path_answer_or_log_text_reaches_aggregates(toy):
    agg = aggregate(leaky_results(toy), toy.spec)
    text = agg.model_dump_json()
    assert CANARY not in text
    # Category names may say "workspace" (unsafe_workspace); a path, an error or a note may not.
    words = text.replace('"unsafe_workspace"', '"unsafe_"')
    for forbidden in ("1000000", "/tmp", "workspace", "answer", "crashed"):
        assert forbidden not in words


def _string_leaves(schema, defs, path="$"):
    """Every string-typed node of a JSON schema, with its constraints."""
    if "$ref" in schema:
        yield from _string_leaves(defs[schema["$ref"].split("/")[-1]], defs, path)
        return
    for key in ("anyOf", "allOf", "oneOf"):
        for i, sub in enumerate(schema.get(key, [])):
            yield from _string_leaves(sub, defs, f"{path}|{i}")
    if schema.get("type") == "string":
        yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _string_leaves(sub, defs, f"{path}.{name}")
    for pattern, sub in schema.get("patternProperties", {}).items():
        yield f"{path}.<key>", {"type": "string", "pattern": pattern}
        yield from _string_leaves(sub, defs, f"{path}.<{pattern}>")
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), dict):
            yield from _string_leaves(schema[key], defs, f"{path}.{key}")
    if (
        schema.get("type") == "object"
        and "properties" not in schema
        and "patternProperties" not in schema
    ):
        # A mapping: its keys are strings too, and must be constrained.
        yield f"{path}.<key>", {"type": "string", **schema.get("propertyNames", {})}


def test_every_string_in_the_aggregates_type_is_constrained():
    """A free-text field could carry anything: every string is a pattern, enum or const."""
    schema = Aggregates.model_json_schema()
    leaves = list(_string_leaves(schema, schema.get("$defs", {})))
    assert leaves  # keys and the digest are strings
    for path, node in leaves:
        assert {"pattern", "enum", "const"} & set(node), f"{path} is unconstrained text"
    # Mapping keys (stage ids, track names, failure categories) are among the leaves.
    keys = [p for p, _ in leaves if p.endswith("<key>")]
    assert {"$.stages.<key>", "$.tracks.<key>", "$.failures.<key>"} <= set(keys)


def test_extra_fields_and_free_text_are_refused(toy, tmp_path):
    agg = aggregate(leaky_results(toy), toy.spec)
    data = json.loads(agg.model_dump_json())
    data["notes"] = "the answer is 42"
    path = tmp_path / "aggregates.json"
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="notes"):
        Aggregates.read(path)
    data.pop("notes")
    data["tracks"]["/tmp/x answer"] = data["tracks"].popitem()[1]
    with pytest.raises(ValidationError):
        Aggregates.model_validate(data)
    data = json.loads(agg.model_dump_json())
    data["failures"] = {"the answer was 42": 1}
    with pytest.raises(ValidationError):
        Aggregates.model_validate(data)


def test_means_are_over_tracks_and_skip_invalid_cells(toy):
    results = leaky_results(toy)
    agg = aggregate(results, toy.spec)
    first = toy.spec.tracks[0].name
    assert agg.tracks[first].overall == pytest.approx(0.55)  # its third repeat is invalid
    others = [0.6] * (len(toy.spec.tracks) - 1)
    assert agg.overall == pytest.approx((0.55 + sum(others)) / len(toy.spec.tracks))
    assert agg.completion.invalid == 1 and not agg.valid
    assert agg.stages["S2"] is None  # unscored is null, not zero
    assert agg.failures["stage_incomplete"] == len(results)


def test_cells_digest_pairs_runs_without_naming_cells(toy):
    results = leaky_results(toy)
    assert cells_digest(results) == cells_digest(list(reversed(results)))
    assert cells_digest(results) != cells_digest(results[1:])


def test_the_constraint_check_catches_a_free_text_field():
    class Leaky(Aggregates):
        note: str = ""

    schema = Leaky.model_json_schema()
    leaves = dict(_string_leaves(schema, schema.get("$defs", {})))
    assert not {"pattern", "enum", "const"} & set(leaves["$.note"])
