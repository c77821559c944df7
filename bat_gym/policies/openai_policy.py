"""An OpenAI-compatible chat-completions server as a policy (vLLM, SGLang, llama.cpp, hosted APIs).

Each request is one ``POST {base_url}/chat/completions`` with the conversation and the
env's tool schemas (``tool_choice: "auto"``). The server's structured ``tool_calls`` are
written back into the env's tool protocol (Hermes ``<tool_call>`` blocks by default),
so the reply is an env action like any other policy's; a plain-content reply passes
through untouched (the env reads any tool calls written in it).

Only the standard library speaks HTTP here, so the backend needs no extra. Failures that
may pass (HTTP 429, 5xx, refused connections, timeouts) are retried with exponential
backoff and jitter, honouring ``Retry-After``; any other 4xx is a
:class:`~bat_gym.policies.base.PolicyError` at once, with the server's message.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import ToolCall, ToolProtocol, get_protocol
from bat_gym.policies.base import (
    Policy,
    PolicyError,
    PolicyOutput,
    PolicyRequest,
    keyed_seed,
)

__all__ = ["OpenAIPolicy", "openai_messages", "render_tool_calls"]

logger = logging.getLogger(__name__)

# Keys each role may carry in an OpenAI chat request; strict servers reject others.
_MESSAGE_KEYS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


def openai_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as a strict OpenAI chat request wants it.

    Keeps only the keys each role may carry (the env's tool messages also name the
    tool, which some servers refuse), and makes every tool call's ``arguments`` a
    JSON string.
    """
    out = []
    for message in messages:
        keys = _MESSAGE_KEYS.get(message.get("role", ""), tuple(message))
        clean = {k: message[k] for k in keys if k in message}
        if clean.get("tool_calls"):
            calls = []
            for call in clean["tool_calls"]:
                fn = dict(call.get("function") or {})
                if not isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.dumps(fn.get("arguments") or {}, ensure_ascii=False)
                calls.append({"id": call.get("id", ""), "type": "function", "function": fn})
            clean["tool_calls"] = calls
        elif "tool_calls" in clean:
            del clean["tool_calls"]  # an empty list is invalid for some servers
        out.append(clean)
    return out


def render_tool_calls(
    protocol: ToolProtocol, content: str, raw_calls: Sequence[tuple[str, str]]
) -> str:
    """Write a reply's content and ``(name, arguments JSON)`` calls in the env's protocol.

    Calls whose arguments are a JSON object go through ``protocol.render``. Arguments
    that are not (invalid JSON, a list) cannot become a :class:`ToolCall`; for the
    built-in protocols they are written as a JSON *string*, which the env's parser
    reports to the agent ("'arguments' is a string that is not valid JSON ..."), as it
    would the same mistake written by a local model. Any other protocol gets the raw
    text under an ``_unparsed_arguments`` key, which the tool schemas reject.
    """
    parsed: list[tuple[str, dict[str, Any] | str]] = []
    for name, raw in raw_calls:
        try:
            args = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            args = None
        parsed.append((name, args if isinstance(args, dict) else raw))
    if all(isinstance(a, dict) for _, a in parsed):
        calls = [ToolCall(name=n, arguments=a) for n, a in parsed]  # type: ignore[arg-type]
        return protocol.render(content, calls)
    if protocol.name == "hermes":
        parts = [content.strip()] if content.strip() else []
        for name, args in parsed:
            body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            parts.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(parts)
    if protocol.name == "json":
        objs = [{"name": n, "arguments": a} for n, a in parsed]
        body = json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)
        return f"{content.strip()}\n{body}".strip()
    if protocol.name == "openai":
        items = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": n,
                    "arguments": a if isinstance(a, str) else json.dumps(a, ensure_ascii=False),
                },
            }
            for i, (n, a) in enumerate(parsed)
        ]
        return json.dumps({"content": content, "tool_calls": items}, ensure_ascii=False)
    calls = [
        ToolCall(name=n, arguments=a if isinstance(a, dict) else {"_unparsed_arguments": a})
        for n, a in parsed
    ]
    return protocol.render(content, calls)


