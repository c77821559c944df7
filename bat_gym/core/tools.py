"""Benchmark-defined tools: typed arguments, a handler, and the limits of ``execute_code``.

A benchmark declares its own tools beside ``execute_code`` and ``finish``
(:meth:`bat_gym.benchmark.Benchmark.tools`). Each :class:`Tool` has a name, a
description, its arguments as a pydantic model (the JSON Schema in the prompt and in
``info["tools"]`` is that model's), and a handler:

* ``runs_in="host"``: ``handler(args, ctx)`` runs against the env's service
  (:attr:`ToolContext.service`) and returns the result: a ``str`` shown as it is, or
  anything JSON can hold (a pydantic model too), shown as JSON. It runs in a child
  process forked for the call, in its own process group, under the episode's
  ``tool_timeout_s``: past it the child and everything it started are killed
  (``SIGKILL``), the call reports ``timed_out``, and the env goes on as before, so a
  handler that hangs costs one timeout and nothing after it. The child sees the env's
  objects as they were at the call and its changes to them are lost: what a handler
  changes must live outside the process (a server, files), and the service hears of
  every call through :meth:`~bat_gym.core.service.ServiceState.after_tool_call`. A service
  whose state lives in its Python object says so (``IN_PROCESS = True``); its handlers
  run in a thread of the env's process instead, where a handler past its timeout is
  left running (a thread cannot be killed). Only the first :data:`MAX_RESULT_CHARS`
  characters of a result come back; its length and sha256 are measured in full. The
  fork costs about 10 ms a call in a gym process (it grows with the process's memory,
  to a few tens of ms at a few GiB), against a handler's own requests.
* ``runs_in="sandbox"``: ``handler(args, ctx)`` returns a :class:`SandboxProgram`,
  which the env runs exactly as an ``execute_code`` call (same timeout, output cap,
  workspace accounting and provenance); its :class:`~bat_gym.core.record.ToolCallRecord`
  names the tool.

Either way the call counts against the tool-call budget, its result is clipped to
``max_observation_chars`` like any tool result, and it lands in the execution record
as a :class:`~bat_gym.core.record.ToolUseRecord` (arguments, status, duration, the result
and its sha256) that rubric checks use as evidence (the ``tool_called`` check).

Nothing the agent sends makes ``step`` raise: arguments the model refuses come back
as a ``[tool call error]`` naming the field and what it must be; a handler that raises
:class:`ToolError` (the agent asked for something that is not there) shows its
message; any other exception (or a worker that dies) is logged with its traceback in
the host's log and the agent sees only that the tool failed, never the exception's text
(it may quote private data).

A handler sees the private answers only when its tool says ``sees_private=True``
(:meth:`ToolContext.private_answers`), as a submission tool that scores on the spot
would; the result it returns is what the agent sees, so such a tool decides what of
the answers to reveal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import select
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from bat_gym.core.errors import BatGymError, ConfigError

__all__ = [
    "RESERVED_NAMES",
    "SandboxProgram",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "PrivateAnswersWithheld",
    "MAX_RESULT_CHARS",
    "check_tools",
    "isolates_handlers",
    "run_host_tool",
]

log = logging.getLogger(__name__)

RESERVED_NAMES = frozenset({"execute_code", "finish"})
"""Names of the built-in tools, which no benchmark tool may take."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_MAX_ERROR_CHARS = 600  # of a validation error shown to the agent
_MAX_TRACEBACK_CHARS = 20_000  # of a crash's traceback sent to the host's log
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

MAX_RESULT_CHARS = 65_536
"""Characters of a host tool's result that reach the env by default: what the execution
record keeps of a call's output (:attr:`bat_gym.core.sandbox.SandboxLimits.record_output_bytes`).
The whole result's length and sha256 are measured before the cut."""


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
            raise ConfigError(f"a benchmark's tools must be bat_gym.core.tools.Tool, got {t!r}")
        if t.name in seen:
            raise ConfigError(f"two benchmark tools are called {t.name!r}; names must differ")
        seen.add(t.name)
    return out


