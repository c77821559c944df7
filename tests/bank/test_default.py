"""Default states: the whole grid's ids up front, one teacher trajectory built per need."""

import multiprocessing
import pickle
import subprocess
import sys

import gymnasium as gym
import pytest

from bat_gym.bank import DefaultStates, StageBank, build_bank, default_bank, default_states
from bat_gym.core.errors import ConfigError, TrajectoryRejected


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private, empty bat_gym cache: every test starts from a fresh install."""
    monkeypatch.setenv("BAT_GYM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def full_toy_bank(toy, tmp_path_factory):
    """The toy grid as one eager build makes it: what the default states must match."""
    return build_bank(toy, tmp_path_factory.mktemp("full") / "b", outcomes=toy.outcomes)


def built(source):
    """Keys of the trajectories built (and accepted) in ``source``'s cache."""
    folder = source.root / "trajectories"
    return sorted(p.name for p in folder.glob("*.json") if not p.name.endswith(".rejected.json"))


def broken_toy(name="toy_pipeline"):
    """A toy benchmark whose success teacher never submits: the verifier rejects it."""
    from bat_gym.envs.toy_pipeline.suite import SPEC, ToyPipeline

    class Broken(ToyPipeline):
        spec = SPEC.model_copy(update={"name": name})
        outcomes = ("success",)

        def teacher_turns(self, task):
            return [t for i, t in enumerate(super().teacher_turns(task)) if i != 4]

    return Broken()


def test_select_lists_the_grid_without_building_it(toy, cache, full_toy_bank):
    source = default_states(toy)
    assert source.select(track="lookup") == full_toy_bank.select(track="lookup")
    for focus in (None, *toy.spec.focuses):
        assert source.select(focus=focus) == full_toy_bank.select(focus=focus)
    assert built(source) == []  # the ids are the plan's


def test_a_first_reset_builds_only_the_trajectories_it_chooses_among(toy, cache, full_toy_bank):
    env = gym.make("bat/Validate-v0", benchmark=toy)
    lazy_ids = []
    try:
        sid = full_toy_bank.select(focus="S3", track="threshold", outcome="success")[0]
        _, info = env.reset(options={"state_id": sid})
        assert built(env.unwrapped.states) == [f"threshold-{toy.seeds('train')[0]}-success.json"]
        _, info = env.reset(seed=3)
        lazy_ids.append(info["state_id"])
        _, info = env.reset(seed=4)
        lazy_ids.append(info["state_id"])
    finally:
        env.close()
    # A seeded reset picks the very state it picks from the eagerly built grid.
    eager = gym.make("bat/Validate-v0", benchmark=toy, states=full_toy_bank)
    try:
        assert [eager.reset(seed=s)[1]["state_id"] for s in (3, 4)] == lazy_ids
    finally:
        eager.close()


def test_a_planned_row_no_demonstration_wins_is_never_served(cache):
    from bat_gym.core.errors import StateNotAdmitted
    from bat_gym.envs.toy_pipeline.suite import SPEC, ToyPipeline

    class Unwinnable(ToyPipeline):
        spec = SPEC.model_copy(update={"name": "toy_unwinnable_s4"})
        outcomes = ("success",)  # one row per focus and track

        def demonstration_turns(self, task, state):
            # S4's demonstrator skips S4's work: no play from the row wins it.
            if state.focus != "S4":
                return None
            return [t for t in self.teacher_script(task) if t.stage == "S5"]

    bench = Unwinnable()
    source = DefaultStates(bench)
    planned = [i for t in source.trajectories for i in t.ids if ".S4." in i]
    assert len(planned) == 2 and source.select(focus="S4") == sorted(planned)
    with pytest.raises(StateNotAdmitted, match="demonstration below 0.9"):
        source.get(planned[0])
    # A seeded reset walks past the rows that are not admitted, and says so when none is.
    env = gym.make("bat/Infer-v0", benchmark=bench, states=source)
    try:
        with pytest.raises(ConfigError, match="no admitted"):
            env.reset(seed=0)
    finally:
        env.close()
    assert len(source.select(focus="S3")) == 2
    bank = source.complete()
    assert bank.select(focus="S4") == [] and bank.manifest["admission"]["shares"]["S4"] == {
        "success": {"admitted": 0, "rows": 2}
    }


