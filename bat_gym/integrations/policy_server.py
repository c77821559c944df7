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
import logging
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bat_gym.core.errors import StateNotFound, UnsupportedPolicy
from bat_gym.core.protocol import get_protocol
from bat_gym.integrations.conversations import (
    AmbiguousConversation,
    ConversationStates,
    UnknownConversation,
)
from bat_gym.integrations.openai_chat import (
    ChatHTTPServer,
    ChatRequestError,
    chat_completion,
    chat_handler,
    request_messages,
)
from bat_gym.policies import EpisodeContext, Policy, PolicyError, PolicyOutput, PolicyRequest
from bat_gym.policies.scripted import ScriptedPolicy

__all__ = [
    "PolicyServer",
    "load_states",
    "policy_server",
    "serve_policy",
    "state_url",
]

logger = logging.getLogger(__name__)

_SCRIPT_CACHE_SIZE = 65536  # scripted replies kept: (state, turn) pairs, a few kB each


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
        from bat_gym.core.errors import ConfigError

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
        try:
            self._http = ChatHTTPServer((host, port), chat_handler(self))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port, "
                "or --port 0 for a free one"
            ) from None
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
        messages = request_messages(body)
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

        When the conversation fits several states, it is answered if their scripts all
        give the same reply at this turn (whichever state it is, that is the reply).

        Raises:
            AmbiguousConversation: the states that fit give different replies.
        """
        assert self.states is not None
        explicit = _explicit_state_id(body, self.states, state_id)
        found = self.states.placements(messages, explicit)
        replies = [self._script_turn(p.state.state_id, p.turn) for p in found]
        if len({r.text for r in replies}) > 1:
            raise AmbiguousConversation([p.state.state_id for p in found])
        return replies[0], found[0].turn

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
    from bat_gym.core.sandbox.snapshot import BlobStore
    from bat_gym.evaluation.harness import EvalConfig, held_out_cells

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
    from bat_gym.policies import make_policy

    agent = make_policy(policy, **policy_options) if isinstance(policy, str) else policy
    model = policy if isinstance(policy, str) else None
    try:
        with policy_server(
            agent, benchmark=benchmark, bank=bank, model=model, host=host, port=port
        ) as server:
            yield server.start()
    finally:
        if isinstance(policy, str):
            agent.close()


@contextlib.contextmanager
def policy_server(
    policy: Policy,
    *,
    benchmark: str | None = None,
    bank: str | Path | None = None,
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> Iterator[PolicyServer]:
    """A :class:`PolicyServer` bound and ready (not yet serving), closed when the block ends.

    A scripted policy is given the states of ``benchmark`` and ``bank``
    (:func:`load_states`), their held-out files captured in a scratch directory that
    lives as long as the block.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bat-serve-policy-") as scratch:
        states = None
        if isinstance(policy, ScriptedPolicy):
            states = load_states(benchmark, bank, store_dir=scratch)
        server = PolicyServer(policy, states, model=model, host=host, port=port)
        try:
            yield server
        finally:
            server.close()


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
        proc.terminate()  # the command stops as on Ctrl-C, cleaning its scratch up
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
