"""One Stage Bank state's episode, served to any MCP client (``bat-gym serve mcp``).

An agent that speaks the Model Context Protocol (Claude Code, Codex, OpenHands, an
Inspect or Harbor agent) plays a stage env through its own tool loop: the server lists
the env's tools (``execute_code``, ``finish`` and the benchmark's own, with the env's
JSON Schemas) and answers each ``tools/call`` by stepping the real
:class:`~bat_gym.env.StageEnv`, wrapped in
:class:`~bat_gym.rubrics.verifier.reward.RubricReward`:

* one MCP call is one env step whose action is that single call written in the env's
  protocol (:meth:`ToolProtocol.render <bat_gym.core.protocol.ToolProtocol.render>`), so the
  env parses, checks, budgets, runs and records it exactly as it does an in-process
  policy's turn, and the execution record is the same;
* a call the env refuses (unknown tool, bad arguments) comes back as an MCP tool error
  carrying the env's ``[tool call error]`` sentence; the episode goes on, as in-process;
* the step that ends the episode (``finish``, or a budget: turns, tool calls) is scored
  by the rubric, and its result ends with the reward and the verdict's one-line
  :meth:`~bat_gym.rubrics.verifier.verdict.Verdict.summary`; later calls are refused with the
  same line.

The state's prompt (its messages as the env's reset observation renders them) is the
server's ``instructions`` and the MCP prompt ``task``.

One server plays one episode; every env operation runs on one worker thread, in the
order the calls arrive, so the sandbox has one caller as in-process. Streamable HTTP is
bound to 127.0.0.1 only: the sandbox runs whatever code a caller sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import CallToolResult, TextContent
from pydantic import ConfigDict

from bat_gym.core.errors import ConfigError
from bat_gym.core.files import write_atomic
from bat_gym.core.protocol import ToolCall
from bat_gym.evaluation.episodes import EPISODES_DIR, write_episode
from bat_gym.rubrics.verifier.reward import RubricReward

if TYPE_CHECKING:
    from bat_gym.rubrics.verifier.verdict import Verdict

__all__ = [
    "LOCALHOST",
    "McpEpisode",
    "ToolReply",
    "build_server",
    "client_of",
    "env_tool",
    "serve",
]

LOCALHOST = "127.0.0.1"
"""The only address streamable HTTP binds: a caller runs code in the sandbox."""


@dataclass(frozen=True)
class ToolReply:
    """What one MCP tool call returns.

    Attributes:
        text: the env's observation for the call (plus, on the last step, the reward
            and the verdict's summary).
        is_error: the env refused the call, or the episode had already ended.
        ended: the episode is over (this call or an earlier one ended it).
    """

    text: str
    is_error: bool
    ended: bool


class McpEpisode:
    """One episode of a rubric-scored StageEnv, stepped one tool call at a time.

    Args:
        env: a :class:`~bat_gym.rubrics.verifier.reward.RubricReward` around a
            :class:`~bat_gym.env.StageEnv` (``gym.make("bat/E2E-v0", ...)`` gives one).
        state_id: the Stage Bank state the episode starts from.
        out: where to keep the episode when it ends: its trace in the evaluation's
            format (``OUT/episodes/<state_id>.json``, :mod:`bat_gym.evaluation.episodes`)
            and ``OUT/agent.json`` (the MCP client's name and version, the state, the
            reward); None keeps nothing.

    Attributes:
        prompt: the state's prompt, as the env's reset observation renders it.
        tools: the env's tools as OpenAI function schemas (``info["tools"]``).
        info: the env's info after the last step (or the reset).
        reward: the episode's reward once it ended, else None.
        verdict: the rubric's verdict once the episode ended, else None.
        agent: the first calling client's ``clientInfo`` (``name``, ``version``), if known.
    """

    def __init__(
        self, env: gym.Env[str, str], state_id: str, *, out: str | Path | None = None
    ) -> None:
        if not _has_rubric(env):
            raise ConfigError(
                f"McpEpisode scores with the rubric: give a RubricReward-wrapped StageEnv "
                f"(gym.make('bat/E2E-v0', ...)), got {type(env).__name__}"
            )
        self.env = env
        self.state_id = state_id
        self.out = None if out is None else Path(out)
        self.agent: dict[str, Any] | None = None
        # One thread owns the env: calls run one at a time, in arrival order.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bat-gym-mcp")
        try:
            self.prompt, self.info = self._worker.submit(
                env.reset, options={"state_id": state_id}
            ).result()
        except BaseException:  # an unknown state, a sandbox that will not start
            self.close()
            raise
        self.tools: tuple[dict[str, Any], ...] = tuple(self.info["tools"])
        self.reward: float | None = None
        self.verdict: Verdict | None = None

    @property
    def ended(self) -> bool:
        """Whether the episode is over (``finish`` was called or a budget ran out)."""
        return self.info["stop_reason"] is not None

    def call(self, name: str, arguments: dict[str, Any] | None) -> ToolReply:
        """Run one tool call as one env step (blocking); see the module docstring."""
        return self._worker.submit(self._step, name, dict(arguments or {})).result()

    async def acall(self, name: str, arguments: dict[str, Any] | None) -> ToolReply:
        """:meth:`call`, awaited without blocking the server's event loop."""
        future = self._worker.submit(self._step, name, dict(arguments or {}))
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Close the env (its sandbox and service) and stop the worker thread."""
        self._worker.submit(self.env.close).result()
        self._worker.shutdown()

    def ending(self) -> str:
        """The line that closes the episode: why it ended, the reward, the verdict."""
        if self.verdict is None:
            return "[the episode is still running]"
        return (
            f"[episode ended: {self.info['stop_reason']}; reward {self.reward:.3f}]\n"
            f"{self.verdict.summary()}"
        )

    def _step(self, name: str, arguments: dict[str, Any]) -> ToolReply:
        if self.ended:
            return ToolReply(f"[not run: the episode has ended]\n{self.ending()}", True, True)
        protocol = self.env.unwrapped.protocol  # type: ignore[attr-defined]
        action = protocol.render("", [ToolCall(name=name, arguments=arguments)])
        obs, reward, terminated, truncated, self.info = self.env.step(action)
        refused = bool(self.info["tool_errors"])
        if not (terminated or truncated):
            return ToolReply(obs, refused, False)
        self.reward, self.verdict = float(reward), self.info["verdict"]
        if self.out is not None:
            self._keep(self.out)
        return ToolReply(f"{obs}\n\n{self.ending()}", refused, True)

    def _keep(self, out: Path) -> None:
        """Write the ended episode's trace and who played it (the env still holds its files)."""
        out.mkdir(parents=True, exist_ok=True)
        write_episode(out, self.state_id, self.info, self.env)
        played = {
            "agent": self.agent,
            "state_id": self.state_id,
            "benchmark": self.info["benchmark"],
            "stop_reason": self.info["stop_reason"],
            "reward": self.reward,
            "trace": f"{EPISODES_DIR}/{self.state_id}.json",
        }
        write_atomic(out / "agent.json", json.dumps(played, indent=2))


