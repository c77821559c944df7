"""Any bat_gym policy behind an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1.

This is how a third-party harness (OpenEnv, verifiers' ``vf-eval``, Inspect, Harbor)
plays bat_gym episodes offline with its own runner: it posts the conversation and the
env's tool schemas, and gets the policy's turn back with its tool calls in the OpenAI
format (``message.tool_calls``, ``finish_reason: "tool_calls"``).

* A **scripted** policy (``teacher``, ``naive``) replays its script: the server finds
  the episode's start state and turn from the conversation
  (:mod:`bat_gym.integrations.conversations`) and asks the policy with that
  :class:`~bat_gym.policies.EpisodeContext`, exactly as the in-process evaluation does.
* A **model** (``hf:PATH``, a tiny one from ``bat-gym tiny-model`` included) gets the
  request's messages and tools as they are, and no context.

The reply is the policy's message read with the tool protocol it writes (Hermes): its
calls become ``tool_calls`` (arguments a JSON string, ids ``call_<turn>_<i>``). A reply
with no readable call goes back as plain ``content``, so a client that hands the text
to the env (:class:`~bat_gym.policies.openai_policy.OpenAIPolicy` does) gets the env's
own tool-call error, as an in-process policy would. Usage is reported only when the
policy counts tokens (a scripted reply counts none, so the env's own counter decides
its token budget, as in process).

The HTTP server is the standard library's ``ThreadingHTTPServer``: one thread per
connection, no extra to install, so ``bat-gym serve-policy`` works from the core
install in any framework's venv. Requests' sampling fields (``temperature``,
``max_tokens``, ``seed``) are ignored: a model samples with the settings it was served
with. ``stream: true`` is answered as server-sent events, the whole reply in one chunk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bat_gym.errors import BatGymError, StateNotFound, UnsupportedPolicy
from bat_gym.integrations.conversations import (
    AmbiguousConversation,
    ConversationStates,
    Placement,
    UnknownConversation,
    message_text,
    same_turn,
)
from bat_gym.policies import EpisodeContext, Policy, PolicyError, PolicyOutput, PolicyRequest
from bat_gym.policies.scripted import ScriptedPolicy
from bat_gym.protocol import ToolProtocol, get_protocol

__all__ = [
    "ChatRequestError",
    "PolicyServer",
    "chat_completion",
    "load_states",
    "serve_policy",
    "state_url",
]

logger = logging.getLogger(__name__)

_MAX_BODY_BYTES = 64 << 20  # a long episode's conversation is a few MB at most
_SCRIPT_CACHE_SIZE = 65536  # scripted replies kept: (state, turn) pairs, a few kB each


class ChatRequestError(BatGymError, ValueError):
    """A chat request the server cannot answer, with the HTTP status and code to send.

    Attributes:
        status: the HTTP status (4xx: the request's fault; 5xx: the policy's).
        code: a short machine-readable code, e.g. ``"unknown_conversation"``.
    """

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request") -> None:
        self.status = status
        self.code = code
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        """The OpenAI-style error body."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": None, "code": self.code}}


