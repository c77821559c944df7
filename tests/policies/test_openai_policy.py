"""OpenAIPolicy against a scripted OpenAI-compatible server on 127.0.0.1 (started here)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

from bat_gym.core.protocol import TOOLS, ToolCall, get_protocol
from bat_gym.policies import PolicyError, PolicyRequest, make_policy
from bat_gym.policies.openai_policy import OpenAIPolicy, openai_messages, render_tool_calls

HERMES = get_protocol("hermes")


def tool_reply(name, arguments, content=None, completion_tokens=17):
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": completion_tokens, "total_tokens": 67},
    }


def text_reply(text, completion_tokens=5):
    return {
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": completion_tokens},
    }


class Reply:
    """One scripted answer: status, JSON body, headers, and a delay before answering."""

    def __init__(self, body, status=200, headers=None, delay_s=0.0):
        self.body, self.status, self.headers, self.delay_s = body, status, headers or {}, delay_s


class FakeServer:
    """A ThreadingHTTPServer that answers POST /v1/chat/completions from a script."""

    def __init__(self):
        self.script = []
        self.default = Reply(text_reply("default reply"))
        self.requests = []  # (headers, body) per request, in arrival order
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.models = ["tiny-qwen"]  # GET /v1/models lists these
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                data = json.dumps({"data": [{"id": m} for m in server.models]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((dict(self.headers), body, self.path))
                    reply = server.script.pop(0) if server.script else server.default
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(reply.delay_s)
                finally:
                    # Done before the reply is sent: once the client has it, it may send
                    # its next request, which must not find this one still counted.
                    with server.lock:
                        server.in_flight -= 1
                try:
                    data = json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = FakeServer()
    yield srv
    srv.close()


@pytest.fixture
def make(server):
    made = []

    def build(**kwargs):
        kwargs.setdefault("backoff_s", 0.01)
        kwargs.setdefault("api_key", "")
        pol = OpenAIPolicy(server.url, "tiny-qwen", **kwargs)
        made.append(pol)
        return pol

    yield build
    for pol in made:
        pol.close()


def req(text="List the files."):
    return PolicyRequest(
        messages=[
            {"role": "system", "content": "Work in the sandbox."},
            {"role": "user", "content": text},
        ],
        tools=list(TOOLS),
    )


def test_make_policy_parses_url_and_model():
    pol = make_policy("openai:http://127.0.0.1:9/v1#qwen-7b", api_key="")
    assert isinstance(pol, OpenAIPolicy)
    assert (pol.base_url, pol.model) == ("http://127.0.0.1:9/v1", "qwen-7b")
    with pytest.raises(ValueError, match="openai:URL#MODEL"):
        make_policy("openai:http://127.0.0.1:9/v1")


def test_tool_calls_become_hermes_text_the_env_parses(server, make):
    server.script = [
        Reply(tool_reply("execute_code", '{"language": "bash", "code": "ls -la"}', "Looking."))
    ]
    out = make().act(req())
    parsed = HERMES.parse(out.text)
    assert parsed.error is None and parsed.content == "Looking."
    assert parsed.calls == (
        ToolCall(name="execute_code", arguments={"language": "bash", "code": "ls -la"}),
    )
    assert out.usage["completion_tokens"] == 17 and out.num_tokens == 17
    assert out.finish_reason == "tool_calls" and out.token_ids is None


def test_the_request_is_valid_openai_chat_with_tools(server, make):
    make(temperature=0.2, max_tokens=64).act(req())
    headers, body, path = server.requests[0]
    assert path == "/v1/chat/completions"
    assert body["model"] == "tiny-qwen" and body["tool_choice"] == "auto"
    assert body["tools"] == list(TOOLS) and body["messages"] == req().messages
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64
    assert "Authorization" not in headers  # no key, no header


def test_plain_content_passes_through(server, make):
    server.script = [Reply(text_reply("I cannot do that."))]
    out = make().act(req())
    assert out.text == "I cannot do that." and out.usage["completion_tokens"] == 5


@pytest.mark.parametrize("protocol", ["hermes", "json", "openai"])
def test_malformed_arguments_reach_the_env_as_an_error_not_a_crash(server, make, protocol):
    server.script = [Reply(tool_reply("execute_code", '{"language": "bash", "code": "ls'))]
    out = make(protocol=protocol).act(req())
    parsed = get_protocol(protocol).parse(out.text)
    assert not parsed.calls and "not valid JSON" in parsed.error


def test_render_keeps_good_calls_and_rejects_non_object_arguments():
    text = render_tool_calls(
        HERMES, "", [("finish", '{"summary": "ok"}'), ("execute_code", "[1, 2]")]
    )
    assert "must be a JSON object, got list" in HERMES.parse(text).error
    assert render_tool_calls(HERMES, "hi", [("finish", "")]) == HERMES.render(
        "hi", [ToolCall(name="finish")]
    )


def test_429_is_retried_honouring_retry_after(server, make):
    server.script = [
        Reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"}),
        Reply(text_reply("after the wait")),
    ]
    # A long backoff would make this test slow: Retry-After 0 must replace it.
    started = time.monotonic()
    out = make(backoff_s=30).act(req())
    assert out.text == "after the wait" and len(server.requests) == 2
    assert time.monotonic() - started < 5


def test_500_is_retried(server, make):
    server.script = [
        Reply({"error": {"message": "engine restarting"}}, status=500),
        Reply(text_reply("ok")),
    ]
    assert make().act(req()).text == "ok" and len(server.requests) == 2


def test_a_permanent_400_fails_at_once_with_the_server_message(server, make):
    server.script = [Reply({"error": {"message": "max_tokens is too large"}}, status=400)]
    with pytest.raises(PolicyError, match="HTTP 400: max_tokens is too large"):
        make().act(req())
    assert len(server.requests) == 1


def test_timeouts_are_retried_then_reported(server, make):
    slow = Reply(text_reply("too late"), delay_s=1.0)
    server.script = [slow, slow]
    with pytest.raises(PolicyError, match="gave up after 2 attempts.*[Tt]imed? ?out"):
        make(timeout_s=0.2, max_retries=1).act(req())
    assert len(server.requests) == 2


def test_an_unreachable_server_is_retried_then_reported():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    pol = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", api_key="", max_retries=1, backoff_s=0)
    with pytest.raises(PolicyError, match="gave up after 2 attempts"):
        pol.act(req())


def test_concurrency_is_bounded_across_threads(server, make):
    server.default = Reply(text_reply("done"), delay_s=0.15)
    pol = make(max_concurrency=2)
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(pol.act(req()))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(outs) == 6 and server.max_in_flight == 2
    assert [o.text for o in pol.act_batch([req()] * 4)] == ["done"] * 4
    assert server.max_in_flight == 2


def test_the_api_key_is_sent_but_never_shown(server, make, monkeypatch):
    pol = make(api_key="sk-secret-123")
    pol.act(req())
    assert server.requests[-1][0]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in json.dumps(pol.identity()) + repr(pol)
    assert pol.identity() == {
        "kind": "openai",
        "name": "openai:tiny-qwen",
        "base_url": server.url,
        "model": "tiny-qwen",
        "temperature": 0.7,
        "top_p": None,
        "max_tokens": 1024,
        "seed": None,
        "protocol": "hermes",
    }
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    OpenAIPolicy(server.url, "tiny-qwen").act(req())
    assert server.requests[-1][0]["Authorization"] == "Bearer sk-from-env"


def test_chat_template_kwargs_ride_in_the_request_body(server):
    from bat_gym.policies import make_policy

    pol = make_policy(
        f"openai:{server.url}#tiny-qwen",
        api_key="",
        extra_body={"top_k": 20},
        chat_template_kwargs={"enable_thinking": False},
    )
    try:
        pol.act(req())
    finally:
        pol.close()
    body = server.requests[-1][1]
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_k"] == 20
    assert pol.identity()["extra_body"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_env_messages_are_sent_in_strict_openai_form():
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "finish", "arguments": {"summary": "x"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "finish", "content": "ok"},
        {"role": "assistant", "content": "plain", "tool_calls": []},
    ]
    assert openai_messages(messages) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "finish", "arguments": '{"summary": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "ok"},
        {"role": "assistant", "content": "plain"},
    ]


def test_an_episode_on_the_toy_benchmark_driven_through_the_server(server, make, toy_bank):
    server.script = [
        Reply(
            tool_reply(
                "execute_code",
                json.dumps({"language": "bash", "code": "echo hello > note.txt; cat note.txt"}),
            )
        ),
        Reply(tool_reply("finish", '{"summary": "wrote a note"}', "All done.")),
    ]
    env = gym.make("bat/E2E-v0", benchmark="toy_pipeline", states=toy_bank)
    pol = make()
    try:
        _, info = env.reset(seed=0)
        for _ in range(5):
            out = pol.act(PolicyRequest(messages=info["messages"], tools=info["tools"]))
            obs, reward, terminated, truncated, info = env.step(out.action())
            if terminated or truncated:
                break
    finally:
        env.close()
    assert terminated and not truncated and len(server.requests) == 2
    call = info["record"].calls[0]
    assert call.exit_code == 0 and "hello" in call.output and "echo hello" in call.code
    assert info["verdict"] is not None and reward == (info["verdict"].reward or 0.0)
    # The second request carried the tool result as a valid OpenAI tool message.
    sent = server.requests[1][1]["messages"]
    tool_msgs = [m for m in sent if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[-1]["tool_call_id"] and "hello" in tool_msgs[-1]["content"]
    assert all(
        isinstance(c["function"]["arguments"], str) for m in sent for c in m.get("tool_calls", [])
    )


def _closed_port_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_check_ready_passes_on_a_serving_server_and_names_what_is_wrong_otherwise(server, make):
    from bat_gym.core.errors import BatGymError

    make().check_ready()
    server.models = ["other-model"]
    with pytest.raises(
        PolicyError, match="does not serve model 'tiny-qwen'; it serves other-model"
    ):
        make().check_ready()
    down = OpenAIPolicy(_closed_port_url(), "tiny-qwen", api_key="", backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(BatGymError, match="no server answers .* start it, or check the URL"):
        down.check_ready()
    assert time.monotonic() - t0 < 3.0  # no retries
    down.close()


def test_an_evaluation_against_a_server_that_is_down_fails_once_up_front(tmp_path):
    from bat_gym.evaluation import evaluate

    down = OpenAIPolicy(_closed_port_url(), "tiny-qwen", api_key="", backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match="no server answers"):
        evaluate("toy_pipeline", down, tmp_path / "run")
    assert time.monotonic() - t0 < 5.0
    assert not list((tmp_path / "run").glob("cells/*"))
    down.close()


def test_a_keyed_request_sends_its_own_seed():
    from dataclasses import replace

    from bat_gym.policies import keyed_seed

    pol = OpenAIPolicy("http://127.0.0.1:9/v1", "m", seed=11)
    plain, keyed = req(), replace(req(), seed_key=("cell", "t", 5, 0, 2))
    assert pol.payload(plain)["seed"] == 11
    assert pol.payload(keyed)["seed"] == keyed_seed(11, ("cell", "t", 5, 0, 2)) != 11
    # An unseeded policy sends no seed, key or not.
    assert "seed" not in OpenAIPolicy("http://127.0.0.1:9/v1", "m").payload(keyed)
