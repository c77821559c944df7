"""Benchmark-defined tools: typed arguments, a handler, and the limits of ``execute_code``.

A benchmark declares its own tools beside ``execute_code`` and ``finish``
(:meth:`bat_gym.benchmark.Benchmark.tools`). Each :class:`Tool` has a name, a
description, its arguments as a pydantic model (the JSON Schema in the prompt and in
``info["tools"]`` is that model's), and a handler:

* ``runs_in="host"``: ``handler(args, ctx)`` runs in the host process against the env's
  service (:attr:`ToolContext.service`) and returns the result: a ``str`` shown as
  it is, or anything JSON can hold (a pydantic model too), shown as JSON. It runs in a
  worker thread under the episode's ``tool_timeout_s``; a handler past it is left
  behind (a thread cannot be killed), the call reports a timeout, and the episode goes
  on. Handlers that wait on a server pass :attr:`ToolContext.remaining_s` as their own
  timeout so none is ever left behind.
* ``runs_in="sandbox"``: ``handler(args, ctx)`` returns a :class:`SandboxProgram`,
  which the env runs exactly as an ``execute_code`` call (same timeout, output cap,
  workspace accounting and provenance); its :class:`~bat_gym.record.ToolCallRecord`
  names the tool.

Either way the call counts against the tool-call budget, its result is clipped to
``max_observation_chars`` like any tool result, and it lands in the execution record
as a :class:`~bat_gym.record.ToolUseRecord` (arguments, status, duration, the result
and its sha256) that rubric checks use as evidence (the ``tool_called`` check).

Nothing the agent sends makes ``step`` raise: arguments the model refuses come back
as a ``[tool call error]`` naming the field and what it must be; a handler that raises
:class:`ToolError` (the agent asked for something that is not there) shows its
message; any other exception is logged with its traceback and the agent sees only
that the tool failed, never the exception's text (it may quote private data).

A handler sees the private answers only when its tool says ``sees_private=True``
(:meth:`ToolContext.private_answers`), as a submission tool that scores on the spot
would; the result it returns is what the agent sees, so such a tool decides what of
the answers to reveal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from bat_gym.errors import BatGymError, ConfigError

__all__ = [
    "RESERVED_NAMES",
    "SandboxProgram",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "PrivateAnswersWithheld",
    "check_tools",
    "run_host_tool",
]

log = logging.getLogger(__name__)

RESERVED_NAMES = frozenset({"execute_code", "finish"})
"""Names of the built-in tools, which no benchmark tool may take."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_MAX_ERROR_CHARS = 600  # of a validation error shown to the agent


class ToolError(BatGymError):
    """Raised by a handler for an error of the agent's making; the agent sees the message.

    Say what was wrong and what to ask instead ("no study 1.2.3; find_studies lists
    them"). Never put private data in it.
    """


class PrivateAnswersWithheld(BatGymError):
    """A handler asked for the private answers, but its tool does not declare ``sees_private``."""

    def __init__(self, tool: str) -> None:
        super().__init__(
            f"tool {tool!r} asked for the private answers; declare it with "
            "Tool(..., sees_private=True) if it must score against them"
        )


@dataclass(frozen=True)
class SandboxProgram:
    """What a sandbox tool's handler returns: the program the env runs for the call."""

    language: Literal["python", "bash"]
    code: str


@dataclass
class ToolContext:
    """What a handler may use besides its arguments.

    Attributes:
        tool: the tool's name.
        task: the episode's task (its public card and parameters), or None when the
            state names none.
        service: the env's service (:meth:`bat_gym.benchmark.Benchmark.make_service`),
            or None.
        timeout_s: the call's wall-clock limit, seconds.
        started: ``time.monotonic()`` when the call started.
    """

    tool: str
    task: Any
    service: Any
    timeout_s: float
    started: float = field(default_factory=time.monotonic)
    _private: Callable[[], dict[str, Any]] | None = None

    @property
    def remaining_s(self) -> float:
        """Seconds left before the call times out (never below 0)."""
        return max(0.0, self.timeout_s - (time.monotonic() - self.started))

    def private_answers(self) -> dict[str, Any]:
        """The task's private answers, for a tool declared with ``sees_private=True``.

        Raises:
            PrivateAnswersWithheld: the tool does not declare it.
        """
        if self._private is None:
            raise PrivateAnswersWithheld(self.tool)
        return self._private()


