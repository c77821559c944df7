import json

import pytest

from bat_gym.core.errors import CurriculumError, StateNotAdmitted
from bat_gym.core.spec import StageState
from bat_gym.curriculum.rounds import RoundSpec, build_round
from bat_gym.curriculum.sampler import CurriculumSampler

SPEC = RoundSpec(target="S2", batches=3, seed=7)  # 24 draws a round


def state(focus, track, outcome, n):
    return StageState(
        state_id=f"{track}.{n}.{focus}.{outcome}", benchmark="synthetic", benchmark_version="1",
        focus=focus, track=track, outcome=outcome, task_id=f"{track}.{n}",
        messages=({"role": "user", "content": "prompt"},), snapshot="0" * 64,
    )  # fmt: skip


ROWS = [
    state(f, t, o, n)
    for f in ("S1", "S2", "S3", "E2E")
    for t in ("a", "b")
    for o in ("success", "failure")
    for n in range(2)
]


def ids(draws):
    return [(d.row.state_id, d.where) for d in draws]


def test_draws_walk_the_seeded_rounds_without_an_env():
    sampler = CurriculumSampler(ROWS, SPEC)
    draws = sampler.next(30)  # crosses into round 1
    first = [r.state_id for b in build_round(ROWS, SPEC) for r in b]
    second = [r.state_id for b in build_round(ROWS, SPEC.model_copy(update={"seed": 8})) for r in b]
    assert [d.row.state_id for d in draws] == first + second[:6]
    assert draws[9].where == {"round": 0, "batch": 1, "index": 1, "pool": "target", "target": "S2"}
    assert draws[24].where["round"] == 1 and sampler.round_spec.seed == 8
    assert sampler.last == draws[-1]


@pytest.mark.parametrize("stop", [0, 5, 24, 31])
def test_a_resumed_sampler_draws_what_an_unbroken_one_draws(stop):
    unbroken = CurriculumSampler(ROWS, SPEC)
    unbroken.next(stop)
    saved = json.loads(json.dumps(unbroken.state_dict()))  # survives a checkpoint file
    unbroken.set_target("S3")
    expected = ids(unbroken.next(40))

    resumed = CurriculumSampler(list(reversed(ROWS)), RoundSpec(target="S1"))  # spec from state
    resumed.load_state_dict(saved)
    assert resumed.last == (None if stop == 0 else CurriculumSampler(ROWS, SPEC).next(stop)[-1])
    resumed.set_target("S3")
    assert ids(resumed.next(40)) == expected


def test_from_source_reads_metadata_and_skips_unadmitted_rows():
    admitted = {r.state_id: r for r in ROWS}
    dropped = ROWS[0].state_id

    class Source:
        def select(self):
            return sorted(admitted)

        def get(self, state_id):
            if state_id == dropped:
                raise StateNotAdmitted(state_id, "no demonstration wins it")
            return admitted[state_id]

    sampler = CurriculumSampler.from_source(Source(), SPEC)
    assert dropped not in {r.state_id for r in sampler.current_round}
    assert sampler.upcoming(3) == [r.state_id for r in sampler.current_round[:3]]


def test_a_state_dict_that_does_not_fit_is_refused():
    saved = CurriculumSampler(ROWS, SPEC).state_dict()
    with pytest.raises(CurriculumError, match="saved over other states"):
        CurriculumSampler(ROWS[1:], SPEC).load_state_dict(saved)
    with pytest.raises(CurriculumError, match="version"):
        CurriculumSampler(ROWS, SPEC).load_state_dict({**saved, "version": 0})
    with pytest.raises(CurriculumError, match="cursor"):
        CurriculumSampler(ROWS, SPEC).load_state_dict({**saved, "cursor": 25})
