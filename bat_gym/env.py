"""StageEnv: one Stage Bank state as a Gymnasium environment.

Observation and action are text. ``reset`` restores the state's workspace snapshot in a
sandbox and returns the prompt; ``step`` takes the assistant's whole message, runs the
tool calls it holds, and returns their results. The full conversation (OpenAI chat
format), the tool schemas and the execution record ride in ``info``, so chat-template
users need no re-parsing.

* ``terminated``: the policy called ``finish``.
* ``truncated``: a budget ran out (turns, tool calls, response tokens), or the
  workspace was refused (:attr:`StageEnv.rejection`).
* ``info["stop_reason"]``: which of these ended the episode (:data:`StopReason`), None
  while it runs. Read it rather than the observation text.
* ``info["tool_errors"]``: the calls of this step the env refused to run, each a
  :class:`ToolError` (place in the message, tool, kind, message); empty when the
  step's calls ran. A refused turn runs nothing; its observation stays the
  ``[tool call error] ...`` sentence the policy reads. ``info["refused_turns"]``
  counts the episode's refused turns so far.

Besides ``execute_code`` and ``finish``, the benchmark may declare tools of its own
(:meth:`Benchmark.tools <bat_gym.benchmark.Benchmark.tools>`, :mod:`bat_gym.core.tools`):
their schemas join ``info["tools"]``, their calls are checked against their argument
models, count against the same tool-call budget, and land in the execution record.

Nothing a message or agent code does makes ``step`` raise. A workspace the host cannot
take as the agent left it (past its quota, or holding what the host must not follow
or store) ends the episode at once; :attr:`StageEnv.rejection` holds why, and the
rubric wrapper scores it as a zero with that failure category.

The reward is always 0 here; the rubric verifier is a reward wrapper on top.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Literal, SupportsFloat, TypedDict

import gymnasium as gym

from bat_gym.benchmark import Benchmark
from bat_gym.core.completion import Completion
from bat_gym.core.errors import (
    ConfigError,
    EnvNotCopyable,
    NotAnAction,
    ResetNeeded,
    StateNotAdmitted,
    StateVersionMismatch,
    WorkspaceRejected,
)
from bat_gym.core.protocol import (
    TOOLS,
    ParsedMessage,
    ToolProtocol,
    clean_text,
    get_protocol,
    validate_call,
)
from bat_gym.core.record import ExecutionRecord
from bat_gym.core.sandbox import Sandbox, SandboxLimits, make_sandbox
from bat_gym.core.sandbox.snapshot import Snapshot
from bat_gym.core.spec import Budgets, StageState
from bat_gym.core.textspace import UnicodeText
from bat_gym.core.tool_runner import ToolRunner
from bat_gym.core.tools import Tool, ToolContext, check_tools

__all__ = [
    "STOP_REASONS",
    "Completion",
    "StageEnv",
    "StopReason",
    "ToolError",
    "ToolErrorKind",
]

StopReason = Literal[
    "finished", "turn_budget", "tool_call_budget", "token_budget", "workspace_rejected"
]
"""Why an episode ended (``info["stop_reason"]``); None while it runs.

``finished``: the policy called ``finish`` (``terminated``). The rest truncate:
``turn_budget``, ``tool_call_budget`` (a call found the budget spent),
``token_budget`` (response tokens), ``workspace_rejected`` (:attr:`StageEnv.rejection`).
When a turn spends the token and the turn budget at once, ``token_budget`` is named.
"""
STOP_REASONS: tuple[StopReason, ...] = StopReason.__args__  # type: ignore[attr-defined]

ToolErrorKind = Literal["malformed", "unknown_tool", "invalid_arguments"]
"""``malformed``: no call could be read (no call, bad JSON); ``unknown_tool``: a call
names no tool of the env; ``invalid_arguments``: a call's arguments fail its schema."""


class ToolError(TypedDict):
    """A call the env refused to run (one item of ``info["tool_errors"]``).

    Attributes:
        call: the call's 0-based place in the message; None for ``malformed``.
        tool: the tool the call names; None for ``malformed``.
        kind: what is wrong, a :data:`ToolErrorKind`.
        message: the sentence the policy read after ``[tool call error]``.
    """

    call: int | None
    tool: str | None
    kind: ToolErrorKind
    message: str


MAX_TEXT = 1_000_000
_RESET_OPTIONS = ("state_id", "track")