def test_a_built_trajectory_is_reused_by_the_next_process(toy, cache, monkeypatch):
    first = DefaultStates(toy)
    sid = first.select(focus="S2")[0]
    row = first.get(sid)
    assert row.focus == "S2" and first.store.get_snapshot(row.snapshot).digest == row.snapshot

    def no_build(self, t):
        raise AssertionError(f"rebuilt {t.job.key}")

    monkeypatch.setattr(DefaultStates, "_build", no_build)
    again = DefaultStates(toy)  # a fresh source over the same cache, as another process has
    assert again.get(sid) == row
    sent = pickle.loads(pickle.dumps(first))  # as a Ray actor or spawned worker gets it
    assert sent.root == first.root and sent.get(sid) == row
    same = again.select(track=row.track, outcome=row.outcome)  # the trajectory's rows
    assert {again.get(i).focus for i in same} == set(toy.spec.focuses)


def _get_in_child(args):
    root, sid, log = args
    from bat_gym.bank import default as module
    from bat_gym.catalog import get_benchmark

    build = module.DefaultStates._build

    def logged(self, t, *args):
        with open(log, "a") as fh:
            fh.write(t.job.key + "\n")
        return build(self, t, *args)

    module.DefaultStates._build = logged
    return module.DefaultStates(get_benchmark("toy_pipeline"), root).get(sid).snapshot


def test_concurrent_workers_wanting_one_trajectory_build_it_once(toy, cache, tmp_path):
    planned = DefaultStates(toy)
    root = planned.root
    # The id from the plan: select() would build the trajectory here, before the workers.
    sid = next(i for t in planned.trajectories if t.job.track == "threshold" for i in t.ids)
    log = tmp_path / "builds.log"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        snaps = pool.map(_get_in_child, [(root, sid, log)] * 2)
    assert snaps[0] == snaps[1]
    assert log.read_text().splitlines() == [f"threshold/{toy.seeds('train')[0]}/success"]


def test_the_whole_grid_is_one_call_away_and_equals_an_eager_build(toy, cache, full_toy_bank):
    bank = default_bank(toy)
    assert isinstance(bank, StageBank) and bank.root == default_states(toy).root
    assert sorted(s.state_id for s in bank) == sorted(s.state_id for s in full_toy_bank)
    assert bank.manifest["trajectories"] == full_toy_bank.manifest["trajectories"]
    assert bank.manifest["outcomes"] == full_toy_bank.manifest["outcomes"]
    # Later sources read the complete bank; nothing is planned or built again.
    assert DefaultStates(toy).get(bank.select(focus="S4")[0]).focus == "S4"


def test_the_success_trajectory_becomes_the_tasks_reference_run(toy, cache, monkeypatch):
    from bat_gym.rubrics.verifier import reference

    source = DefaultStates(toy)
    row = source.get(source.select(focus="E2E", track="lookup")[0])
    task = toy.task_of_state(row)
    reference._MEMO.clear()  # as a fresh process: only the disk cache is left

    def no_run(*args, **kwargs):
        raise AssertionError("the reference script ran again")

    monkeypatch.setattr(reference, "_run", no_run)
    ws = reference.reference_workspace(toy, task)
    assert ws is not None and ws.exists("outputs/submission.csv")


def test_a_rejected_teacher_fails_the_reset_with_its_verdict(cache):
    bench = broken_toy()
    env = gym.make("bat/Plan-v0", benchmark=bench)
    try:
        with pytest.raises(TrajectoryRejected) as exc:
            env.reset(seed=0)
    finally:
        env.close()
    msg = str(exc.value)
    assert "success below 0.95 of the reward of a correct run" in msg and "eta" in msg
    # The items that fell short, failures first, with their detail.
    assert (
        "verdict: reward 0.450; eta 1.00; S5.submission_schema failed: outputs/submission.csv"
        in msg
    )
    assert "bat-gym bank explain --default" in msg
    source = env.unwrapped.states
    assert built(source) == []  # never cached as a good trajectory
    assert list((source.root / "trajectories").glob("*.rejected.json"))  # kept for explain
    with pytest.raises(TrajectoryRejected):
        source.complete()
    assert not (source.root / "manifest.json").exists()  # the grid is never cached empty


def test_an_unknown_state_id_names_the_known_ones(toy, cache):
    from bat_gym.core.errors import StateNotFound

    source = DefaultStates(toy)
    with pytest.raises(StateNotFound, match="Did you mean"):
        source.get(source.select()[0] + "x")