@dataclass(frozen=True)
class ToolOutcome:
    """How a host tool call ended.

    Attributes:
        status: ``ok``, ``error`` (a :class:`ToolError`), ``timed_out`` or ``crashed``.
        text: the result text, at most the runner's ``max_result_chars`` of it (for a
            crash: the exception's type only).
        duration_s: wall-clock seconds until the result (or the timeout).
        chars: characters of the whole result text (default: ``len(text)``).
        sha256: the sha256 of the whole result text, UTF-8 (default: of ``text``).
    """

    status: Literal["ok", "error", "timed_out", "crashed"]
    text: str
    duration_s: float
    chars: int | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.chars is None:
            object.__setattr__(self, "chars", len(self.text))
        if self.sha256 is None:
            object.__setattr__(self, "sha256", _digest(self.text))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


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


def _call(tool: Tool, args: BaseModel, ctx: ToolContext) -> tuple[str, str, str]:
    """``(status, text, traceback)`` of one handler call; never raises."""
    try:
        return "ok", _as_text(tool.handler(args, ctx)), ""
    except ToolError as exc:
        return "error", str(exc), ""
    except BaseException as exc:  # noqa: BLE001 - nothing a handler does may escape
        # The exception's text may hold private data: only its type reaches the agent.
        return "crashed", type(exc).__name__, traceback.format_exc()[-_MAX_TRACEBACK_CHARS:]


def isolates_handlers(service: Any) -> bool:
    """Whether host handlers against ``service`` run in a child process (see the module docs).

    They do unless the service keeps its state in this process's memory
    (:attr:`bat_gym.core.service.ServiceState.IN_PROCESS`) or the platform cannot fork.
    """
    return hasattr(os, "fork") and not getattr(service, "IN_PROCESS", False)


def run_host_tool(
    tool: Tool,
    args: BaseModel,
    ctx: ToolContext,
    *,
    max_result_chars: int = MAX_RESULT_CHARS,
) -> ToolOutcome:
    """Run a host tool's handler under ``ctx.timeout_s``; never raises.

    The handler runs in a child process forked for the call (killed, with anything it
    started, at the timeout) unless :func:`isolates_handlers` says otherwise; then in
    a daemon thread that is abandoned at the timeout. Afterwards the service's
    :meth:`~bat_gym.core.service.ServiceState.after_tool_call` hook runs (in this process).

    Args:
        tool: the tool.
        args: its validated arguments.
        ctx: the call's context; ``ctx.timeout_s`` bounds the call, seconds.
        max_result_chars: characters of the result that come back (the whole result's
            length and sha256 are measured where it was made).
    """
    isolated = isolates_handlers(ctx.service)
    try:
        if isolated:
            outcome = _run_forked(tool, args, ctx, max_result_chars)
        else:
            outcome = _run_in_thread(tool, args, ctx, max_result_chars)
    finally:
        hook = getattr(ctx.service, "after_tool_call", None)
        if isolated and callable(hook):
            try:
                hook()
            except Exception:  # noqa: BLE001 - a hook's fault must not end the episode
                log.exception("the service's after_tool_call hook failed")
    return outcome


def _clipped(status: str, text: str, duration: float, cap: int) -> ToolOutcome:
    return ToolOutcome(status, text[:cap], duration, len(text), _digest(text))  # type: ignore[arg-type]


def _run_in_thread(tool: Tool, args: BaseModel, ctx: ToolContext, cap: int) -> ToolOutcome:
    box: list[tuple[str, str, str]] = []
    thread = threading.Thread(
        target=lambda: box.append(_call(tool, args, ctx)),
        name=f"bat-gym-tool-{tool.name}",
        daemon=True,
    )
    thread.start()
    thread.join(ctx.timeout_s)
    duration = time.monotonic() - ctx.started
    if not box:
        log.warning(
            "tool %s passed its %.1f s timeout and was left running (its service keeps "
            "state in this process, so the handler could not run in a child process)",
            tool.name,
            ctx.timeout_s,
        )
        return ToolOutcome("timed_out", "", duration)
    status, text, trace = box[0]
    if trace:
        log.error("tool %s failed:\n%s", tool.name, trace)
    return _clipped(status, text, duration, cap)


