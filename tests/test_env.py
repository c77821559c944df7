import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from bat_gym.catalog import env_ids
from bat_gym.core.errors import ResetNeeded, StageNotFound, StateNotFound
from bat_gym.core.protocol import get_protocol
from bat_gym.core.spec import Budgets
from bat_gym.env import Completion, StageEnv

HERMES = get_protocol("hermes")


def call(language, code):
    return f'<tool_call>{{"name": "execute_code", "arguments": {{"language": "{language}", "code": {code!r}}}}}</tool_call>'.replace(
        "'", '"'
    )


def bash(code):
    import json

    return (
        HERMES.render(
            "",
            [
                __import__("bat_gym").ToolCall(
                    name="execute_code", arguments={"language": "bash", "code": code}
                )
            ],
        )
        if code
        else json.dumps({})
    )


FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


@pytest.fixture
def env(toy, toy_bank):
    e = StageEnv("Validate", benchmark=toy, states=toy_bank)
    yield e
    e.close()


# On the toy benchmark in the default run; on the default benchmark (MedBench-Lite, whose
# first resets build teacher trajectories for minutes on two cores) under -m slow.
@pytest.mark.parametrize(
    "benchmark", ["toy_pipeline", pytest.param(None, marks=pytest.mark.slow, id="default")]
)
@pytest.mark.parametrize("env_id", env_ids())
def test_every_registered_id_passes_check_env_unwarned(env_id, benchmark):
    env = gym.make(env_id, **({"benchmark": benchmark} if benchmark else {}))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_reset_returns_the_prompt_and_structured_info(env):
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["stage"] == "S3" and info["stage_name"] == "Validate"
    roles = [m["role"] for m in info["messages"]]
    assert roles[:2] == ["system", "user"] and "assistant" in roles  # earlier stages' turns
    assert "## S3 Validate" in info["messages"][0]["content"]
    assert [t["function"]["name"] for t in info["tools"]] == ["execute_code", "finish"]
    assert info["record"].calls == [] and info["isolation"] == "bwrap"


def test_same_state_id_gives_the_same_start_even_after_edits(env, toy_bank):
    sid = toy_bank.select(focus="S4")[0]
    obs1, info1 = env.reset(options={"state_id": sid})
    start = info1["record"].start_digest
    env.step(bash("rm -rf /workspace/*; echo junk > /workspace/x"))
    obs2, info2 = env.reset(options={"state_id": sid})
    assert obs1 == obs2 and info2["stage"] == "S4"
    assert env.sandbox.digest() == start


def test_seeded_resets_are_deterministic(toy, toy_bank):
    picks = []
    for _ in range(2):
        e = StageEnv("E2E", benchmark=toy, states=toy_bank)
        picks.append([e.reset(seed=s)[1]["state_id"] for s in range(6)])
        e.close()
    assert picks[0] == picks[1] and len(set(picks[0])) > 1


def test_tool_call_runs_and_is_recorded(env):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(
        bash("echo hello > note.txt; cat note.txt; exit 3")
    )
    assert obs == "[exit code 3]\nhello"
    assert (reward, terminated, truncated) == (0.0, False, False)
    rec = info["record"].calls[0]
    assert rec.exit_code == 3 and rec.changed_workspace and rec.language == "bash"
    assert info["messages"][-2]["tool_calls"][0]["function"]["name"] == "execute_code"
    assert info["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "name": "execute_code",
        "content": obs,
    }


def test_the_same_call_reads_the_same_however_long_it_took(env):
    # Wall-clock time stays in the record: an observation that named it would make
    # replayed states, banks built twice and seeded rollouts differ with the host's load.
    seen = []
    for pause in ("0", "0.3"):
        env.reset(seed=0)
        obs, *_, info = env.step(bash(f"sleep {pause}; echo done"))
        seen.append((obs, info["record"].calls[0].duration_s))
    assert seen[0][0] == seen[1][0] == "[exit code 0]\ndone"
    assert seen[1][1] >= 0.3 > seen[0][1]


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("I think we are done.", "No tool call found"),
        ("<tool_call>{bad}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool 'rm_rf'"),
        (
            '<tool_call>{"name": "execute_code", "arguments": {"language": "bash"}}</tool_call>',
            "missing required argument 'code'",
        ),
    ],
)
def test_malformed_actions_are_observations_that_count(env, action, expected):
    env.reset(seed=0)
    obs, _, terminated, truncated, info = env.step(action)
    assert obs.startswith("[tool call error]") and expected in obs
    assert not terminated and not truncated and info["turns"] == 1 and info["tool_calls"] == 0
    assert info["messages"][-1]["role"] == "user"


def test_finish_terminates_and_step_afterwards_needs_reset(env):
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(FINISH)
    assert terminated and not truncated
    with pytest.raises(ResetNeeded):
        env.step(FINISH)


def test_step_before_reset_and_non_text_actions_raise(toy, toy_bank):
    e = StageEnv("S1", benchmark=toy, states=toy_bank)
    with pytest.raises(ResetNeeded):
        e.step(FINISH)
    e.reset(seed=0)
    with pytest.raises(TypeError, match="assistant's message as a str"):
        e.step({"content": "x"})
    e.close()


