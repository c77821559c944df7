from collections import Counter

import pytest

from bat_gym.core.spec import StageState
from bat_gym.curriculum.rounds import RLRow, RoundSpec, build_round

TRACKS = [f"track{i}" for i in range(7)]
OUTCOMES = ["success", "recovery", "failure"]
FOCUSES = ["S1", "S2", "S3", "S4", "S5", "E2E"]


def state(focus, track, outcome, n=0):
    return StageState(
        state_id=f"{track}.{n}.{focus}.{outcome}",
        benchmark="synthetic",
        benchmark_version="1",
        focus=focus,
        track=track,
        outcome=outcome,
        task_id=f"{track}.{n}",
        messages=({"role": "user", "content": "prompt"},),
        snapshot="0" * 64,
        provenance={"split": "train", "seed": n},
    )


def grid(per_cell=1, focuses=FOCUSES):
    return [
        state(f, t, o, n)
        for f in focuses
        for t in TRACKS
        for o in OUTCOMES
        for n in range(per_cell)
    ]


@pytest.fixture(scope="module")
def rows():
    return grid(per_cell=4)  # 6 x 7 x 3 x 4 = 504 states: 84 per focus


@pytest.fixture(scope="module")
def reference(rows):
    return build_round(rows, RoundSpec(target="S3"))


def by_pool(batches, pool):
    return [r for b in batches for r in b if r.pool == pool]


def spread(counter, keys):
    counts = [counter[k] for k in keys]
    return max(counts) - min(counts)


def test_reference_round_is_378_batches_of_8(reference):
    assert RoundSpec(target="S3").rows == 3024
    assert len(reference) == 378
    assert sum(len(b) for b in reference) == 3024


def test_every_batch_is_4_target_2_mix_2_e2e(reference):
    for batch in reference:
        assert [r.pool for r in batch] == ["target"] * 4 + ["mix"] * 2 + ["e2e"] * 2
        assert all(r.focus == "S3" for r in batch[:4])
        assert all(r.focus not in ("S3", "E2E") for r in batch[4:6])
        assert all(r.focus == "E2E" for r in batch[6:])
        assert all(r.target == "S3" for r in batch)
        assert len({r.state_id for r in batch}) == 8


@pytest.mark.parametrize("pool", ["target", "mix", "e2e"])
def test_each_pool_is_balanced_over_track_and_outcome(reference, pool):
    drawn = by_pool(reference, pool)
    assert spread(Counter(r.track for r in drawn), TRACKS) <= 1
    assert spread(Counter(r.outcome for r in drawn), OUTCOMES) <= 1
    pairs = [(t, o) for t in TRACKS for o in OUTCOMES]
    assert spread(Counter((r.track, r.outcome) for r in drawn), pairs) <= 1
    # ... and at every prefix, so any stretch of the round is balanced too
    seen = Counter()
    for r in drawn[:200]:
        seen[r.track] += 1
        assert spread(seen, TRACKS) <= 1


@pytest.mark.parametrize("pool", ["target", "mix", "e2e"])
def test_no_state_repeats_while_its_pool_lasts(rows, reference, pool):
    drawn = [r.state_id for r in by_pool(reference, pool)]
    size = len({r.state_id for r in rows if _in_pool(r, pool)})
    for start in range(0, len(drawn) - size + 1, size):
        assert len(set(drawn[start : start + size])) == size  # each pass: every state once
    assert len(set(drawn[:size])) == size


def _in_pool(r, pool):
    return {
        "target": r.focus == "S3",
        "mix": r.focus not in ("S3", "E2E"),
        "e2e": r.focus == "E2E",
    }[pool]


def test_same_inputs_give_the_same_round_whatever_the_row_order(rows, reference):
    again = build_round(list(reversed(rows)), RoundSpec(target="S3"))
    assert again == reference
    other = build_round(rows, RoundSpec(target="S3", seed=1))
    assert [r.state_id for b in other for r in b] != [r.state_id for b in reference for r in b]


def test_rows_are_prompt_only(reference):
    fields = set(RLRow.model_fields)
    assert fields == {
        "state_id", "benchmark", "target", "pool", "focus", "track", "outcome",
        "contract", "provenance",
    }  # fmt: skip
    with pytest.raises(ValueError):
        RLRow(**reference[0][0].model_dump(), messages=[])


def test_composition_is_configurable_and_must_fill_the_batch(rows):
    spec = RoundSpec(target="S1", batch_size=4, target_per_batch=2, mix_per_batch=1,
                     e2e_per_batch=1, batches=5)  # fmt: skip
    batches = build_round(rows, spec)
    assert [[r.pool for r in b] for b in batches] == [["target", "target", "mix", "e2e"]] * 5
    with pytest.raises(ValueError, match=r"== batch_size \(8\), got 4 \+ 2 \+ 1 = 7"):
        RoundSpec(target="S1", e2e_per_batch=1)
    with pytest.raises(ValueError, match="extra"):
        RoundSpec(target="S1", composition=(4, 2, 2))
    with pytest.raises(ValueError):
        RoundSpec(target="E2E")


def test_small_pools_start_new_passes_without_repeats_inside_a_batch():
    rows = [state(f, t, "success", n) for f in FOCUSES for t in TRACKS[:2] for n in range(3)]
    batches = build_round(rows, RoundSpec(target="S2", batches=50))  # 6 target states
    for batch in batches:
        assert len({r.state_id for r in batch}) == 8
    target = [r.state_id for r in by_pool(batches, "target")]
    assert Counter(target).most_common()[-1][1] >= 33  # 200 draws over 6 states
    assert max(Counter(target).values()) - min(Counter(target).values()) <= 1


def test_errors_name_what_is_missing():
    rows = grid(focuses=["S1", "S2", "E2E"])
    with pytest.raises(ValueError, match=r"unknown target stage 'S4'.*\['E2E', 'S1', 'S2'\]"):
        build_round(rows, RoundSpec(target="S4"))
    no_e2e = [r for r in rows if r.focus != "E2E"]
    with pytest.raises(ValueError, match=r"'e2e' pool needs at least 2 E2E states.*hold 0"):
        build_round(no_e2e, RoundSpec(target="S1"))
    only_s1 = [r for r in rows if r.focus in ("S1", "E2E")]
    with pytest.raises(ValueError, match="lower mix_per_batch"):
        build_round(only_s1, RoundSpec(target="S1"))
    ok = build_round(only_s1, RoundSpec(target="S1", target_per_batch=6, mix_per_batch=0))
    assert len(ok) == 378
    with pytest.raises(ValueError, match="more than once"):
        build_round(rows + rows[:1], RoundSpec(target="S1"))