class StageEnv(gym.Env[str, str]):
    """One stage of a staged benchmark, as an environment.

    Args:
        stage: ``"E2E"``, a stage id (``"S3"``) or name (``"Validate"``): the focus
            whose states ``reset`` samples when no ``state_id`` is given.
        benchmark: a registered benchmark name or instance; default is the installed
            default benchmark.
        track: only sample states of this track.
        backend: sandbox backend, a name in :data:`bat_gym.core.sandbox.BACKENDS`.
        protocol: how tool calls are written: a name in :data:`bat_gym.core.protocol.PROTOCOLS`
            (or a :class:`~bat_gym.core.protocol.ToolProtocol`).
        budgets: per-episode limits (default: the benchmark's).
        states: where states come from: a :class:`~bat_gym.bank.StateSource`, or a bank
            directory; default: the benchmark's default states (its default grid, each
            teacher trajectory built on first use and cached). Resolved through
            :func:`bat_gym.catalog.state_source` on first use.
        sandbox_options: keyword arguments for the sandbox constructor.
        token_counter: counts the tokens of a plain-``str`` action for the token budget.
        render_mode: ``"ansi"`` returns the transcript from ``render()``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        stage: str = "E2E",
        *,
        benchmark: str | Benchmark | None = None,
        track: str | None = None,
        backend: str = "local",
        protocol: str | ToolProtocol = "hermes",
        budgets: Budgets | None = None,
        states: Any = None,
        sandbox_options: dict[str, Any] | None = None,
        token_counter: Callable[[str], int] | None = None,
        render_mode: str | None = None,
    ) -> None:
        from bat_gym.catalog import get_benchmark

        self.benchmark = benchmark if isinstance(benchmark, Benchmark) else get_benchmark(benchmark)
        spec = self.benchmark.spec
        self.focus = spec.focus(stage)
        self.track = spec.track(track).name if track is not None else None
        self.backend = backend
        self.protocol = get_protocol(protocol)
        self.tools: dict[str, Tool] = {t.name: t for t in check_tools(self.benchmark.tools())}
        """The benchmark's own tools, by name."""
        self.tool_schemas: tuple[dict[str, Any], ...] = (
            *TOOLS,
            *(t.schema() for t in self.tools.values()),
        )
        """Every tool the agent may call, as OpenAI function schemas (``info["tools"]``)."""
        self.budgets = budgets or spec.budgets
        self._states_arg = states
        self._states: Any = None
        self.sandbox_options = dict(sandbox_options or {})
        self.token_counter = token_counter
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.observation_space = UnicodeText(MAX_TEXT)
        self.action_space = UnicodeText(MAX_TEXT)
        self.sandbox: Sandbox | None = None
        self.state: StageState | None = None
        self.messages: list[dict[str, Any]] = []
        self.runner: ToolRunner | None = None
        """Runs this episode's tool calls and keeps its execution record."""
        self._done = True
        self._task: Any = None
        self.service: Any = None
        """The benchmark's service for this env (:meth:`Benchmark.make_service`), or None."""
        self.turns = self.response_tokens = 0
        self.tool_errors: list[ToolError] = []
        """The calls of the last step the env refused to run."""
        self.refused_turns = 0
        self.stop_reason: StopReason | None = None
        """Why the episode ended; None while it runs."""

    # -- state source and sandbox -------------------------------------------------------

    @property
    def states(self) -> Any:
        """The state source, resolved from ``states=`` on first use (see :mod:`bat_gym.catalog`)."""
        if self._states is None:
            from bat_gym.catalog import state_source

            self._states = state_source(self._states_arg, self.benchmark)
        return self._states

    def _sandbox(self) -> Sandbox:
        if self.sandbox is None:
            opts = {
                "limits": SandboxLimits(timeout_s=self.budgets.tool_timeout_s),
                # The backend refuses to start (SandboxUnavailable) when it cannot provide them.
                "requirements": self.benchmark.sandbox_requirements(),
                **self.sandbox_options,
            }
            self.sandbox = make_sandbox(self.backend, store=self.states.store, **opts)
        return self.sandbox

    def _restore_service(self, state: StageState) -> None:
        """Make the benchmark's service (started on first use) hold ``state``'s service state."""
        from bat_gym.core.service import restore_service

        if self.service is None:
            self.service = self.benchmark.make_service()
        if self.service is not None:
            restore_service(self.service, self.states.store, state.service)

    # -- Gymnasium API ------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Restore a state's workspace and return its prompt.

        Options:
            state_id: start from exactly this state (any focus), e.g. for a GRPO group.
            track: sample only among this track's states for this reset.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = sorted(set(options) - set(_RESET_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown reset option(s) {unknown}; allowed: {list(_RESET_OPTIONS)}")
        if options.get("state_id") is not None:
            state = self.states.get(options["state_id"])
        else:
            track = options.get("track", self.track)
            ids = self.states.select(focus=self.focus, track=track)
            state = self._draw(ids) if ids else None
            if state is None:
                raise ConfigError(
                    f"no admitted {self.benchmark.name} states with focus {self.focus!r} "
                    f"and track {track!r}; give states that hold that track (a bank built "
                    "with it), or another track"
                )
        spec = self.benchmark.spec
        if (state.benchmark, state.benchmark_version) != (spec.name, spec.version):
            raise StateVersionMismatch(
                state.state_id,
                f"{state.benchmark} {state.benchmark_version}",
                f"{spec.name} {spec.version}",
            )
        snapshot = self.states.store.get_snapshot(state.snapshot)
        sandbox = self._sandbox()
        sandbox.restore(snapshot)
        self._restore_service(state)
        self.state = state
        self.messages = [dict(m) for m in state.messages]
        self.runner = ToolRunner(sandbox, snapshot, self.budgets, self.tools, self._tool_context)
        self._task = None  # regenerated when a benchmark tool first asks for it
        self.turns = self.response_tokens = self.refused_turns = 0
        self.tool_errors, self.stop_reason = [], None
        self._done = False
        return self._render_messages(self.messages), self._info()

    def _draw(self, ids: list[str]) -> StageState | None:
        """The first admitted state of ``ids`` in an order drawn from ``np_random``; None if none.

        Each id is ranked by a hash of it keyed with one seeded draw, not by its place
        in the list, so skipping a row that turns out not to be admitted
        (:class:`~bat_gym.core.errors.StateNotAdmitted`, from a source that builds lazily)
        walks on to the pick an eagerly built list of only the admitted rows gives.
        """
        salt = int(self.np_random.integers(2**63)).to_bytes(8, "little")

        def rank(state_id: str) -> bytes:
            return hashlib.blake2b(state_id.encode(), digest_size=8, key=salt).digest()

        for state_id in sorted(ids, key=rank):
            try:
                return self.states.get(state_id)
            except StateNotAdmitted:
                continue
        return None

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Run the tool calls in the assistant message ``action``."""
        if self._done or self.state is None or self.runner is None:
            raise ResetNeeded("call reset() before step(), and again after an episode ends")
        if not isinstance(action, str):
            raise NotAnAction(
                f"the action is the assistant's message as a str, got {type(action).__name__}"
            )
        self.turns += 1
        self.runner.turn = self.turns - 1
        self.response_tokens += self._count_tokens(action)
        action = clean_text(action)  # a lone surrogate reaches no process, file or log
        parsed = self.protocol.parse(action)
        arguments, errors = self._check_calls(parsed)
        new: list[dict[str, Any]] = []
        stop: StopReason | None = None
        if errors:
            self.messages.append({"role": "assistant", "content": action})
            new.append({"role": "user", "content": f"[tool call error] {errors[0]['message']}"})
        else:
            new, stop = self._run_calls(parsed, arguments)
        if stop is None:
            if self.response_tokens >= self.budgets.max_response_tokens:
                stop = "token_budget"
            elif self.turns >= self.budgets.max_turns:
                stop = "turn_budget"
        self.tool_errors, self.stop_reason = errors, stop
        self.refused_turns += bool(errors)
        self.messages.extend(new)
        self._done = stop is not None
        terminated = stop == "finished"
        obs = "\n\n".join(m["content"] for m in new)
        return obs, 0.0, terminated, self._done and not terminated, self._info()

    def _check_calls(self, parsed: ParsedMessage) -> tuple[list[Any], list[ToolError]]:
        """Each call's arguments (the model, for a benchmark tool), and what is wrong.

        Checking stops at the first wrong call (the turn is refused whole), so the error
        list holds at most one error; it is a list so that a protocol may report more.
        """
        if parsed.error is not None:
            return [], [ToolError(call=None, tool=None, kind="malformed", message=parsed.error)]
        arguments: list[Any] = []
        for i, call in enumerate(parsed.calls):
            tool = self.tools.get(call.name)
            checked = (
                tool.parse(call.arguments)
                if tool is not None
                else validate_call(call, self.tool_schemas) or call.arguments
            )
            if isinstance(checked, str):
                known = tool is not None or any(
                    t["function"]["name"] == call.name for t in self.tool_schemas
                )
                kind: ToolErrorKind = "invalid_arguments" if known else "unknown_tool"
                return [], [ToolError(call=i, tool=call.name, kind=kind, message=checked)]
            arguments.append(checked)
        return arguments, []

    def _run_calls(
        self, parsed: ParsedMessage, arguments: list[Any]
    ) -> tuple[list[dict[str, Any]], StopReason | None]:
        """Run an accepted message's calls in order.

        Returns their tool messages, and why the episode stopped if a call stopped it
        (``finish``, the tool-call budget, a refused workspace).
        """
        calls = [
            c.model_copy(update={"id": f"call_{self.tool_calls + i}"})
            for i, c in enumerate(parsed.calls)
        ]
        self.messages.append(
            {
                "role": "assistant",
                "content": parsed.content,
                "tool_calls": [c.to_openai() for c in calls],
            }
        )
        new: list[dict[str, Any]] = []
        for call, args in zip(calls, arguments, strict=True):
            if call.name == "finish":
                new.append(self._tool_message(call, "Finished."))
                return new, "finished"
            if self.tool_calls >= self.budgets.max_tool_calls:
                new.append(self._tool_message(call, "[not run: the tool-call budget is spent]"))
                return new, "tool_call_budget"
            new.append(self._tool_message(call, self.runner.run(call.name, args)))
            if self.rejection is not None:
                return new, "workspace_rejected"
        return new, None

    def render(self) -> str | None:
        """The transcript so far as text (``render_mode="ansi"``)."""
        if self.render_mode == "ansi":
            return self._render_messages(self.messages)
        return None

    def close(self) -> None:
        """Release the sandbox and the service."""
        if self.runner is not None:
            self.runner.close()
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        if self.service is not None:
            self.service.close()
            self.service = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (and deep-copy) an env that holds no sandbox: before reset, after close.

        Raises:
            EnvNotCopyable: the env holds a running sandbox.
        """
        if self.sandbox is not None or self.service is not None:
            raise EnvNotCopyable(self.spec.id if self.spec is not None else "StageEnv")
        return self.__dict__.copy()

    # -- the episode's record, kept by its tool runner ---------------------------------

    @property
    def record(self) -> ExecutionRecord | None:
        """The execution record of the episode (None before the first reset)."""
        return None if self.runner is None else self.runner.record

    @property
    def rejection(self) -> WorkspaceRejected | None:
        """Why the workspace was refused mid-episode, if it was; the episode ended there."""
        return None if self.runner is None else self.runner.rejection

    @property
    def tool_calls(self) -> int:
        """Tool calls spent in the episode (they count against ``max_tool_calls``)."""
        return 0 if self.runner is None else self.runner.calls

    # -- helpers ------------------------------------------------------------------------

    def _count_tokens(self, action: str) -> int:
        n = getattr(action, "num_tokens", None)
        if n is not None:
            return int(n)
        return self.token_counter(action) if self.token_counter is not None else 0

    def _tool_context(self, tool: Tool) -> ToolContext:
        assert self.state is not None
        if self._task is None:
            self._task = self.benchmark.task_of_state(self.state)
        task = self._task
        private = None
        if tool.sees_private and task is not None:
            bench = self.benchmark

            def private() -> dict[str, Any]:
                return bench.private_answers(task)

        return ToolContext(
            tool=tool.name,
            task=task,
            service=self.service,
            timeout_s=self.budgets.tool_timeout_s,
            _private=private,
        )

    def note_unattributed(self, now: Snapshot) -> tuple[str, ...]:
        """Record the paths that differ between ``now`` and the last call's end.

        See :meth:`ToolRunner.note_unattributed <bat_gym.core.tool_runner.ToolRunner.note_unattributed>`.
        """
        assert self.runner is not None
        return self.runner.note_unattributed(now)

    @staticmethod
    def _tool_message(call: Any, content: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}

    @staticmethod
    def _render_messages(messages: list[dict[str, Any]]) -> str:
        parts = []
        for m in messages:
            text = m.get("content") or ""
            for c in m.get("tool_calls") or []:
                text += f"\n<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': json.loads(c['function']['arguments'])}, ensure_ascii=False)}</tool_call>"
            parts.append(f"[{m['role']}]\n{text.strip()}")
        return "\n\n".join(parts)

    def _info(self) -> dict[str, Any]:
        assert self.state is not None
        spec = self.benchmark.spec
        focus = self.state.focus
        return {
            "messages": list(self.messages),
            "tools": list(self.tool_schemas),
            "record": self.record,
            "state_id": self.state.state_id,
            "stage": focus,
            "stage_name": focus if focus == "E2E" else spec.stage(focus).name,
            "track": self.state.track,
            "benchmark": spec.name,
            "contract": self.state.contract,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "response_tokens": self.response_tokens,
            "tool_errors": [dict(e) for e in self.tool_errors],
            "refused_turns": self.refused_turns,
            "stop_reason": self.stop_reason,
            "isolation": self.sandbox.isolation.value if self.sandbox else None,
            # How the sandbox's memory and tasks are capped: "v1"/"v2" cgroups, "none"
            # (uncapped, by opt-in), or "container" (the engine's own limits).
            "caps": None if self.sandbox is None else _caps(self.sandbox),
        }


def _caps(sandbox: Sandbox) -> str:
    caps = getattr(sandbox, "caps", None)
    return str(caps.value) if caps is not None else "container"
