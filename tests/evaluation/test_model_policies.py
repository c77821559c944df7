"""``bat-gym eval`` with model policies: a local OpenAI-compatible server, a local HF model."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from corpus import project_text
from typer.testing import CliRunner

from bat_gym.cli import app
from bat_gym.evaluation import AGGREGATES_FILE, Aggregates


def _reply(message):
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17},
    }


class AgentServer:
    """Answers like a short agent: one tool call, then finish. Fails the first request."""

    def __init__(self) -> None:
        self.requests = 0
        self.bodies: list[dict] = []
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests += 1
                    server.bodies.append(body)
                    first = server.requests == 1
                if first:  # an overloaded server: the policy must retry, not score 0
                    status, data = 503, {"error": {"message": "overloaded"}}
                elif any(m["role"] == "tool" for m in body["messages"]):
                    status, data = 200, _reply(_call("finish", {"summary": "done"}))
                else:
                    status, data = (
                        200,
                        _reply(
                            _call(
                                "execute_code", {"language": "bash", "code": "ls -R > listing.txt"}
                            )
                        ),
                    )
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _call(name, arguments):
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }  # fmt: skip


@pytest.fixture
def agent_server():
    srv = AgentServer()
    yield srv
    srv.close()


def test_eval_against_a_local_openai_compatible_server(toy, agent_server, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-test-key")
    result = CliRunner().invoke(
        app,
        ["eval", "--benchmark", "toy_pipeline", "--policy", f"openai:{agent_server.url}#tiny-agent",
         "--repeats", "1", "--out", str(tmp_path), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    agg = Aggregates.read(tmp_path / AGGREGATES_FILE)
    assert agg.valid and agg.completion.finished == len(toy.spec.tracks)
    assert agg.overall is not None and agg.overall < 0.5  # listing files solves nothing
    manifest = (tmp_path / "manifest.json").read_text()
    assert agent_server.url in manifest and "tiny-agent" in manifest
    assert "sk-secret" not in manifest + (tmp_path / "report.json").read_text()


def test_eval_passes_chat_template_kwargs_to_the_policy(toy, agent_server, tmp_path):
    result = CliRunner().invoke(
        app,
        ["eval", "--benchmark", "toy_pipeline", "--policy", f"openai:{agent_server.url}#tiny",
         "--repeats", "1", "--track", toy.spec.tracks[0].name, "--out", str(tmp_path),
         "--chat-template-kwargs", '{"enable_thinking": false}', "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in agent_server.bodies)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["policy"]["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize(
    ("policy", "value", "message"),
    [
        ("openai:http://127.0.0.1:9/v1#m", "thinking", "is not JSON"),
        ("teacher", '{"enable_thinking": false}', "apply to model policies"),
    ],
)
def test_eval_names_a_bad_chat_template_kwargs(tmp_path, policy, value, message):
    result = CliRunner().invoke(
        app,
        ["eval", "--benchmark", "toy_pipeline", "--policy", policy, "--out", str(tmp_path),
         "--chat-template-kwargs", value],
    )  # fmt: skip
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())


def test_a_server_that_dies_during_a_run_gives_invalid_cells_not_zeros(toy, tmp_path):
    from bat_gym.evaluation import EvalConfig, evaluate
    from bat_gym.policies.openai_policy import OpenAIPolicy

    dead = OpenAIPolicy("http://127.0.0.1:9/v1", "gone", max_retries=1, backoff_s=0.01)
    dead.check_ready = lambda: None  # it answered the check before the run, then went down
    cfg = EvalConfig(repeats=1, max_attempts=1, progress=False)
    agg = evaluate(toy, dead, tmp_path, cfg).aggregates
    assert agg.completion.invalid == len(toy.spec.tracks) and agg.overall is None
    assert agg.failures["infrastructure"] == len(toy.spec.tracks)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("torch")
    from bat_gym.trainers.tiny_model import build_tiny_model

    texts = project_text()
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), texts, vocab_size=600, hidden_size=64)


def test_eval_with_a_tiny_local_hf_model(toy, tiny_model, tmp_path):
    result = CliRunner().invoke(
        app,
        ["eval", "--benchmark", "toy_pipeline", "--policy", f"hf:{tiny_model}", "--repeats", "1",
         "--max-turns", "2", "--max-new-tokens", "16", "--seed", "3", "--out", str(tmp_path),
         "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    agg = Aggregates.read(tmp_path / AGGREGATES_FILE)
    assert agg.valid and agg.completion.runs == len(toy.spec.tracks)
    assert agg.failures["turn_budget"] == len(toy.spec.tracks)  # random text never finishes
    assert agg.overall == 0.0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["policy"]["kind"] in ("transformers", "TransformersPolicy")
    assert len(manifest["policy"]["sha256"]) == 64
    assert manifest["settings"]["budgets"]["max_turns"] == 2


def test_a_seeded_model_samples_each_cell_alike_with_one_worker_or_many(toy, tiny_model, tmp_path):
    """Concurrency changes the order requests arrive in, not the tokens a cell draws."""
    from bat_gym.core.spec import Budgets
    from bat_gym.evaluation import EvalConfig, evaluate
    from bat_gym.policies import make_policy

    def replies(workers: int) -> dict[str, list]:
        out = tmp_path / f"workers-{workers}"
        policy = make_policy(f"hf:{tiny_model}", temperature=1.0, max_new_tokens=12, seed=3)
        cfg = EvalConfig(repeats=2, workers=workers, budgets=Budgets(max_turns=2), progress=False)
        try:
            evaluate(toy, policy, out, cfg)
        finally:
            policy.close()
        return {
            path.name: [
                m for m in json.loads(path.read_text())["messages"] if m["role"] == "assistant"
            ]
            for path in sorted((out / "episodes").glob("*.json"))
        }

    alone, together = replies(1), replies(4)
    assert len(alone) == 2 * len(toy.spec.tracks) and alone.keys() == together.keys()
    assert alone == together
    # Each cell and turn has a seed of its own: the replies are not all one sample.
    assert len({m["content"] for ms in alone.values() for m in ms}) > len(alone)


def test_eval_of_a_local_hf_model_renders_with_the_chat_template_kwargs(toy, tiny_model, tmp_path):
    result = CliRunner().invoke(
        app,
        ["eval", "--benchmark", "toy_pipeline", "--policy", f"hf:{tiny_model}", "--repeats", "1",
         "--track", toy.spec.tracks[0].name, "--max-turns", "1", "--max-new-tokens", "4",
         "--chat-template-kwargs", '{"enable_thinking": false}', "--out", str(tmp_path),
         "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["policy"]["chat_template_kwargs"] == {"enable_thinking": False}
