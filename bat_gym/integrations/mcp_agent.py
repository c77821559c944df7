"""An external agent that speaks MCP, as a bat_gym :class:`~bat_gym.policies.Policy`.

``bat-gym eval --policy 'mcp-agent:COMMAND'`` scores any agent that can use MCP tools
(Claude Code, Codex, an Inspect or Harbor agent, a script on the ``mcp`` package's
client) on held-out cells, with the cells scored, retried, aggregated and reported as a
bat_gym policy's are.

For each episode the policy starts an MCP server (streamable HTTP on 127.0.0.1, a port
of its own) that lists the env's tools with the env's JSON Schemas and gives the state's
prompt as its ``instructions`` and its prompt ``task``, then runs ``COMMAND`` with
``BAT_GYM_MCP_URL`` set to that server's address. The control is turned around, and
the loop is the project's one loop: each MCP ``tools/call`` becomes the policy's next
turn (one call written in the env's protocol), the harness steps the env with it, and
the env's observation is the call's result. The agent is told nothing the harness
does not show a policy: no reward, no verdict (the held-out firewall).

How an episode ends:

* the agent calls ``finish``, or a budget runs out: the harness ends the episode, the
  pending call is answered ``[the episode has ended: REASON]`` and the agent process
  is given :attr:`McpAgentPolicy.exit_grace_s` to leave before it is stopped;
* the agent exits with status 0 without finishing: every later turn is an empty
  message (a refused turn), so the episode runs out its turn budget and is scored as
  it stands, as a model that stops calling tools is;
* the agent exits non-zero, or sends no call for :attr:`McpAgentPolicy.turn_timeout_s`:
  a :class:`~bat_gym.policies.PolicyError` with the tail of its stderr. That is an
  infrastructure failure: the harness plays the cell again, and records it invalid
  (never a zero) if it persists.

The manifest's ``policy`` names the command, the sha256 of the program it runs (when
it is a file) and the MCP ``clientInfo`` every session announced.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import os
import queue
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import ToolCall, ToolProtocol, get_protocol
from bat_gym.policies.base import Policy, PolicyError, PolicyKind, PolicyOutput, PolicyRequest

__all__ = ["MCP_AGENT", "MCP_URL_VARIABLE", "McpAgentPolicy"]

MCP_URL_VARIABLE = "BAT_GYM_MCP_URL"
"""The environment variable that gives the agent its episode's MCP server address."""

_LOCALHOST = "127.0.0.1"
_STDERR_TAIL = 4000  # characters of the agent's stderr an error quotes


class _Call:
    """One ``tools/call`` from the agent, waiting for the env's observation."""

    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.name = name
        self.arguments = arguments
        self.reply: concurrent.futures.Future[str] = concurrent.futures.Future()