class _Retryable(Exception):
    """One attempt failed in a way that may pass; ``wait_s`` is the server's Retry-After."""

    def __init__(self, reason: str, wait_s: float | None = None) -> None:
        super().__init__(reason)
        self.wait_s = wait_s


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _server_message(body: bytes) -> str:
    """The error text a server put in its reply (OpenAI, FastAPI or plain text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text[:2000] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if err.get(key):
                    return str(err[key])[:2000]
        elif isinstance(err, str):
            return err[:2000]
        if obj.get("detail"):
            return str(obj["detail"])[:2000]
    return text[:2000]


class OpenAIPolicy(Policy):
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the server knows.
        api_key: bearer token; default: the ``OPENAI_API_KEY`` environment variable
            (none sent when neither is set). Never written to :meth:`identity`.
        temperature: sampling temperature; None leaves it to the server.
        top_p: nucleus mass; None leaves it to the server.
        max_tokens: the most tokens one reply may have; None leaves it to the server.
        seed: passed to servers that support seeded sampling; None sends none. A
            request with a ``seed_key`` is sent :func:`~bat_gym.policies.keyed_seed` of
            this seed and its key instead.
        timeout_s: seconds one attempt may wait on the socket (connect, each read).
        max_retries: attempts after the first for retryable failures (>= 0).
        backoff_s: the first retry's delay; it doubles with each retry, times a random
            factor in [0.5, 1), capped at ``max_backoff_s``. A ``Retry-After`` header
            replaces it (also capped).
        max_backoff_s: the longest single wait between attempts.
        max_concurrency: requests in flight at once from this policy, across threads.
        protocol: the env's tool protocol, that tool calls are written in.
        extra_body: more request fields (e.g. ``{"top_k": 20}`` for vLLM).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float | None = 0.7,
        top_p: float | None = None,
        max_tokens: int | None = 1024,
        seed: int | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        max_concurrency: int = 8,
        protocol: str | ToolProtocol = "hermes",
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must start with http:// or https://, got {base_url!r}")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ConfigError(
                f"backoff_s and max_backoff_s must be >= 0, got {backoff_s}, {max_backoff_s}"
            )
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.seed = seed
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_concurrency = max_concurrency
        self.protocol = get_protocol(protocol)
        self.extra_body = dict(extra_body or {})
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAIPolicy({self.base_url!r}, {self.model!r})"

    # -- Policy protocol -----------------------------------------------------------

    def act(self, request: PolicyRequest) -> PolicyOutput:
        """One reply; safe to call from many threads (``max_concurrency`` bounds them)."""
        return self._complete(request)

    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        """One reply per request, sent concurrently; the server does the batching.

        Raises:
            PolicyError: a request failed for good (the first such failure is raised).
        """
        if len(requests) <= 1:
            return [self._complete(r) for r in requests]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=self.name)
            pool = self._pool
        return list(pool.map(self._complete, requests))

    def check_ready(self, timeout_s: float = 5.0) -> None:
        """One ``GET {base_url}/models``: the server must answer, and know the model.

        Any HTTP answer but 401/403/404 means a server is there; a refused connection,
        an unknown host or no answer within ``timeout_s`` is a :class:`PolicyError`
        at once, without the retries a request would get.
        """
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        req = urllib.request.Request(f"{self.base_url}/models", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise PolicyError(
                    f"{self.name} at {self.base_url}: HTTP {exc.code}, the server refuses "
                    "the credentials; set the API key (api_key= or OPENAI_API_KEY)"
                ) from None
            return  # a server answered; some have no /models route
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise PolicyError(
                f"{self.name} at {self.base_url}: no server answers ({reason}); start it, or "
                "check the URL (it ends in /v1 for vLLM and SGLang)"
            ) from None
        try:
            served = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            return
        if served and self.model not in served:
            raise PolicyError(
                f"{self.name} at {self.base_url}: the server does not serve model "
                f"{self.model!r}; it serves {', '.join(map(str, served[:8]))}"
            )

    def identity(self) -> dict[str, Any]:
        """Server, model and sampling settings; never the API key."""
        return {
            "kind": "openai",
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "protocol": self.protocol.name,
            # What else each request carries (e.g. chat_template_kwargs) changes the prompts.
            **({"extra_body": dict(self.extra_body)} if self.extra_body else {}),
        }

    def close(self) -> None:
        """Stop the thread pool :meth:`act_batch` uses."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- one request ---------------------------------------------------------------

    def payload(self, request: PolicyRequest) -> dict[str, Any]:
        """The JSON body for one request."""
        body: dict[str, Any] = {"model": self.model, "messages": openai_messages(request.messages)}
        if request.tools:
            body["tools"] = list(request.tools)
            body["tool_choice"] = "auto"
        for key, value in (
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("max_tokens", self.max_tokens),
            ("seed", self._seed_of(request)),
        ):
            if value is not None:
                body[key] = value
        body.update(self.extra_body)
        return body

    def _seed_of(self, request: PolicyRequest) -> int | None:
        """The seed sent with ``request``: keyed by its ``seed_key`` when it has one.

        Sending one seed with every request would make a seeded server sample identical
        replies to identical prompts (every rollout of a group alike).
        """
        if self.seed is None or request.seed_key is None:
            return self.seed
        return keyed_seed(self.seed, request.seed_key)

    def _complete(self, request: PolicyRequest) -> PolicyOutput:
        data = json.dumps(self.payload(request), ensure_ascii=False).encode()
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            try:
                with self._slots:
                    reply = self._post(data)
                return self._output(reply)
            except _Retryable as exc:
                last = str(exc)
                if attempt == self.max_retries:
                    break
                wait = exc.wait_s
                if wait is None:
                    wait = self.backoff_s * 2**attempt * random.uniform(0.5, 1.0)
                wait = min(wait, self.max_backoff_s)
                logger.warning(
                    "%s: attempt %d/%d failed (%s); retrying in %.2f s",
                    self.name,
                    attempt + 1,
                    self.max_retries + 1,
                    last,
                    wait,
                )
                time.sleep(wait)
        raise PolicyError(
            f"{self.name} at {self.base_url}: gave up after {self.max_retries + 1} attempts; last: {last}"
        )

    def _post(self, data: bytes) -> dict[str, Any]:
        """One HTTP attempt; the decoded reply, or an exception saying whether to retry."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(
            f"{self.base_url}/chat/completions", data=data, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            status, message = exc.code, _server_message(exc.read() or b"")
            if status == 429 or status >= 500:
                raise _Retryable(
                    f"HTTP {status}: {message}", _retry_after(exc.headers.get("Retry-After"))
                ) from None
            raise PolicyError(f"{self.name} at {self.base_url}: HTTP {status}: {message}") from None
        except (TimeoutError, ConnectionError, http.client.HTTPException) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from None
        except urllib.error.URLError as exc:  # refused or timed-out connections land here
            raise _Retryable(f"cannot reach the server: {exc.reason}") from None
        try:
            reply = json.loads(body)
        except json.JSONDecodeError as exc:
            raise PolicyError(
                f"{self.name}: the reply is not JSON ({exc.msg}): {body[:200]!r}"
            ) from None
        if not isinstance(reply, dict):
            raise PolicyError(f"{self.name}: the reply is not a JSON object: {body[:200]!r}")
        return reply

    def _output(self, reply: dict[str, Any]) -> PolicyOutput:
        """Turn a chat-completions reply into the env's action text."""
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise PolicyError(f"{self.name}: the reply has no choices: {str(reply)[:300]}")
        choice = choices[0]
        message = choice.get("message") or {}
        content = message.get("content") or ""
        if not isinstance(content, str):  # content parts: keep the text ones
            content = "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        raw_calls = []
        for call in message.get("tool_calls") or []:
            fn = (call or {}).get("function") or {}
            args = fn.get("arguments")
            if not isinstance(args, str):  # some servers send an object, not a string
                args = json.dumps(args if args is not None else {}, ensure_ascii=False)
            raw_calls.append((str(fn.get("name") or ""), args))
        text = render_tool_calls(self.protocol, content, raw_calls) if raw_calls else content
        usage = {
            key: int(value)
            for key, value in (reply.get("usage") or {}).items()
            if key in ("prompt_tokens", "completion_tokens", "total_tokens")
            and isinstance(value, int)
        }
        return PolicyOutput(text=text, finish_reason=choice.get("finish_reason"), usage=usage)
