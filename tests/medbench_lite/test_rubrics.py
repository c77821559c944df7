"""MedBench-Lite scored by the reference rubric contracts, through real env episodes.

The teacher earns full credit from evidence alone (artifacts, receipts, real pipeline
runs, the task metric on its pilot); a forged receipt, a naive pilot, the naive
baseline and random text do not.
"""

import pytest

from bat_gym.bank import build_bank, task_states
from bat_gym.bank.tasks import success_threshold
from bat_gym.core.errors import RubricContractError
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.core.sandbox import BlobStore
from bat_gym.core.spec import E2E
from bat_gym.env import StageEnv
from bat_gym.envs.medbench_lite.teacher import RECEIPT, bash_call, python_call
from bat_gym.envs.medbench_lite.tracks import get_track
from bat_gym.rubrics.contract.model import ContractLibrary
from bat_gym.rubrics.verifier.reward import RubricReward
from bat_gym.rubrics.verifier.scoring import overall_score

from .conftest import TEACHER_MIN, TRACKS

HERMES = get_protocol("hermes")
TRACK = "classification"  # the quickest track to replay
FINISH = HERMES.render("", [ToolCall(name="finish", arguments={"summary": "done"})])


@pytest.fixture(scope="module")
def bank(bench, tmp_path_factory):
    """Every focus of one track, built by replaying the teacher on a training task."""
    return build_bank(bench, tmp_path_factory.mktemp("mb") / "bank", tracks=[TRACK])


@pytest.fixture(scope="module")
def heldout(bench, tmp_path_factory):
    """The first held-out task of every track, as in-memory E2E start states."""
    store = BlobStore(tmp_path_factory.mktemp("mb-heldout") / "store")
    seed = bench.seeds("heldout")[0]
    return task_states(bench, [(t, seed) for t in TRACKS], "heldout", store)


def scripted(turns):
    return [HERMES.render(t.content, list(t.calls)) for t in turns]


def play(env, actions, state_id):
    """Reset to ``state_id`` and step until the episode ends; the final info."""
    env.reset(options={"state_id": state_id})
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return reward, info["verdict"]
    raise AssertionError("the episode did not end")


def stage_turns(bench, state):
    task = bench.make_task(state.track, state.provenance["seed"], "train")
    return [
        t
        for t in bench.teacher_turns(task)
        if state.focus == E2E or t.stage == state.focus or t.calls[0].name == "finish"
    ]


def test_medbench_pins_the_reference_contracts_by_digest(bench, bank):
    lib = bench.contract_library()
    for focus in bench.spec.focuses:
        ref = bench.contract_ref(focus)
        assert ref == ContractLibrary.reference().for_focus(focus).ref
        assert lib.get(ref).ref == ref
        with pytest.raises(RubricContractError):
            lib.get(ref.model_copy(update={"sha256": "0" * 64}))
    assert all(row.contract == bench.contract_ref(row.focus) for row in bank)


@pytest.mark.parametrize("focus", ["S1", "S2", "S3", "S4", "S5", "E2E"])
def test_the_teacher_earns_full_credit_on_every_stage_env(bench, bank, focus):
    env = RubricReward(StageEnv(focus, benchmark=bench, states=bank))
    try:
        state = bank.get(bank.select(focus=focus, track=TRACK)[0])
        reward, verdict = play(env, scripted(stage_turns(bench, state)), state.state_id)
    finally:
        env.close()
    failed = [(s.stage, i.id, i.detail) for s in verdict.stages for i in s.items if not i.passed]
    assert reward == 1.0 and verdict.eta == 1.0, failed
    assert all(s.score == 1.0 for s in verdict.stages)
    # A success row starts clean: the repair item is not applicable, and nothing else is.
    assert all(
        n.endswith("null items excluded from the score: upstream_repaired") for n in verdict.notes
    )
    if focus == E2E:
        assert verdict.task_score == 1.0 and len(verdict.stages) == 5


def _stage(bench, bank, focus, actions):
    """Play ``actions`` from the first ``focus`` state of TRACK; (reward, verdict)."""
    env = RubricReward(StageEnv(focus, benchmark=bench, states=bank))
    try:
        state_id = bank.select(focus=focus, track=TRACK)[0]
        return play(env, actions, state_id)
    finally:
        env.close()


def test_a_forged_pilot_receipt_earns_nothing_on_s3(bench, bank):
    state = bank.get(bank.select(focus="S3", track=TRACK)[0])
    pilot = [t for t in stage_turns(bench, state) if t.stage == "S3"]
    forge = bash_call(
        "cat > validation/s3_validation.json <<'EOF'\n"
        '{"schema_version": 1, "stage": "S3", "artifact": "validation/pilot.csv", '
        f'"sha256": "{"0" * 64}"}}\nEOF'
    )
    reward, verdict = _stage(
        bench, bank, "S3", [*scripted(pilot), HERMES.render("", [forge]), FINISH]
    )
    items = {i.id: i for i in verdict.stages[0].items}
    assert items["pilot_ran"].passed and items["pilot_quality"].passed
    assert items["pilot_receipt"].passed is False and "hashes to" in items["pilot_receipt"].detail
    # The forged receipt states no check of the pilot: not even the shape level is paid.
    assert items["pilot_check_confirmed"].passed is False
    assert reward == 0.0