def _die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux; best effort)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(tool: Tool, args: BaseModel, ctx: ToolContext, fd: int, cap: int, parent: int) -> None:
    """The forked child: run the handler, send one frame on ``fd``, exit. Never returns."""
    code = 0
    try:
        with contextlib.suppress(OSError):  # the parent may have made the group already
            os.setpgid(0, 0)  # its own group: the parent kills whatever it started with it
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before the request took hold
            os._exit(1)
        status, text, trace = _call(tool, args, ctx)
        head = {"status": status, "chars": len(text), "sha256": _digest(text), "trace": trace}
        frame = json.dumps(head).encode() + b"\n" + text[:cap].encode("utf-8", "surrogatepass")
        view = memoryview(frame)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:  # noqa: BLE001 - the parent reports a frame that never came
        code = 1
    finally:
        os._exit(code)  # no atexit, no finalizers of the parent's objects


def _run_forked(tool: Tool, args: BaseModel, ctx: ToolContext, cap: int) -> ToolOutcome:
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns on fork in a threaded process; the child only runs the
            # handler and exits, and a handler stuck on an inherited lock times out.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        log.error("tool %s: could not fork its worker (%s)", tool.name, exc)
        return ToolOutcome("crashed", type(exc).__name__, time.monotonic() - ctx.started)
    if pid == 0:
        os.close(read_fd)
        _child(tool, args, ctx, write_fd, cap, parent)
    os.close(write_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so the group exists whoever runs first
    try:
        # A frame: a JSON head (with at most the traceback's characters, escaped), then
        # at most ``cap`` characters of UTF-8.
        data, finished = _read(
            read_fd, ctx.started + ctx.timeout_s, 4 * cap + 6 * _MAX_TRACEBACK_CHARS + 4096
        )
    finally:
        os.close(read_fd)
        _reap(pid)
    duration = time.monotonic() - ctx.started
    if not finished:
        log.warning(
            "tool %s passed its %.1f s timeout; its worker was killed", tool.name, ctx.timeout_s
        )
        return ToolOutcome("timed_out", "", duration)
    head_bytes, _, body = data.partition(b"\n")
    try:
        head = json.loads(head_bytes)
        status, chars, sha = str(head["status"]), int(head["chars"]), str(head["sha256"])
    except (ValueError, KeyError, TypeError):
        # The worker died before it could answer (a signal, os._exit in the handler).
        log.error("tool %s: its worker exited without a result", tool.name)
        return ToolOutcome("crashed", "WorkerDied", duration)
    if head.get("trace"):
        log.error("tool %s failed:\n%s", tool.name, head["trace"])
    text = body.decode("utf-8", "surrogatepass")
    if status not in ("ok", "error", "crashed"):
        return ToolOutcome("crashed", "WorkerDied", duration)
    return ToolOutcome(status, text, duration, chars, sha)  # type: ignore[arg-type]


def _read(fd: int, deadline: float, limit: int) -> tuple[bytes, bool]:
    """Read ``fd`` to EOF or ``deadline`` (monotonic s), keeping at most ``limit`` bytes.

    Returns the bytes and whether EOF came in time.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    chunks: list[bytes] = []
    kept = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), False
        try:
            ready = poller.poll(max(1, int(left * 1000)))
        except InterruptedError:
            continue
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), True
        if kept < limit:
            chunks.append(chunk[: limit - kept])
            kept += len(chunks[-1])


def _reap(pid: int) -> None:
    """Kill the worker's group (it may have started processes) and collect the worker."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
            break
        except (ProcessLookupError, PermissionError):
            continue
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