def test_the_env_resolves_its_states_through_the_registry_not_the_bank(toy):
    # StageEnv never imports the Stage Bank (which plays envs to build states).
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, bat_gym.env; print('bat_gym.bank' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "False", proc.stderr
    from bat_gym.catalog import register_state_source
    from bat_gym.env import StageEnv

    seen = []

    def resolver(states, bench):
        seen.append((states, bench.name))
        return "my source"

    register_state_source(resolver)
    try:
        assert StageEnv("S1", benchmark=toy).states == "my source"
    finally:
        register_state_source(None)
    assert seen == [(None, "toy_pipeline")]


def test_a_seeded_reset_walks_past_a_refused_row_to_the_pick_of_the_admitted_bank(cache):
    from bat_gym.envs.toy_pipeline.suite import SPEC, ToyPipeline

    class HalfWinnable(ToyPipeline):
        spec = SPEC.model_copy(update={"name": "toy_half_winnable_s4"})
        outcomes = ("success",)  # one row per focus and track

        def demonstration_turns(self, task, state):
            # Only the lookup track's S4 row loses its demonstration.
            if state.focus != "S4" or state.track != "lookup":
                return None
            return [t for t in self.teacher_script(task) if t.stage == "S5"]

    bench = HalfWinnable()
    lazy = gym.make("bat/Infer-v0", benchmark=bench, states=DefaultStates(bench))
    try:
        picks, tracks = [], set()
        for seed in range(6):
            picks.append(lazy.reset(seed=seed)[1]["state_id"])
            tracks.add(lazy.unwrapped.state.track)
    finally:
        lazy.close()
    bank = DefaultStates(bench).complete()
    assert len(bank.select(focus="S4")) == 1  # the threshold track's
    eager = gym.make("bat/Infer-v0", benchmark=bench, states=bank)
    try:
        assert [eager.reset(seed=s)[1]["state_id"] for s in range(6)] == picks
    finally:
        eager.close()
    assert tracks == {"threshold"}


def test_a_row_is_demonstrated_when_first_asked_for_and_the_grid_still_equals_an_eager_build(
    toy, cache, full_toy_bank
):
    import json

    source = DefaultStates(toy)
    trajectory = next(t for t in source.trajectories if t.job.track == "threshold")
    s3 = next(i for i in trajectory.ids if ".S3." in i)
    assert source.get(s3).focus == "S3"
    record = json.loads((source.root / "trajectories" / f"{trajectory.file}.json").read_text())
    # Built for one row: it and the E2E row (the trajectory itself) are demonstrated.
    demonstrated = {c["state_id"] for c in record["candidates"]}
    assert demonstrated == {s3, next(i for i in trajectory.ids if ".E2E." in i)}
    assert {r["state_id"] for r in record["pending"]} == set(trajectory.ids) - demonstrated
    # Another row of it is demonstrated when it is asked for, in a new process's source.
    s5 = next(i for i in trajectory.ids if ".S5." in i)
    assert DefaultStates(toy).get(s5).state_id == s5
    record = json.loads((source.root / "trajectories" / f"{trajectory.file}.json").read_text())
    assert s5 not in {r["state_id"] for r in record["pending"]}
    bank = default_bank(toy)
    assert sorted(s.state_id for s in bank) == sorted(s.state_id for s in full_toy_bank)
    assert bank.manifest["admission"] == full_toy_bank.manifest["admission"]


def test_a_failure_trajectory_built_for_one_row_leaves_its_e2e_row_for_when_it_is_asked(toy, cache):
    import json

    source = DefaultStates(toy)
    trajectory = next(
        t for t in source.trajectories if t.job.track == "lookup" and t.job.outcome == "failure"
    )
    s3, e2e = (next(i for i in trajectory.ids if f".{f}." in i) for f in ("S3", "E2E"))
    assert source.get(s3).focus == "S3"
    path = source.root / "trajectories" / f"{trajectory.file}.json"
    record = json.loads(path.read_text())
    # The failure's own play loses its E2E row, so another play must win it: that costs
    # a whole episode, which waits until the row is wanted, like any other row.
    assert {c["state_id"] for c in record["candidates"]} == {s3}
    assert e2e in {r["state_id"] for r in record["pending"]}
    # Kept as labelled, it is scored only to demonstrate that E2E row: not yet, then.
    assert record["reward"] is None and record["verdict"] is None
    assert DefaultStates(toy).get(e2e).outcome == "failure"
    record = json.loads(path.read_text())
    assert e2e in {r["state_id"] for r in record["rows"]}


def test_a_benchmark_that_names_its_teachers_stages_is_planned_without_generating_a_task(
    toy, cache, monkeypatch, full_toy_bank
):
    from bat_gym.envs.toy_pipeline.suite import ToyPipeline

    stages = {
        (t.name, o): tuple(
            s.stage
            for s in toy.teacher_script(toy.task_of(t.name, toy.seeds("train")[0], "train"), o)
        )
        for t in toy.spec.tracks
        for o in toy.outcomes
    }
    monkeypatch.setattr(ToyPipeline, "teacher_stages", lambda self, track, o: stages[(track, o)])

    def no_generation(*args, **kwargs):
        raise AssertionError("planning generated a task")

    monkeypatch.setattr(ToyPipeline, "task_of", no_generation)
    assert default_states(toy).select() == full_toy_bank.select()
