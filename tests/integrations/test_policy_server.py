"""`bat-gym serve-policy`: policies behind an OpenAI-compatible server, played through the env.

The project's own OpenAI client policy, pointed at the command started as a user starts
it, plays toy states through the real StageEnv with the rubric reward; the reward and
every stage score must equal the in-process policy's on the same states.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from bat_gym.core.protocol import get_protocol
from bat_gym.env import StageEnv
from bat_gym.integrations.policy_server import serve_policy, state_url
from bat_gym.policies import PolicyError, ScriptedPolicy
from bat_gym.policies.openai_policy import OpenAIPolicy
from bat_gym.rollout import policy_actor, run_episode
from bat_gym.rubrics.verifier.reward import RubricReward

HERMES = get_protocol("hermes")

# An E2E start state, and a stage row with a stored history (three turns of earlier stages).
FOCUSES = ("E2E", "S4")


@pytest.fixture(scope="module")
def states(toy_bank):
    track = sorted({toy_bank.get(i).track for i in toy_bank.select()})[0]
    return [toy_bank.get(toy_bank.select(focus=f, track=track)[0]) for f in FOCUSES]


@pytest.fixture(scope="module")
def teacher_url(toy_bank):
    """The teacher, for the bank's states and the toy benchmark's held-out ones."""
    with serve_policy(
        "teacher", bank=toy_bank.root, benchmark="toy_pipeline", in_process=False
    ) as url:
        yield url


@pytest.fixture(scope="module")
def naive_url(toy_bank):
    with serve_policy("naive", bank=toy_bank.root, in_process=False) as url:
        yield url


@pytest.fixture(scope="module")
def heldout(toy, tmp_path_factory):
    """A held-out E2E start state of the toy benchmark and its state source."""
    from bat_gym.bank import task_states
    from bat_gym.core.sandbox.snapshot import BlobStore

    track = toy.spec.tracks[0].name
    tasks = [(track, toy.evaluated_seeds()[0])]
    source = task_states(toy, tasks, "heldout", BlobStore(tmp_path_factory.mktemp("store")))
    return source.get(source.select()[0]), source


def _play(toy, source, policy, state):
    """One episode from ``state`` in a rubric-wrapped StageEnv: (reward, verdict, actions)."""
    env = RubricReward(StageEnv(state.focus, benchmark=toy, states=source))
    try:
        rollout = run_episode(env, policy_actor(policy, toy, state), state_id=state.state_id)
    finally:
        env.close()
    verdict = rollout.info["verdict"]
    history = len(state.messages)
    actions = [m for m in rollout.info["messages"][history:] if m["role"] == "assistant"]
    return rollout.reward, verdict, actions


def _scores(verdict):
    return {
        "stage_score": verdict.stage_score,
        "task_score": verdict.task_score,
        **{f"{s.stage}.score": s.score for s in verdict.stages},
        **{f"{s.stage}.credit": s.credit for s in verdict.stages},
    }


def _assert_same(served, local):
    (r1, v1, a1), (r2, v2, a2) = served, local
    assert a1 == a2  # the same actions, so the same episode
    assert r1 == pytest.approx(r2, abs=1e-9)
    s1, s2 = _scores(v1), _scores(v2)
    assert s1.keys() == s2.keys()
    for key in s1:
        if s1[key] is None or s2[key] is None:
            assert s1[key] is s2[key], key
        else:
            assert s1[key] == pytest.approx(s2[key], abs=1e-9), key


def _client(url, model):
    # No retries: a refused request must fail the test at once.
    return OpenAIPolicy(url, model, temperature=None, max_tokens=None, max_retries=0)


@pytest.mark.parametrize("index", range(len(FOCUSES)), ids=FOCUSES)
def test_served_teacher_scores_as_the_in_process_teacher(toy, toy_bank, states, teacher_url, index):
    state = states[index]
    # An E2E opening is the same for every task of a track (the data is in the files):
    # its episode names the state in the URL. A stage row's is found from the conversation.
    url = state_url(teacher_url, state.state_id) if state.focus == "E2E" else teacher_url
    with _client(url, "teacher") as client:
        served = _play(toy, toy_bank, client, state)
    local = _play(toy, toy_bank, ScriptedPolicy("teacher"), state)
    _assert_same(served, local)
    assert served[0] > 0.5  # the teacher does the work: not two equal zeros


def test_served_teacher_plays_a_held_out_state_named_in_metadata(toy, heldout, teacher_url):
    state, source = heldout
    metadata = {"metadata": {"state_id": state.state_id}}
    with OpenAIPolicy(
        teacher_url,
        "teacher",
        temperature=None,
        max_tokens=None,
        max_retries=0,
        extra_body=metadata,
    ) as client:
        served = _play(toy, source, client, state)
    local = _play(toy, source, ScriptedPolicy("teacher"), state)
    _assert_same(served, local)
    assert served[0] > 0.5


@pytest.mark.parametrize("index", range(len(FOCUSES)), ids=FOCUSES)
def test_served_naive_scores_as_the_in_process_naive(toy, toy_bank, states, naive_url, index):
    state = states[index]  # no id: the naive script is the same for every task of a track
    with _client(naive_url, "naive") as client:
        served = _play(toy, toy_bank, client, state)
    local = _play(toy, toy_bank, ScriptedPolicy("naive"), state)
    _assert_same(served, local)


def test_an_e2e_teacher_episode_without_an_id_is_ambiguous(toy, toy_bank, teacher_url, states):
    status, _, text = _post(
        teacher_url, {"model": "teacher", "messages": [dict(m) for m in states[0].messages]}
    )
    assert status == 400
    error = json.loads(text)["error"]
    assert error["code"] == "unknown_conversation"
    # The bank's and the held-out tasks of the track open alike; their first turns differ.
    track = states[0].track
    alike = len(toy_bank.select(focus="E2E", track=track)) + len(toy.evaluated_seeds())
    assert f"opens like {alike} states" in error["message"] and "state_id" in error["message"]


def _post(url, body, path="/chat/completions"):
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type"), exc.read().decode()


def test_an_unknown_conversation_is_a_4xx_naming_the_fix(teacher_url):
    status, kind, text = _post(
        teacher_url, {"model": "teacher", "messages": [{"role": "user", "content": "hello"}]}
    )
    assert status == 400 and kind == "application/json"
    error = json.loads(text)["error"]
    assert error["code"] == "unknown_conversation"
    assert "metadata" in error["message"] and "--bank" in error["message"]
    # The client policy reports it at once, as a PolicyError with the server's words.
    with _client(teacher_url, "teacher") as client, pytest.raises(PolicyError, match="--bank"):
        client.act(_request([{"role": "user", "content": "hello"}]))


def test_an_unknown_state_id_is_a_404_listing_the_held_ones(teacher_url, states):
    body = {
        "model": "teacher",
        "messages": [dict(m) for m in states[0].messages],
        "metadata": {"state_id": "no-such-state"},
    }
    status, _, text = _post(teacher_url, body)
    assert status == 404
    assert states[0].state_id.split(".")[0] in json.loads(text)["error"]["message"]


def _request(messages, tools=()):
    from bat_gym.policies import PolicyRequest

    return PolicyRequest(messages=list(messages), tools=list(tools))


def test_models_lists_the_served_policy(teacher_url):
    with urllib.request.urlopen(teacher_url + "/models", timeout=30) as resp:
        listed = json.loads(resp.read())
    assert [m["id"] for m in listed["data"]] == ["teacher"]
    with _client(teacher_url, "teacher") as client:
        client.check_ready()


def test_tool_calls_come_back_in_the_openai_format_plain_and_streamed(teacher_url, states):
    state = states[1]
    body = {"model": "teacher", "messages": [dict(m) for m in state.messages]}
    status, kind, text = _post(teacher_url, body)
    assert status == 200 and kind == "application/json"
    reply = json.loads(text)
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant"
    expected = HERMES.parse(ScriptedPolicy("teacher").act(_scripted_request(state)).text)
    assert [c["type"] for c in message["tool_calls"]] == ["function"] * len(expected.calls)
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ] == [(c.name, c.arguments) for c in expected.calls]
    assert all(isinstance(c["function"]["arguments"], str) for c in message["tool_calls"])
    assert len({c["id"] for c in message["tool_calls"]}) == len(message["tool_calls"])
    # The same reply as server-sent events: one delta with the calls, then the finish.
    status, kind, text = _post(teacher_url, {**body, "stream": True})
    assert status == 200 and kind == "text/event-stream"
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls", [])]
    assert [(c["index"], c["function"]) for c in calls] == [
        (i, c["function"]) for i, c in enumerate(message["tool_calls"])
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_openai_client_reads_the_replies_plain_and_streamed(teacher_url, states):
    openai = pytest.importorskip("openai", reason="openai comes with the inspect extra (dev)")
    client = openai.OpenAI(base_url=teacher_url, api_key="unused", max_retries=0)
    state = states[0]  # E2E: named in metadata, the OpenAI field the client sends as it is
    messages = [dict(m) for m in state.messages]
    named = {"metadata": {"state_id": state.state_id}}
    reply = client.chat.completions.create(model="teacher", messages=messages, **named)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    expected = HERMES.parse(ScriptedPolicy("teacher").act(_scripted_request(state)).text)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == [(c.name, c.arguments) for c in expected.calls]
    assert choice.message.content == (expected.content or None)
    stream = client.chat.completions.create(
        model="teacher", messages=messages, stream=True, **named
    )
    chunks = list(stream)
    streamed = [c for ch in chunks for c in (ch.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed] == got
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError, match="metadata"):
        client.chat.completions.create(
            model="teacher", messages=[{"role": "user", "content": "hi"}]
        )


def _scripted_request(state):
    from bat_gym.catalog import get_benchmark
    from bat_gym.policies import EpisodeContext, PolicyRequest

    context = EpisodeContext(get_benchmark(state.benchmark), state, 0)
    return PolicyRequest(messages=list(state.messages), tools=[], context=context)


def test_a_served_tiny_model_answers_well_formed(tiny_model_dir, states):
    state = states[0]
    with serve_policy(f"hf:{tiny_model_dir}", max_new_tokens=16, seed=0) as url:
        status, _, text = _post(
            url, {"model": "tiny", "messages": [dict(m) for m in state.messages], "tools": []}
        )
    assert status == 200
    reply = json.loads(text)
    assert reply["object"] == "chat.completion" and reply["model"] == "tiny"
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    if choice["finish_reason"] == "tool_calls":
        for call in choice["message"]["tool_calls"]:
            json.loads(call["function"]["arguments"])
    else:
        assert isinstance(choice["message"]["content"], str)
    assert 1 <= reply["usage"]["completion_tokens"] <= 16


def test_sampling_options_are_refused_for_a_scripted_policy():
    from typer.testing import CliRunner

    from bat_gym.cli import app

    result = CliRunner().invoke(app, ["serve-policy", "--policy", "teacher", "--temperature", "1"])
    assert result.exit_code == 2
    assert "model policies" in result.output


def test_the_user_field_names_a_state_it_holds(teacher_url, states):
    state = states[0]  # E2E: ambiguous without an id
    body = {"model": "teacher", "messages": [dict(m) for m in state.messages]}
    status, _, text = _post(teacher_url, {**body, "user": state.state_id})
    assert status == 200
    calls = json.loads(text)["choices"][0]["message"]["tool_calls"]
    expected = HERMES.parse(ScriptedPolicy("teacher").act(_scripted_request(state)).text).calls
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        c.arguments for c in expected
    ]
    # A user field that is not a state id is a harness's own: it names nothing.
    status, _, _ = _post(teacher_url, {**body, "user": "someone"})
    assert status == 400
