"""The OpenAI chat-completions surface over HTTP, as ``bat-gym serve-policy`` speaks it.

The wire format: a policy's message (written in the env's tool protocol) becomes a
``chat.completion`` whose calls, read with the protocol
(:meth:`~bat_gym.core.protocol.ToolProtocol.parse`), are ``message.tool_calls``
(:meth:`~bat_gym.core.protocol.ToolCall.to_openai`: arguments a JSON string) with
``finish_reason: "tool_calls"``. It is the inverse of what the client side,
:func:`bat_gym.policies.openai_policy.render_tool_calls`, does with a server's reply,
so a message that goes through both comes back as the text it was.

The transport: the standard library's ``ThreadingHTTPServer`` (a thread per
connection) and a handler that routes to a :class:`ChatBackend` (what answers is
:class:`~bat_gym.integrations.policy_server.PolicyServer`). Errors are OpenAI-style
JSON bodies with the status the :class:`ChatRequestError` carries.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from bat_gym.core.errors import BatGymError
from bat_gym.core.protocol import ToolProtocol
from bat_gym.integrations.conversations import message_text
from bat_gym.policies import PolicyOutput

__all__ = [
    "ChatBackend",
    "ChatHTTPServer",
    "ChatRequestError",
    "chat_completion",
    "chat_handler",
    "request_messages",
    "stream_chunks",
]

logger = logging.getLogger(__name__)

_MAX_BODY_BYTES = 64 << 20  # a long episode's conversation is a few MB at most


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


def stream_chunks(reply: Mapping[str, Any]) -> list[dict[str, Any]]:
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


def request_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's ``messages``, checked, with content parts joined into text.

    Raises:
        ChatRequestError: no message list, or a message without a role.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("'messages' must be a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatRequestError(f"messages[{i}] must be an object with a string 'role'")
    # Content parts become text, as the env's own messages are.
    return [{**m, "content": message_text(m.get("content"))} for m in messages]


class ChatBackend(Protocol):
    """What answers the routes: :class:`~bat_gym.integrations.policy_server.PolicyServer`."""

    def models(self) -> dict[str, Any]:
        """The ``GET /v1/models`` reply."""

    def complete(self, body: Mapping[str, Any], state_id: str | None = None) -> dict[str, Any]:
        """A ``chat.completion`` for one request body; raises :class:`ChatRequestError`."""


class ChatHTTPServer(ThreadingHTTPServer):
    """A thread per connection, and a listen backlog for many episodes at once."""

    # The default backlog of 5 resets connections when a harness opens dozens at once
    # (64 concurrent sessions) while the accepting thread waits for a CPU.
    request_queue_size = 1024
    daemon_threads = True


_STATE_PREFIX = re.compile(r"^/states/(?P<state_id>[A-Za-z0-9_.:-]+)(?=/)")


def _route(path: str) -> tuple[str | None, str]:
    """(state id named by a ``/states/<id>`` prefix, route without it and ``/v1``)."""
    path = urllib.parse.unquote(path.split("?")[0]).rstrip("/")
    state_id = None
    prefix = _STATE_PREFIX.match(path)
    if prefix is not None:
        state_id, path = prefix["state_id"], path[prefix.end() :]
    return state_id, path.removeprefix("/v1")


def chat_handler(server: ChatBackend) -> type[BaseHTTPRequestHandler]:
    """The request handler class answering from ``server``.

    Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``, each also
    under a ``/states/<state_id>`` prefix that names the episode's start state.
    """

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
                self._events(stream_chunks(reply))
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