class _AgentSession:
    """One episode's MCP server and agent process.

    The server runs on a thread of its own (its own event loop); the harness thread
    takes the agent's calls from :attr:`calls` and answers each through its future.
    """

    def __init__(self, policy: McpAgentPolicy, request: PolicyRequest) -> None:
        from mcp.server.mcpserver import MCPServer

        self.policy = policy
        self.calls: queue.Queue[_Call] = queue.Queue()
        self.pending: _Call | None = None
        self.ended: str | None = None
        self.client: dict[str, Any] | None = None
        prompt = "\n\n".join(
            str(m.get("content") or "") for m in request.messages if m["role"] != "assistant"
        )
        self.server = MCPServer(
            name="bat-gym",
            instructions=(
                "Call the tools this server lists to do the task below; each call is one "
                "turn of the episode. Call finish when the work is done.\n\n" + prompt
            ),
            log_level="WARNING",
            tools=[self._tool(schema["function"]) for schema in request.tools],
        )
        self.server.prompt(name="task", description="What the agent is asked to do.")(
            lambda: prompt
        )
        # Bound and listening before the agent starts: its first connection waits in the
        # kernel's queue until the server takes it.
        self._sock = socket.socket()
        self._sock.bind((_LOCALHOST, 0))
        self._sock.listen(64)
        self.url = f"http://{_LOCALHOST}:{self._sock.getsockname()[1]}/mcp"
        import uvicorn

        app = self.server.streamable_http_app(host=_LOCALHOST)
        self._uvicorn = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(
            target=asyncio.run,
            args=(self._uvicorn.serve(sockets=[self._sock]),),
            name="bat-gym-mcp-agent",
            daemon=True,
        )
        self._thread.start()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        try:
            self.process = subprocess.Popen(
                policy.argv,
                env={**os.environ, **policy.env, MCP_URL_VARIABLE: self.url},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                start_new_session=True,
            )
        except OSError as exc:
            self.close()
            raise PolicyError(f"the agent command {policy.argv!r} could not start: {exc}") from exc

    # -- the server's side -----------------------------------------------------------

    def _tool(self, function: dict[str, Any]) -> Any:
        from mcp.server.mcpserver import Context
        from mcp.types import CallToolResult, TextContent

        from bat_gym.integrations.mcp_server import client_of, env_tool

        name = function["name"]

        async def handler(arguments: dict[str, Any], context: Context) -> CallToolResult:
            if self.client is None:
                self.client = client_of(context)
                if self.client is not None:
                    self.policy._saw(self.client)
            if self.ended is not None:
                text, error = f"[not run: the episode has ended: {self.ended}]", True
            else:
                call = _Call(name, dict(arguments))
                self.calls.put(call)
                text, error = await asyncio.wrap_future(call.reply), False
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)

        return env_tool(function, handler)

    # -- the harness's side ----------------------------------------------------------

    def answer(self, observation: str) -> None:
        """Give the pending call the env's observation of it."""
        if self.pending is not None and not self.pending.reply.done():
            self.pending.reply.set_result(observation)
        self.pending = None

    def next_call(self) -> _Call | None:
        """The agent's next call; None once the agent has exited with status 0.

        Raises:
            PolicyError: the agent exited non-zero or sent nothing for the turn timeout.
        """
        deadline = time.monotonic() + self.policy.turn_timeout_s
        while True:
            try:
                self.pending = self.calls.get(timeout=0.1)
                return self.pending
            except queue.Empty:
                pass
            status = self.process.poll()
            if status == 0 and self.calls.empty():
                return None
            if status is not None and status != 0:
                raise PolicyError(f"the agent exited with status {status}: {self.stderr_tail()}")
            if time.monotonic() > deadline:
                raise PolicyError(
                    f"the agent sent no tool call for {self.policy.turn_timeout_s:g} s: "
                    f"{self.stderr_tail()}"
                )

    def stderr_tail(self) -> str:
        """The end of what the agent wrote to stderr (or a note that it wrote nothing)."""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        text = self._stderr.read().decode("utf-8", "replace").strip()
        return text or "(nothing on stderr)"

    def end(self, reason: str, observation: str | None = None) -> None:
        """End the episode: answer what waits, let the agent leave, stop the server."""
        self.ended = reason
        tail = f"\n\n[the episode has ended: {reason}]"
        self.answer(f"{observation or ''}{tail}".strip())
        while not self.calls.empty():
            self.calls.get_nowait().reply.set_result(tail.strip())
        process = getattr(self, "process", None)
        if process is not None:
            try:
                process.wait(timeout=self.policy.exit_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, 15)
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, 9)
                    process.wait()
        self.close()

    def close(self) -> None:
        """Stop the server and release its socket and the stderr file."""
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.close()