def chat_completion(
    output: PolicyOutput, protocol: ToolProtocol, *, model: str, turn: int
) -> dict[str, Any]:
    """A policy's message as an OpenAI ``chat.completion`` object.

    Args:
        output: the policy's message, written in ``protocol``.
        protocol: the tool protocol the policy writes its calls in.
        model: the model name to report.
        turn: the episode's turn, for the call ids (``call_<turn>_<i>``).
    """
    parsed = protocol.parse(output.text)
    message: dict[str, Any] = {"role": "assistant"}
    if parsed.error is None and parsed.calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [
            call.model_copy(update={"id": f"call_{turn}_{i}"}).to_openai()
            for i, call in enumerate(parsed.calls)
        ]
        finish = "tool_calls"
    else:  # no readable call: the text as it is, for the env to report
        message["content"] = output.text
        finish = "length" if output.finish_reason == "length" else "stop"
    reply: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    completion = output.num_tokens
    if completion is not None:
        prompt = len(output.prompt_token_ids) if output.prompt_token_ids is not None else 0
        reply["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    return reply


def _stream_chunks(reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A ``chat.completion`` as ``chat.completion.chunk`` events: the delta, then the end."""
    choice = reply["choices"][0]
    delta: dict[str, Any] = {"role": "assistant", "content": choice["message"].get("content")}
    if choice["message"].get("tool_calls"):
        delta["tool_calls"] = [
            {"index": i, **call} for i, call in enumerate(choice["message"]["tool_calls"])
        ]
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]


def _explicit_state_id(
    body: Mapping[str, Any], states: ConversationStates, url_state_id: str | None
) -> str | None:
    """The start state a request names: ``metadata.state_id``, the URL's, or ``user``.

    ``user`` counts only when it is the id of a state held (harnesses put other things
    there).
    """
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and metadata.get("state_id") is not None:
        return str(metadata["state_id"])
    if url_state_id is not None:
        return url_state_id
    user = body.get("user")
    if isinstance(user, str) and user in states:
        return user
    return None


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatRequestError(f"messages[{i}] must be an object with a string 'role'")
    # Content parts become text, as the env's own messages are.
    return [{**m, "content": message_text(m.get("content"))} for m in messages]


class PolicyServer:
    """One policy answering OpenAI chat-completion requests over HTTP.

    Args:
        policy: who answers. A :class:`~bat_gym.policies.ScriptedPolicy` needs ``states``.
        states: the start states a scripted policy's episodes may start from.
        model: the model name ``/v1/models`` lists (default: the policy's name). Requests
            may name any model; the reply reports the one they named.
        host: the address to bind; 127.0.0.1 keeps it on this machine.
        port: the port; 0 picks a free one (:attr:`url` says which).
        protocol: the tool protocol the policy writes its calls in.

    Raises:
        ConfigError: a scripted policy without states.
    """

    def __init__(
        self,
        policy: Policy,
        states: ConversationStates | None = None,
        *,
        model: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        protocol: str = "hermes",
    ) -> None:
        from bat_gym.errors import ConfigError

        self.scripted = isinstance(policy, ScriptedPolicy)
        if self.scripted and states is None:
            raise ConfigError(
                f"the {policy.name} policy replays the script of each episode's start state; "
                "give the states its episodes start from (a bank, or a benchmark's held-out states)"
            )
        self.policy = policy
        self.states = states
        self.model = model or policy.name
        self.protocol = get_protocol(protocol)
        self._script_cache: dict[tuple[str, int], PolicyOutput] = {}
        self._cache_lock = threading.Lock()
        self._http = ThreadingHTTPServer((host, port), _handler(self))
        self._http.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API root clients use, e.g. ``http://127.0.0.1:8000/v1``."""
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- requests ------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        """The ``GET /v1/models`` reply: the one model served."""
        entry = {"id": self.model, "object": "model", "created": 0, "owned_by": "bat-gym"}
        return {"object": "list", "data": [entry]}

    def complete(self, body: Mapping[str, Any], state_id: str | None = None) -> dict[str, Any]:
        """Answer one ``POST /v1/chat/completions`` body with a ``chat.completion``.

        Args:
            body: the request.
            state_id: the episode's start state, when the request's URL names it
                (``/states/<id>/v1``); the body's ``metadata.state_id`` wins over it.

        Raises:
            ChatRequestError: with the status to send (4xx for the request's fault).
        """
        if not isinstance(body, Mapping):
            raise ChatRequestError("the request body must be a JSON object")
        if body.get("n", 1) != 1:
            raise ChatRequestError("only n=1 is served: send one request per sample", code="n")
        messages = _messages(body)
        tools = list(body.get("tools") or [])
        try:
            if self.scripted:
                output, turn = self._scripted_reply(body, messages, state_id)
            else:
                output = self.policy.act(PolicyRequest(messages=messages, tools=tools))
                turn = sum(1 for m in messages if m["role"] == "assistant")
        except StateNotFound as exc:
            raise ChatRequestError(str(exc), 404, "state_not_found") from None
        except UnknownConversation as exc:
            raise ChatRequestError(str(exc), 400, "unknown_conversation") from None
        except UnsupportedPolicy as exc:
            raise ChatRequestError(str(exc), 400, "unsupported_benchmark") from None
        except PolicyError as exc:
            raise ChatRequestError(str(exc), 503, "policy_failed") from None
        model = str(body.get("model") or self.model)
        return chat_completion(output, self.protocol, model=model, turn=turn)

    def _scripted_reply(
        self, body: Mapping[str, Any], messages: list[dict[str, Any]], state_id: str | None
    ) -> tuple[PolicyOutput, int]:
        """The script's turn for the episode ``messages`` is, and that turn's index.

        When the conversation fits several states, it is answered if they all give the
        same reply, or if those whose earlier replies are the conversation's own do.

        Raises:
            AmbiguousConversation: the states that fit give different replies.
        """
        assert self.states is not None
        explicit = _explicit_state_id(body, self.states, state_id)
        found = self.states.placements(messages, explicit)
        replies = {p.state.state_id: self._script_turn(p.state.state_id, p.turn) for p in found}
        if len({r.text for r in replies.values()}) > 1:
            found = [p for p in found if self._replays(p, messages)] or found
        if len({replies[p.state.state_id].text for p in found}) > 1:
            raise AmbiguousConversation([p.state.state_id for p in found])
        return replies[found[0].state.state_id], found[0].turn

    def _replays(self, placed: Placement, messages: list[dict[str, Any]]) -> bool:
        """Whether the conversation's turns after the state's history are the script's own."""
        stored = sum(1 for m in placed.state.messages if m["role"] == "assistant")
        said = [m for m in messages if m["role"] == "assistant"][stored:]
        for turn, message in enumerate(said):
            script = self._script_turn(placed.state.state_id, turn)
            mine = chat_completion(script, self.protocol, model="", turn=turn)
            if not same_turn(mine["choices"][0]["message"], message):
                return False
        return True

    def _script_turn(self, state_id: str, turn: int) -> PolicyOutput:
        """The scripted policy's reply at ``turn`` of an episode from ``state_id``.

        Cached: a script's turn depends on its start state and turn alone, never on the
        conversation's text.
        """
        key = (state_id, turn)
        with self._cache_lock:
            cached = self._script_cache.get(key)
        if cached is not None:
            return cached
        assert self.states is not None
        from bat_gym.catalog import get_benchmark

        state = self.states.get(state_id)
        context = EpisodeContext(benchmark=get_benchmark(state.benchmark), state=state, turn=turn)
        output = self.policy.act(PolicyRequest(messages=[], tools=[], context=context))
        with self._cache_lock:
            if len(self._script_cache) >= _SCRIPT_CACHE_SIZE:
                self._script_cache.clear()
            self._script_cache[key] = output
        return output

    # -- lifecycle -----------------------------------------------------------------

    def serve_forever(self) -> None:
        """Answer requests until :meth:`close` (or Ctrl-C) stops the server."""
        self._http.serve_forever(poll_interval=0.1)

    def start(self) -> str:
        """Serve from a background thread; returns :attr:`url`."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="bat-gym-serve-policy", daemon=True
        )
        self._thread.start()
        return self.url

    def close(self) -> None:
        """Stop serving and release the port (the policy stays open: its owner closes it)."""
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join()
            self._thread = None
        self._http.server_close()


_STATE_PREFIX = re.compile(r"^/states/(?P<state_id>[A-Za-z0-9_.:-]+)(?=/)")


def _route(path: str) -> tuple[str | None, str]:
    """(state id named by a ``/states/<id>`` prefix, route without it and ``/v1``)."""
    path = urllib.parse.unquote(path.split("?")[0]).rstrip("/")
    state_id = None
    prefix = _STATE_PREFIX.match(path)
    if prefix is not None:
        state_id, path = prefix["state_id"], path[prefix.end() :]
    return state_id, path.removeprefix("/v1")


def _handler(server: PolicyServer) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to ``server``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection

        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            _, route = _route(self.path)
            if route == "/models":
                self._json(200, server.models())
            elif route == "/health":
                self._json(200, {"status": "ok"})
            else:
                self._not_found()

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            state_id, route = _route(self.path)
            if route != "/chat/completions":
                self._not_found()
                return
            try:
                body = self._body()
                reply = server.complete(body, state_id)
            except ChatRequestError as exc:
                self._json(exc.status, exc.body())
                return
            except BatGymError as exc:
                error = ChatRequestError(str(exc), 400, type(exc).__name__)
                self._json(error.status, error.body())
                return
            except Exception as exc:  # noqa: BLE001 - a client gets a 500, not a dropped socket
                logger.exception("serve-policy: the request failed")
                error = ChatRequestError(f"{type(exc).__name__}: {exc}", 500, "internal_error")
                self._json(error.status, error.body())
                return
            if body.get("stream"):
                self._events(_stream_chunks(reply))
            else:
                self._json(200, reply)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > _MAX_BODY_BYTES:
                raise ChatRequestError(
                    f"the request needs a JSON body of 1 to {_MAX_BODY_BYTES} bytes "
                    f"(Content-Length {length})"
                )
            try:
                return json.loads(self.rfile.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ChatRequestError(f"the body is not JSON: {exc}") from None

        def _not_found(self) -> None:
            error = ChatRequestError(
                f"no route {self.command} {self.path}; this server answers POST "
                "/v1/chat/completions and GET /v1/models (also under /states/<state_id>)",
                404,
                "not_found",
            )
            self._json(404, error.body())

        def _json(self, status: int, obj: Any) -> None:
            data = json.dumps(obj, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _events(self, chunks: Sequence[Mapping[str, Any]]) -> None:
            """Server-sent events, then ``[DONE]``; the connection closes after them."""
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            logger.debug("serve-policy: " + format, *args)

    return Handler


def state_url(base_url: str, state_id: str) -> str:
    """The API root that names the episode's start state: ``.../states/<state_id>/v1``.

    For a harness that takes a base URL per episode and cannot add
    ``metadata.state_id`` to its requests.
    """
    root = base_url.rstrip("/").removesuffix("/v1")
    return f"{root}/states/{urllib.parse.quote(state_id, safe='')}/v1"


def load_states(
    benchmark: str | None = None, bank: str | Path | None = None, *, store_dir: str | Path
) -> ConversationStates:
    """The start states a scripted policy is served for.

    Args:
        benchmark: a benchmark whose held-out E2E start states (those ``bat-gym eval``
            plays: every track, its ``splits.heldout_repeats`` tasks) are served.
        bank: a Stage Bank directory, every state of which is served.
        store_dir: where the held-out states' public files are captured (a scratch
            directory; unused for a bank alone).

    Neither given: the default benchmark's held-out states. Both: the union.
    """
    from bat_gym.bank import StageBank, task_states
    from bat_gym.catalog import get_benchmark
    from bat_gym.evaluation.harness import EvalConfig, held_out_cells
    from bat_gym.sandbox.snapshot import BlobStore

    states = []
    if bank is not None:
        rows = StageBank(bank)
        states += [rows.get(i) for i in rows.select()]
    if benchmark is not None or bank is None:
        bench = get_benchmark(benchmark)
        tasks = sorted({(c.track, c.seed) for c in held_out_cells(bench, EvalConfig())})
        source = task_states(bench, tasks, "heldout", BlobStore(Path(store_dir)))
        states += [source.get(i) for i in source.select()]
    return ConversationStates(states)


_URL_LINE = re.compile(r"(http://\S+/v1)\b")


@contextlib.contextmanager
def serve_policy(
    policy: str | Policy = "teacher",
    *,
    benchmark: str | None = None,
    bank: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    in_process: bool = True,
    startup_timeout_s: float = 120.0,
    **policy_options: Any,
) -> Iterator[str]:
    """Serve a policy for the ``with`` block; yields the API root (``http://HOST:PORT/v1``).

    Args:
        policy: a policy spec (``teacher``, ``naive``, ``hf:PATH``) or, in process, a policy.
        benchmark: serve this benchmark's held-out start states (scripted policies).
        bank: serve every state of this Stage Bank directory (scripted policies).
        host: the address to bind.
        port: the port; 0 picks a free one.
        in_process: True: a server thread in this process. False: ``bat-gym
            serve-policy`` as a subprocess, as a user runs it (``policy`` must be a spec).
        startup_timeout_s: how long the subprocess may take to print its address.
        policy_options: in process, passed to :func:`~bat_gym.policies.make_policy`.

    Example:
        >>> from bat_gym.integrations.policy_server import serve_policy
        >>> from bat_gym.policies.openai_policy import OpenAIPolicy
        >>> with serve_policy("teacher", benchmark="toy_pipeline") as url:  # doctest: +SKIP
        ...     agent = OpenAIPolicy(url, "teacher")
    """
    if not in_process:
        if not isinstance(policy, str):
            raise TypeError("a subprocess server takes a policy spec string, not a policy")
        with _subprocess_server(policy, benchmark, bank, host, port, startup_timeout_s) as url:
            yield url
        return
    import tempfile

    from bat_gym.policies import make_policy

    agent = make_policy(policy, **policy_options) if isinstance(policy, str) else policy
    with tempfile.TemporaryDirectory(prefix="bat-serve-policy-") as scratch:
        states = None
        if isinstance(agent, ScriptedPolicy):
            states = load_states(benchmark, bank, store_dir=scratch)
        model = policy if isinstance(policy, str) else None
        server = PolicyServer(agent, states, model=model, host=host, port=port)
        try:
            yield server.start()
        finally:
            server.close()
            if isinstance(policy, str):
                agent.close()


@contextlib.contextmanager
def _subprocess_server(
    policy: str,
    benchmark: str | None,
    bank: str | Path | None,
    host: str,
    port: int,
    startup_timeout_s: float,
) -> Iterator[str]:
    """``bat-gym serve-policy`` in a subprocess, until the block ends; yields its API root."""
    args = [sys.executable, "-m", "bat_gym.cli", "serve-policy", "--policy", policy]
    args += ["--host", host, "--port", str(port)]
    if benchmark is not None:
        args += ["--benchmark", benchmark]
    if bank is not None:
        args += ["--bank", str(bank)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:  # drains stderr for the server's life, so it never blocks on a pipe
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            match = _URL_LINE.search(line)
            if match and not found.is_set():
                url.append(match.group(1))
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not found.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if proc.returncode is not None else "printed no address in time"
                raise RuntimeError(
                    f"bat-gym serve-policy {why}: {' '.join(args)}\n{''.join(lines[-20:])}"
                )
        yield url[0]
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the command cleans its scratch up
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