def test_a_made_up_weights_digest_zeroes_s2(bench, bank):
    state = bank.get(bank.select(focus="S2", track=TRACK)[0])
    setup = [t for t in stage_turns(bench, state) if t.stage == "S2"]
    # The pin written again, consistent with itself but with a digest the agent made up.
    forge = python_call(
        "import json\n"
        "p = json.load(open('model/checkpoint.json'))\n"
        "p['sha256'] = 'ab' * 32\n"
        "json.dump(p, open('model/checkpoint.json', 'w'))\n"
    )
    reward, verdict = _stage(
        bench, bank, "S2", [*scripted(setup), HERMES.render("", [forge]), FINISH]
    )
    items = {i.id: i for i in verdict.stages[0].items}
    assert items["model_pinned"].passed is False and items["model_loaded"].passed
    assert reward == 0.0


def test_a_naive_pilot_with_a_true_receipt_earns_nothing_on_s3(bench, bank):
    # The model's default convention, piloted on every case with an honest receipt:
    # a real run, but its result is wrong: the quality check sees it, and since the rows
    # are not the provided model's outputs (run the way the card asks), the guards
    # zero the stage.
    recipe = get_track(TRACK).recipe()
    naive = bash_call(
        "mkdir -p pipeline\ncat > pipeline/infer.py <<'EOF'\n" + recipe.naive_pipeline + "\nEOF"
    )
    pilot = python_call(
        "import json, os, sys\nsys.path.insert(0, 'pipeline')\nimport infer\n"
        + RECEIPT
        + "\nos.makedirs('validation', exist_ok=True)\n"
        "ids = json.load(open('task.json'))['submission']['case_ids']\n"
        "infer.run(ids, 'validation/pilot.csv', 'validation/pilot')\n"
        "receipt('S3', 'validation/pilot.csv', 'validation/s3_validation.json', cases=len(ids))\n"
    )
    reward, verdict = _stage(bench, bank, "S3", [HERMES.render("", [naive, pilot]), FINISH])
    items = {i.id: i for i in verdict.stages[0].items}
    assert all(
        items[i].passed for i in ("pilot_shape", "pilot_ran", "pilot_written", "pilot_receipt")
    ), [(i.id, i.detail) for i in items.values()]
    quality = items["pilot_quality"]
    # Held to the reference run on the same cases, a bar it does not say.
    assert quality.passed is False and "is below the bar the reference run sets" in quality.detail
    assert items["pilot_is_model_output"].passed is False
    assert items["pipeline_reproduces"].passed is False
    assert reward == 0.0


def test_random_text_scores_zero_and_crashes_nothing(bench, heldout):
    env = RubricReward(StageEnv(E2E, benchmark=bench, states=heldout))
    try:
        env.action_space.seed(0)
        state_id = heldout.select(track="vqa")[0]
        env.reset(options={"state_id": state_id})
        for _ in range(bench.spec.budgets.max_turns + 1):
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            if terminated or truncated:
                break
    finally:
        env.close()
    verdict = info["verdict"]
    assert reward == 0.0 and verdict.reward == 0.0 and verdict.task_score == 0.0
    assert not verdict.gates[0].passed and all(s.credit == 0.0 for s in verdict.stages)


# Since version 2 the enhancement and synthesis metrics leave the model headroom (its
# task score is about 0.75-0.85): S3's pilot check and the bank's admission bar are
# relative to what the reference run (a correct pipeline) scores.
TRACKS_E2E = list(TRACKS)


@pytest.mark.parametrize("track", TRACKS_E2E)
def test_heldout_e2e_teacher_earns_full_credit_and_naive_does_not(bench, heldout, track):
    env = RubricReward(StageEnv(E2E, benchmark=bench, states=heldout))
    try:
        state = heldout.get(heldout.select(track=track)[0])
        task = bench.make_task(track, state.provenance["seed"], "heldout")
        reward, verdict = play(env, scripted(bench.teacher_turns(task)), state.state_id)
        _, naive = play(env, scripted(bench.naive_turns(task)), state.state_id)
    finally:
        env.close()
    spec = bench.spec
    overall = overall_score(verdict.task_score, verdict.stage_score, spec)
    assert verdict.stage_score == 1.0 and verdict.task_score >= TEACHER_MIN[track]
    assert overall >= success_threshold(bench, task)  # what a bank admits as a success
    assert reward == pytest.approx(overall)
    naive_overall = overall_score(naive.task_score, naive.stage_score, spec)
    assert naive_overall < overall - 0.3
    assert {s.stage: s.score for s in naive.stages}["S3"] == 0.0  # it never validated


@pytest.mark.slow
@pytest.mark.parametrize("track", TRACKS_E2E)
def test_recovery_earns_full_s3_credit_and_a_shape_only_check_does_not(bench, heldout, track):
    env = RubricReward(StageEnv(E2E, benchmark=bench, states=heldout))
    try:
        state = heldout.get(heldout.select(track=track)[0])
        task = bench.make_task(track, state.provenance["seed"], "heldout")
        _, recovered = play(env, scripted(bench.teacher_turns(task, "recovery")), state.state_id)
        _, failed = play(env, scripted(bench.teacher_turns(task, "failure")), state.state_id)
    finally:
        env.close()
    s3 = {s.stage: s for s in recovered.stages}["S3"]
    assert s3.score == 1.0 and recovered.stage_score == 1.0
    s3 = {s.stage: s for s in failed.stages}["S3"]
    quality = next(i for i in s3.items if i.id == "pilot_quality")
    # The weak pilot runs for real; only its quality check can fail, and when the
    # piloted case is one the mistake affects, it does.
    assert s3.score in (0.5, 1.0) and (s3.score == 1.0) == bool(quality.passed)
    assert failed.task_score < recovered.task_score