class McpAgentPolicy(Policy):
    """An external agent, run once per episode, that plays through MCP tools.

    Args:
        command: the agent's command line (a string is split as a shell would, without
            running a shell); it reads its server's address from ``BAT_GYM_MCP_URL``.
        protocol: the env's tool protocol, that the agent's calls are written in.
        turn_timeout_s: the most seconds the agent may take to send its next call.
        exit_grace_s: seconds the agent has to exit after its episode ends.
        env: extra environment variables for the agent.
    """

    name = "mcp-agent"

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        protocol: str | ToolProtocol = "hermes",
        turn_timeout_s: float = 600.0,
        exit_grace_s: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ConfigError(
                "policy spec 'mcp-agent:' names no command: write mcp-agent:COMMAND, "
                "e.g. mcp-agent:'python my_agent.py'"
            )
        program = shutil.which(argv[0])
        if program is None:
            raise ConfigError(
                f"the agent command {argv[0]!r} is not an executable file or on PATH: give "
                "its path, e.g. mcp-agent:'python my_agent.py'"
            )
        if turn_timeout_s <= 0 or exit_grace_s < 0:
            raise ConfigError("turn_timeout_s must be > 0 and exit_grace_s >= 0")
        self.argv = argv
        self.program = program
        self.protocol = get_protocol(protocol)
        self.turn_timeout_s = turn_timeout_s
        self.exit_grace_s = exit_grace_s
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._sessions: dict[Any, _AgentSession] = {}
        self._clients: list[dict[str, Any]] = []

    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        """Each request's next agent call (requests of different episodes, one at a time)."""
        return [self._act(r) for r in requests]

    def _act(self, request: PolicyRequest) -> PolicyOutput:
        key = _episode_key(None if request.seed_key is None else request.seed_key[:-1])
        with self._lock:
            session = self._sessions.get(key)
        first = not any(m["role"] == "assistant" for m in request.messages)
        if first or session is None:
            if session is not None:
                session.end("another episode started")
            session = _AgentSession(self, request)
            with self._lock:
                self._sessions[key] = session
        else:
            session.answer(str(request.messages[-1].get("content") or ""))
        call = session.next_call()
        if call is None:  # the agent left without finishing
            return PolicyOutput(text="")
        return PolicyOutput(
            text=self.protocol.render("", [ToolCall(name=call.name, arguments=call.arguments)])
        )

    def end_episode(self, seed_key: Any, info: dict[str, Any] | None) -> None:
        """Answer the agent's last call, let it exit and stop its server."""
        key = _episode_key(seed_key)
        with self._lock:
            session = self._sessions.pop(key, None)
        if session is None:
            return
        if info is None:
            session.end("not played to its end")
            return
        last = info["messages"][-1] if info.get("messages") else {}
        observation = str(last.get("content") or "") if last.get("role") != "assistant" else ""
        session.end(info.get("stop_reason") or "stopped", observation)

    def identity(self) -> dict[str, Any]:
        """The command and the sha256 of the files it runs (the program, a script)."""
        out: dict[str, Any] = {"kind": type(self).__name__, "command": self.argv}
        # An interpreter runs a script: the script is what tells two agents apart.
        for arg in (self.program, *self.argv[1:]):
            path = Path(arg)
            if path.is_file():
                out.setdefault("sha256", {})[arg] = hashlib.sha256(path.read_bytes()).hexdigest()
        return out

    def observed(self) -> dict[str, Any]:
        """The MCP ``clientInfo`` (name, version) each connecting agent announced."""
        with self._lock:
            return {"clients": list(self._clients)} if self._clients else {}

    def close(self) -> None:
        """End every session still open (their agents are stopped)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.end("the policy was closed")

    def _saw(self, client: dict[str, Any]) -> None:
        with self._lock:
            if client not in self._clients:
                self._clients.append(client)


def _episode_key(seed_key: Any) -> Any:
    """The session of an episode: its seed key (a request's without the turn), else the thread.

    A thread plays one episode at a time, so without seed keys it names the episode.
    """
    return ("seed", tuple(seed_key)) if seed_key is not None else threading.get_ident()


def _build(argument: str, **options: Any) -> Policy:
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        raise ConfigError("the mcp-agent policy needs the mcp extra: pip install 'bat-gym[mcp]'")
    return McpAgentPolicy(argument, **options)


MCP_AGENT = PolicyKind(
    forms=("mcp-agent:COMMAND",),
    description="an external agent that plays through MCP tools (extra mcp)",
    build=_build,
    sampling=False,
)