@dataclass(frozen=True)
class Tool:
    """One benchmark-defined tool.

    Args:
        name: what the agent calls it (letters, digits, ``_``, ``-``; at most 64).
        description: what it does, for the prompt and the schema.
        arguments: a pydantic model of its arguments; declare it with
            ``ConfigDict(extra="forbid")`` so a misspelt argument is refused.
        handler: ``handler(args, ctx) -> result`` (host) or ``-> SandboxProgram`` (sandbox).
        runs_in: ``"host"`` or ``"sandbox"`` (see the module docs).
        sees_private: whether the handler may read the private answers.

    Raises:
        ConfigError: a bad name, a reserved name, or arguments that are not a model.
    """

    name: str
    description: str
    arguments: type[BaseModel]
    handler: Callable[[Any, ToolContext], Any]
    runs_in: Literal["host", "sandbox"] = "host"
    sees_private: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(
                f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-', "
                "starting with a letter or '_'"
            )
        if self.name in RESERVED_NAMES:
            raise ConfigError(f"tool name {self.name!r} is built in; name the tool otherwise")
        if not (isinstance(self.arguments, type) and issubclass(self.arguments, BaseModel)):
            raise ConfigError(
                f"tool {self.name!r}: arguments must be a pydantic model class, "
                f"got {self.arguments!r}"
            )
        if self.runs_in not in ("host", "sandbox"):
            raise ConfigError(
                f"tool {self.name!r}: runs_in must be 'host' or 'sandbox', got {self.runs_in!r}"
            )
        if not callable(self.handler):
            raise ConfigError(f"tool {self.name!r}: handler must be callable")

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function schema; ``parameters`` is the model's JSON Schema."""
        params = self.arguments.model_json_schema()
        params.pop("title", None)
        params.setdefault("properties", {})
        if self.arguments.model_config.get("extra") == "forbid":
            params["additionalProperties"] = False
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": params,
            },
        }

    def parse(self, arguments: dict[str, Any]) -> BaseModel | str:
        """The arguments as the model, or a sentence saying what is wrong with them."""
        try:
            return self.arguments.model_validate(arguments)
        except ValidationError as exc:
            problems = []
            for err in exc.errors(include_url=False, include_input=False, include_context=False):
                where = ".".join(str(p) for p in err["loc"]) or "arguments"
                problems.append(f"{where}: {err['msg']}")
            text = "; ".join(problems)
            if len(text) > _MAX_ERROR_CHARS:
                text = text[: _MAX_ERROR_CHARS - 3] + "..."
            props = ", ".join(sorted(self.arguments.model_fields)) or "no arguments"
            return f"{self.name}: invalid arguments ({text}). It takes {props}."
        except Exception as exc:  # a validator of the benchmark's raised something else
            log.exception("validating arguments of tool %s", self.name)
            return f"{self.name}: the arguments could not be checked ({type(exc).__name__})."


def check_tools(tools: Any) -> tuple[Tool, ...]:
    """``tools`` as a tuple of :class:`Tool` with distinct names.

    Raises:
        ConfigError: an item is not a Tool, or two share a name.
    """
    out = tuple(tools or ())
    seen: set[str] = set()
    for t in out:
        if not isinstance(t, Tool):
            raise ConfigError(f"a benchmark's tools must be bat_gym.tools.Tool, got {t!r}")
        if t.name in seen:
            raise ConfigError(f"two benchmark tools are called {t.name!r}; names must differ")
        seen.add(t.name)
    return out


@dataclass(frozen=True)
class ToolOutcome:
    """How a host tool call ended.

    Attributes:
        status: ``ok``, ``error`` (a :class:`ToolError`), ``timed_out`` or ``crashed``.
        text: the full result text (before any clipping).
        duration_s: wall-clock seconds until the result (or the timeout).
    """

    status: Literal["ok", "error", "timed_out", "crashed"]
    text: str
    duration_s: float

    @property
    def sha256(self) -> str:
        """The sha256 of the full result text (UTF-8)."""
        return hashlib.sha256(self.text.encode("utf-8", "replace")).hexdigest()


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    # allow_nan=False: a NaN is not JSON, and the agent's parser would refuse it.
    return json.dumps(_finite(result), ensure_ascii=False, allow_nan=False, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run_host_tool(tool: Tool, args: BaseModel, ctx: ToolContext) -> ToolOutcome:
    """Run a host tool's handler under ``ctx.timeout_s``; never raises.

    The handler runs in a daemon thread: past the timeout it is abandoned, and a
    warning is logged.
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["text"] = _as_text(tool.handler(args, ctx))
        except ToolError as exc:
            box["error"] = str(exc)
        except BaseException as exc:  # noqa: BLE001 - nothing a handler does may escape
            log.error("tool %s failed", tool.name, exc_info=exc)
            box["crash"] = type(exc).__name__

    thread = threading.Thread(target=work, name=f"bat-gym-tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(ctx.timeout_s)
    duration = time.monotonic() - ctx.started
    if thread.is_alive():
        log.warning(
            "tool %s passed its %.1f s timeout and was left running", tool.name, ctx.timeout_s
        )
        return ToolOutcome("timed_out", "", duration)
    if "text" in box:
        return ToolOutcome("ok", box["text"], duration)
    if "error" in box:
        return ToolOutcome("error", box["error"], duration)
    # A crash: the exception's text may hold private data, so only its type is shown.
    return ToolOutcome("crashed", box.get("crash", "unknown"), duration)
