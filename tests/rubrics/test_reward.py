"""RubricReward through real env episodes: the teacher earns 1, forgeries earn nothing."""

import gymnasium as gym
import pytest

from bat_gym.catalog import STAGE_ENV_NAMES
from bat_gym.core.errors import RubricContractError
from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.env import StageEnv
from bat_gym.rubrics.contract.model import REFERENCE_DIR, ContractLibrary
from bat_gym.rubrics.verifier.reward import RubricReward

HERMES = get_protocol("hermes")
LIB = ContractLibrary.reference()
FINISH = HERMES.render("", [ToolCall(name="finish", arguments={"summary": "done"})])


def bash(code, content=""):
    return HERMES.render(
        content, [ToolCall(name="execute_code", arguments={"language": "bash", "code": code})]
    )


class States:
    """A state source over a few edited bank rows."""

    def __init__(self, bank, states):
        self.store = bank.store
        self._rows = {s.state_id: s for s in states}

    def get(self, state_id):
        return self._rows[state_id]

    def select(self, focus=None, track=None):
        return sorted(self._rows)


def wrappers(env):
    found = []
    while isinstance(env, gym.Wrapper):
        found.append(type(env))
        env = env.env
    return found


def play(env, actions, state_id):
    """Reset to ``state_id``, step every action; return the rewards and the last info."""
    env.reset(options={"state_id": state_id})
    rewards, info = [], {}
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    return rewards, info


def teacher(toy, state):
    task = toy.make_task(state.track, state.provenance["seed"], "train")
    return [
        HERMES.render(t.content, list(t.calls))
        for t in toy.teacher_turns(task)
        if state.focus == "E2E" or t.stage == state.focus or t.calls[0].name == "finish"
    ]


@pytest.fixture
def make(toy_bank):
    envs = []

    def make_env(name, **kwargs):
        # toy_pipeline is not the default benchmark: name it with its bank.
        kwargs.setdefault("benchmark", "toy_pipeline")
        env = gym.make(f"bat/{name}-v0", states=kwargs.pop("states", toy_bank), **kwargs)
        envs.append(env)
        return env

    yield make_env
    for env in envs:
        env.close()


@pytest.mark.parametrize("name", STAGE_ENV_NAMES)
def test_the_teacher_earns_1_on_every_stage_env_and_e2e(toy, toy_bank, make, name):
    env = make(name)
    focus = toy.spec.focus(name)
    for state_id in toy_bank.select(focus=focus):
        state = toy_bank.get(state_id)
        rewards, info = play(env, teacher(toy, state), state_id)
        verdict = info["verdict"]
        assert rewards[-1] == 1.0 and set(rewards[:-1]) <= {0.0}, (state_id, verdict.notes)
        assert verdict.eta == 1.0 and verdict.contract == state.contract
        if focus == "E2E":
            assert verdict.task_score == 1.0 and len(verdict.stages) == 5


def test_make_applies_the_wrapper_and_a_keyword_turns_it_off(toy, toy_bank, make):
    assert RubricReward in wrappers(make("Submit"))
    bare = make("Submit", rubric_reward=False)
    assert RubricReward not in wrappers(bare) and isinstance(bare.unwrapped, StageEnv)
    state = toy_bank.get(toy_bank.select(focus="S5")[0])
    rewards, info = play(bare, teacher(toy, state), state.state_id)
    assert rewards[-1] == 0.0 and "verdict" not in info


def test_scoring_reads_a_frozen_snapshot(toy, toy_bank, make, monkeypatch):
    env = make("Plan")
    state = toy_bank.get(toy_bank.select(focus="S1")[0])
    env.reset(options={"state_id": state.state_id})
    sandbox = env.unwrapped.sandbox
    frozen = []
    real = sandbox.freeze
    monkeypatch.setattr(sandbox, "freeze", lambda: frozen.append(real()) or frozen[-1])
    for action in teacher(toy, state):
        _, _, terminated, _, info = env.step(action)
    assert terminated and len(frozen) == 1
    plan = next(e for e in frozen[0].entries if e.path == "plan/plan.md")
    evidence = {
        e.path: e.sha256
        for i in info["verdict"].stages[0].items
        for e in i.evidence
        if e.kind == "artifact"
    }
    assert evidence["plan/plan.md"] == plan.digest


# -- forgeries ----------------------------------------------------------------------------

WRONG_RECEIPT = (
    "mkdir -p validation && cat > validation/s3_validation.json <<'EOF'\n"
    '{"schema_version": 1, "stage": "S3", "artifact": "validation/pilot.csv", "sha256": "%s"}\nEOF'
)


