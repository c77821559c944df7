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


def test_tiers_are_aggregated_like_the_overall_over_their_own_cells(toy):
    # Repeat r of every track is on tier "easy" when r is even, "hard" when odd.
    results = [
        r.model_copy(update={"tier": "hard" if r.cell.repeat % 2 else "easy"})
        for r in leaky_results(toy)
    ]
    agg = aggregate(results, toy.spec)
    first, n = toy.spec.tracks[0].name, len(toy.spec.tracks)
    assert set(agg.tiers) == {"easy", "hard"}
    # easy: repeats 0 and 2 (0.5, 0.7), but the first track's repeat 2 is invalid.
    assert agg.tiers["easy"].tracks[first].overall == pytest.approx(0.5)
    assert agg.tiers["easy"].overall == pytest.approx((0.5 + 0.6 * (n - 1)) / n)
    assert agg.tiers["hard"].overall == pytest.approx(0.6)
    assert agg.tiers["hard"].completion.runs == n
    # The overall still pools both tiers: mean over tracks of mean over repeats.
    assert agg.overall == pytest.approx((0.55 + 0.6 * (n - 1)) / n)
    assert CANARY not in agg.model_dump_json()
    data = json.loads(agg.model_dump_json())
    data["tiers"]["the answer is 42"] = data["tiers"].pop("easy")
    with pytest.raises(ValidationError):
        Aggregates.model_validate(data)


def test_results_without_tiers_have_no_tier_table(toy):
    assert aggregate(leaky_results(toy), toy.spec).tiers == {}


def test_the_report_has_a_table_per_tier(toy, tmp_path):
    from bat_gym.evaluation.report import EvalReport, write_markdown

    results = [
        r.model_copy(update={"tier": "hard" if r.cell.repeat % 2 else "easy"})
        for r in leaky_results(toy)
    ]
    report = EvalReport(
        manifest={"benchmark": {"name": "toy"}, "policy": {"name": "p"}, "timing": {"wall_s": 1}},
        aggregates=aggregate(results, toy.spec),
        intervals={},
        cells=tuple(results),
    )
    write_markdown(report, tmp_path / "r.md", chart=None)
    text = (tmp_path / "r.md").read_text()
    assert "## Tier easy" in text and "## Tier hard" in text
