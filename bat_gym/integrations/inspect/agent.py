"""The env's tools as Inspect tools, and the solver that plays a stage env with them.

Each tool the env offers (``execute_code``, ``finish`` and the benchmark's own, from
``info["tools"]`` with the env's JSON Schemas) becomes an Inspect tool whose call is
one step of the sample's :class:`~bat_gym.integrations.inspect.episode.StageEpisode`.
A call the env refuses raises Inspect's ``ToolError`` carrying the env's
``[tool call error]`` sentence, so the model reads it as in-process; the episode goes
on. The step that ends the episode returns the observation, the reward and the
verdict's one-line summary.

:func:`play_stage` is the solver: Inspect's own ``generate`` asks the model and runs
the tool calls of its reply (``tool_calls="single"``), once per turn, until the
episode ends. A reply without a native tool call is stepped into the env as the
assistant's text (a call written in the prompt's text protocol runs; prose is a
refused turn), and the env's answer is the next user message, as a text policy's
turn is in-process. The env's budgets end the episode; Inspect's sample limits, if
set lower, end it first (the scorer then scores it as it stands).
"""

from __future__ import annotations

from typing import Any

from inspect_ai.model import ChatMessageUser
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import Tool, ToolDef, ToolError, ToolParams
from inspect_ai.util import sandbox

from bat_gym.integrations.inspect.episode import StageEpisode
from bat_gym.integrations.inspect.sandbox import StageSandbox

__all__ = ["episode_of_sample", "play_stage", "stage_tools"]


def episode_of_sample() -> StageEpisode:
    """The current sample's episode (its ``bat_gym`` sandbox's)."""
    return sandbox().as_type(StageSandbox).episode


def stage_tools(episode: StageEpisode) -> list[Tool]:
    """The env's tools (``info["tools"]``, OpenAI function schemas) as Inspect tools."""
    return [_tool(episode, schema["function"]) for schema in episode.info["tools"]]


def _tool(episode: StageEpisode, function: dict[str, Any]) -> Tool:
    name = function["name"]

    async def execute(**arguments: Any) -> str:
        # Inspect has checked the arguments against the schema; the env checks them
        # again (its own models) and alone decides what runs and what is recorded.
        reply = await episode.call(name, arguments)
        if reply.refused:
            raise ToolError(reply.text)
        return reply.text

    return ToolDef(
        execute,
        name=name,
        description=function.get("description", ""),
        parameters=_params(function["parameters"]),
        # One env, one step at a time, in the order the model wrote the calls.
        parallel=False,
        # The env caps what a call returns (its record's output size); the model sees
        # exactly what an in-process policy would.
        max_output=0,
    ).as_tool()


def _params(schema: dict[str, Any]) -> ToolParams:
    """The env's JSON Schema as Inspect's ``ToolParams``, every property described.

    Inspect refuses a parameter without a description; the env's schemas leave the
    self-evident ones (``language``: ``python`` or ``bash``) without. Those get one
    from their name and allowed values; nothing else of the schema changes.
    """
    properties = {}
    for name, prop in (schema.get("properties") or {}).items():
        prop = dict(prop)
        if not prop.get("description"):
            allowed = prop.get("enum")
            prop["description"] = name.replace("_", " ") + (
                f": one of {', '.join(map(str, allowed))}" if allowed else ""
            )
        properties[name] = prop
    return ToolParams.model_validate({**schema, "properties": properties})


@solver
def play_stage(name_state: bool = False) -> Solver:
    """Play the sample's stage env to its end with the env's tools (see the module).

    Args:
        name_state: send the episode's start state id as each request's ``user``
            field, for an endpoint that replays a script per state (``bat-gym
            serve-policy``: every E2E task of a track opens alike, so its teacher needs
            the id). A model needs no such hint; leave it off for one.
    """

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        episode = episode_of_sample()
        state.tools = stage_tools(episode)
        # Inspect drops an extra_body "metadata" (OpenAI wants it only with store=true);
        # "user" is the request field every OpenAI-compatible server accepts.
        named = {"extra_body": {"user": episode.state_id}} if name_state else {}
        while not episode.ended:
            state = await generate(state, tool_calls="single", **named)
            if state.output.message.tool_calls or episode.ended:
                continue
            reply = await episode.message(state.output.message.text)
            state.messages.append(ChatMessageUser(content=reply.text))
        state.completed = True
        return state

    return solve