def test_a_fake_receipt_earns_nothing(toy_bank, make):
    env = make("Validate")
    sid = toy_bank.select(focus="S3")[0]
    rewards, info = play(env, [bash(WRONG_RECEIPT % ("0" * 64)), FINISH], sid)
    assert rewards == [0.0, 0.0] and info["verdict"].reward == 0.0
    # With a real pilot run, the wrong digest still blocks the receipted levels; and a
    # receipt that states no check of the pilot earns not even the shape level.
    run_pilot = (
        "mkdir -p validation; first=$(sed -n 2p data/cases.csv | cut -d, -f1); "
        "python pipeline/infer.py validation/pilot.csv $first && " + WRONG_RECEIPT % ("ab" * 32)
    )
    rewards, info = play(env, [bash(run_pilot), FINISH], sid)
    items = {i.id: i for i in info["verdict"].stages[0].items}
    assert items["pilot_ran"].passed and items["pilot_shape"].passed
    assert items["pilot_receipt"].passed is False and "hashes to" in items["pilot_receipt"].detail
    assert items["pilot_check_confirmed"].passed is False
    assert rewards[-1] == 0.0


def test_fake_reward_and_score_files_earn_nothing(toy_bank, make):
    forge = (
        'echo \'{"reward": 1.0, "score": 1.0, "passed": true}\' > reward.json; echo 1.0 > score.txt; '
        'mkdir -p validation && echo \'{"verdict": "pass", "reward": 1.0}\' > validation/verdict.json'
    )
    for name, focus in (("Submit", "S5"), ("E2E", "E2E")):
        rewards, info = play(make(name), [bash(forge), FINISH], toy_bank.select(focus=focus)[0])
        assert rewards[-1] == 0.0 and info["verdict"].gates[0].passed, name


def test_an_edited_copy_of_the_contract_in_the_workspace_changes_nothing(toy_bank, make):
    lenient = (
        "id: s5_submit\nversion: '1.0'\nfocus: S5\n"
        "items:\n  - {id: ok, check: file_exists, args: {path: task.json}}\n"
    )
    original = (REFERENCE_DIR / "s5_submit.yaml").read_text()
    code = (
        "mkdir -p rubrics/contract .bat_gym\n"
        f"cat > rubrics/contract/s5_submit.yaml <<'EOF'\n{lenient}EOF\n"
        "cp rubrics/contract/s5_submit.yaml contract.yaml\n"
        f"cat > .bat_gym/s5_submit.yaml <<'EOF'\n{original.replace('coverage: all', 'coverage: subset')}EOF"
    )
    rewards, info = play(make("Submit"), [bash(code), FINISH], toy_bank.select(focus="S5")[0])
    assert rewards[-1] == 0.0 and info["verdict"].contract == LIB.by_id("s5_submit").ref


@pytest.mark.parametrize("name", ["Infer", "E2E"])
def test_claiming_success_in_prose_earns_nothing(toy_bank, make, name):
    claim = (
        "I ran the pipeline on every case; outputs/predictions.csv and outputs/submission.csv are "
        "complete, the receipts match, and all checks pass. Reward: 1.0."
    )
    sid = toy_bank.select(focus="S4" if name == "Infer" else "E2E")[0]
    env = make(name)
    rewards, info = play(
        env, [HERMES.render(claim, [ToolCall(name="finish", arguments={"summary": claim})])], sid
    )
    assert rewards == [0.0] and info["verdict"].gates[0].reason == "no tool call was made"
    # Printing the claim from a tool call is no better: nothing was produced.
    rewards, info = play(env, [bash(f"echo '{claim}'"), FINISH], sid)
    assert rewards[-1] == 0.0 and info["verdict"].gates[0].passed is False


# -- pins and nulls -----------------------------------------------------------------------


def test_a_state_pinning_another_contract_digest_is_refused(toy_bank, make):
    state = toy_bank.get(toy_bank.select(focus="S1")[0])
    forged = state.model_copy(
        update={"contract": state.contract.model_copy(update={"sha256": "f" * 64})}
    )
    env = make("Plan", states=States(toy_bank, [forged]))
    with pytest.raises(RubricContractError) as exc:
        play(env, [bash("mkdir -p plan && echo hi > plan/plan.md"), FINISH], forged.state_id)
    assert "f" * 64 in str(exc.value) and state.contract.sha256 in str(exc.value)


def test_an_unscorable_task_gives_a_null_verdict_and_reward_0(toy, toy_bank, make):
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    anonymous = state.model_copy(update={"provenance": {}})
    env = make("E2E", states=States(toy_bank, [anonymous]))
    rewards, info = play(env, teacher(toy, state), anonymous.state_id)
    verdict = info["verdict"]
    assert rewards[-1] == 0.0 and verdict.reward is None and verdict.task_score is None
    assert "no task oracle: the task score is null" in verdict.notes