def test_budgets_truncate(toy, toy_bank):
    e = StageEnv(
        "S1",
        benchmark=toy,
        states=toy_bank,
        budgets=Budgets(max_turns=3, max_tool_calls=2, max_response_tokens=50),
    )
    e.reset(seed=0)
    assert e.step(bash("true"))[3] is False
    obs, _, term, trunc, info = e.step(
        HERMES.render(
            "",
            [
                __import__("bat_gym").ToolCall(
                    name="execute_code", arguments={"language": "bash", "code": "true"}
                )
            ]
            * 2,
        )
    )
    assert trunc and not term and info["tool_calls"] == 2 and "tool-call budget is spent" in obs
    e.reset(seed=0)
    _, _, _, trunc, _ = e.step(Completion("no call here", num_tokens=60))
    assert trunc  # the token budget
    e.reset(seed=0)
    for _ in range(2):
        assert not e.step("nothing")[3]
    assert e.step("nothing")[3]  # the third turn
    e.close()


def test_long_output_is_clipped_to_the_observation_budget(env):
    env.reset(seed=0)
    obs, *_, info = env.step(bash("seq 1 100000"))
    assert len(obs) <= env.budgets.max_observation_chars
    assert obs.rstrip().endswith("100000") and "characters cut" in obs
    assert info["record"].calls[0].output_bytes > 500_000


def test_the_teacher_solves_an_e2e_episode(toy, toy_bank):
    e = StageEnv("E2E", benchmark=toy, states=toy_bank)
    _, info = e.reset(seed=0)
    state = e.state
    task = toy.make_task(state.track, state.provenance["seed"], "train")
    for turn in toy.teacher_turns(task):
        obs, _, terminated, truncated, info = e.step(HERMES.render(turn.content, list(turn.calls)))
    assert terminated and not truncated
    assert all(c.succeeded for c in info["record"].calls)
    assert (e.sandbox.workspace / "outputs" / "submission.csv").exists()
    e.close()


def test_unknown_names_fail_early_with_suggestions(toy, toy_bank):
    with pytest.raises(StageNotFound, match="Validate"):
        StageEnv("Validat", benchmark=toy)
    with pytest.raises(KeyError, match="track"):
        StageEnv("S1", benchmark=toy, track="thresh")
    e = StageEnv("S1", benchmark=toy, states=toy_bank)
    with pytest.raises(StateNotFound):
        e.reset(options={"state_id": "nope"})
    with pytest.raises(ValueError, match="unknown reset option"):
        e.reset(options={"stateid": "x"})
    e.close()


def test_close_releases_the_sandbox(env):
    env.reset(seed=0)
    slot = env.sandbox.workspace.parent
    env.close()
    assert env.sandbox is None and not slot.exists()
    env.close()  # idempotent


def test_a_time_limit_from_make_truncates_with_a_verdict(toy_bank):
    """``gym.make(id, max_episode_steps=N)`` puts Gymnasium's TimeLimit outside the
    rubric; the truncated step still gets the verdict and its reward."""
    env = gym.make("bat/Plan-v0", benchmark="toy_pipeline", states=toy_bank, max_episode_steps=2)
    try:
        env.reset(seed=0)
        assert env.step(bash("true"))[3] is False
        _, reward, term, trunc, info = env.step(
            bash("mkdir -p plan && echo '# Plan' > plan/plan.md")
        )
        assert trunc and not term
        verdict = info["verdict"]
        assert verdict.reward is not None and reward == verdict.reward
        # The same stack comes back from the spec, and without the rubric the wrapper idles.
        again = gym.make(env.spec)
        assert str(again) == str(env)
        again.close()
        bare = gym.make("bat/Plan-v0", benchmark="toy_pipeline", states=toy_bank,
                        rubric_reward=False, max_episode_steps=1)  # fmt: skip
        bare.reset(seed=0)
        _, reward, _, trunc, info = bare.step(bash("true"))
        assert trunc and reward == 0.0 and "verdict" not in info
        bare.close()
    finally:
        env.close()


def test_pickle_and_deepcopy_work_out_of_an_episode_and_say_why_not_in_one(env):
    import copy
    import pickle

    from bat_gym.core.errors import EnvNotCopyable

    assert type(copy.deepcopy(env)) is StageEnv
    env.reset(seed=0)
    for copier in (pickle.dumps, copy.deepcopy):
        with pytest.raises(EnvNotCopyable, match="reset\\(options=\\{'state_id'"):
            copier(env)
    env.close()
    restored = pickle.loads(pickle.dumps(env))
    assert restored.focus == env.focus and restored.sandbox is None


class _OtherVersion:
    """The toy bank's states, as if another version of the benchmark had made them."""

    def __init__(self, bank, version):
        self.bank, self.version, self.store = bank, version, bank.store

    def select(self, focus=None, track=None):
        return self.bank.select(focus=focus, track=track)

    def get(self, state_id):
        return self.bank.get(state_id).model_copy(update={"benchmark_version": self.version})


def test_a_state_of_another_benchmark_version_is_refused(toy, toy_bank):
    from bat_gym.core.errors import StateVersionMismatch

    env = StageEnv("Validate", benchmark=toy, states=_OtherVersion(toy_bank, "0.0-old"))
    try:
        with pytest.raises(StateVersionMismatch, match="0.0-old.*rebuild the bank"):
            env.reset(seed=0)
    finally:
        env.close()