def _has_rubric(env: gym.Env[str, str]) -> bool:
    while env is not None and not isinstance(env, RubricReward):
        env = getattr(env, "env", None)  # type: ignore[assignment]
    return env is not None


def build_server(episode: McpEpisode) -> MCPServer:
    """An MCP server (the SDK's ``MCPServer``, formerly FastMCP) playing ``episode``.

    Its tools are the env's, each with the env's own JSON Schema; its instructions and
    its prompt ``task`` are the state's prompt.
    """
    server = MCPServer(
        name="bat-gym",
        title=f"bat-gym state {episode.state_id}",
        instructions=_instructions(episode),
        # The SDK sets up the root logger; at INFO it would echo bat_gym's own notes.
        log_level="WARNING",
        tools=[_tool(episode, schema["function"]) for schema in episode.tools],
    )

    @server.prompt(name="task", description="The state's prompt: what the agent is asked to do.")
    def task() -> str:
        return episode.prompt

    return server


def _instructions(episode: McpEpisode) -> str:
    return (
        f"You are playing the bat-gym state {episode.state_id}. Call the tools this server "
        "lists; each call is one turn of the episode. Call finish when the work is done: its "
        "result gives the reward and the verdict. The prompt below shows how a text policy "
        "writes a call; over MCP, call the tools directly.\n\n" + episode.prompt
    )


class _RawArguments(ArgModelBase):
    """A call's arguments as the client sent them, handed to the tool as ``arguments``."""

    model_config = ConfigDict(extra="allow")

    def model_dump_one_level(self) -> dict[str, Any]:  # noqa: D102
        return {"arguments": dict(self.model_extra or {})}


def env_tool(function: dict[str, Any], handler: Callable[..., Awaitable[CallToolResult]]) -> Tool:
    """The SDK tool for one env tool: the env's schema, every call forwarded as it came.

    The SDK's own argument model would check the call before the env does; this one
    passes the arguments through untouched (``handler(arguments, context)``), so the
    env alone decides (and records) what is refused, as it does in-process.

    Args:
        function: the tool's OpenAI function schema (``info["tools"][i]["function"]``).
        handler: answers one call: ``await handler(arguments: dict, context: Context)``.
    """
    return Tool(
        fn=handler,
        name=function["name"],
        description=function.get("description", ""),
        parameters=function["parameters"],
        fn_metadata=FuncMetadata(arg_model=_RawArguments),
        is_async=True,
        context_kwarg="context",
    )


def client_of(context: Context) -> dict[str, Any] | None:
    """The calling client's ``clientInfo`` (``name``, ``version``), if it sent one."""
    params = context.session.client_params
    return None if params is None else params.client_info.model_dump(include={"name", "version"})


def _tool(episode: McpEpisode, function: dict[str, Any]) -> Tool:
    """The SDK tool that plays one env tool's calls in ``episode``."""
    name = function["name"]

    async def handler(arguments: dict[str, Any], context: Context) -> CallToolResult:
        if episode.agent is None:
            episode.agent = client_of(context)
        reply = await episode.acall(name, arguments)
        return CallToolResult(
            content=[TextContent(type="text", text=reply.text)],
            is_error=reply.is_error,
            structured_content={
                "ended": reply.ended,
                "stop_reason": episode.info["stop_reason"],
                "reward": episode.reward,
            },
        )

    return env_tool(function, handler)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Keep stdout clean while the episode is set up: on stdio it is the protocol's channel."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def serve(
    env: gym.Env[str, str],
    state_id: str,
    *,
    http_port: int | None = None,
    out: str | Path | None = None,
) -> McpEpisode:
    """Serve one episode of ``env`` from ``state_id`` until the client or the process stops.

    Without ``http_port`` the server speaks stdio and runs until the client disconnects;
    with it, streamable HTTP at ``http://127.0.0.1:<http_port>/mcp`` until the process is
    stopped. ``out``: as for :class:`McpEpisode`.

    Returns:
        The episode, closed; its ``reward`` and ``verdict`` are set if it ended.
    """
    if http_port is not None and not 0 < http_port < 65536:
        raise ConfigError(f"http_port must be a TCP port, 1 to 65535, got {http_port}")
    with _stdout_to_stderr():
        episode = McpEpisode(env, state_id, out=out)
        server = build_server(episode)
    try:
        if http_port is None:
            server.run("stdio")
        else:
            server.run("streamable-http", host=LOCALHOST, port=http_port)
    finally:
        episode.close()
    return episode
