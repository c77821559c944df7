"""StageEnv: one Stage Bank state as a Gymnasium environment.

Observation and action are text. ``reset`` restores the state's workspace snapshot in a
sandbox and returns the prompt; ``step`` takes the assistant's whole message, runs the
tool calls it holds, and returns their results. The full conversation (OpenAI chat
format), the tool schemas and the execution record ride in ``info``, so chat-template
users need no re-parsing.

* ``terminated``: the policy called ``finish``.
* ``truncated``: a budget ran out (turns, tool calls, response tokens), or the
  workspace was refused (:attr:`StageEnv.rejection`).

Besides ``execute_code`` and ``finish``, the benchmark may declare tools of its own
(:meth:`Benchmark.tools <bat_gym.benchmark.Benchmark.tools>`, :mod:`bat_gym.tools`):
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
from functools import partial
from typing import Any, SupportsFloat

import gymnasium as gym

from bat_gym.benchmark import Benchmark
from bat_gym.completion import Completion
from bat_gym.errors import (
    ConfigError,
    EnvNotCopyable,
    NotAnAction,
    ResetNeeded,
    StateNotAdmitted,
    StateVersionMismatch,
    WorkspaceRejected,
)
from bat_gym.protocol import TOOLS, ToolCall, ToolProtocol, clean_text, get_protocol, validate_call
from bat_gym.record import ExecutionRecord, ToolCallRecord, ToolUseRecord
from bat_gym.sandbox import ExecResult, Sandbox, SandboxLimits, make_sandbox
from bat_gym.sandbox.snapshot import Snapshot, changed_paths
from bat_gym.spec import Budgets, StageState
from bat_gym.textspace import UnicodeText
from bat_gym.tools import SandboxProgram, Tool, ToolContext, check_tools, run_host_tool

__all__ = ["StageEnv", "Completion", "format_result"]

MAX_TEXT = 1_000_000
_RESET_OPTIONS = ("state_id", "track")


def _clip(text: str, limit: int) -> str:
    """Keep the head and the tail of ``text`` within ``limit`` characters."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters cut ...]\n"
    room = max(0, limit - len(marker.format(len(text))))
    head, tail = room // 2, room - room // 2
    return text[:head] + marker.format(len(text) - head - tail) + (text[-tail:] if tail else "")


def format_result(res: ExecResult, limit: int, timeout_s: float | None = None) -> str:
    """The tool result as the agent sees it: a status line, then clipped output.

    The status names no wall-clock time (the record keeps ``duration_s``): the same
    call from the same state reads the same whatever the host's load, so replayed
    states, bank rows built twice and seeded rollouts agree token for token. A timeout
    names the limit it hit, ``timeout_s``, when given.
    """
    if res.restarted:
        status = "[the sandbox crashed and was restarted; nothing was reported for this call]"
    elif res.timed_out:
        at = f" at the {timeout_s:g} s limit" if timeout_s is not None else ""
        status = f"[timed out{at}; every process was killed]"
    else:
        status = f"[exit code {res.exit_code}]"
    # Long output arrives with its head and tail kept and the cut marked by the sandbox.
    return _clip(f"{status}\n{res.output}".rstrip("\n"), limit)


class StageEnv(gym.Env[str, str]):
    """One stage of a staged benchmark, as an environment.

    Args:
        stage: ``"E2E"``, a stage id (``"S3"``) or name (``"Validate"``): the focus
            whose states ``reset`` samples when no ``state_id`` is given.
        benchmark: a registered benchmark name or instance; default is the installed
            default benchmark.
        track: only sample states of this track.
        backend: sandbox backend, a name in :data:`bat_gym.sandbox.BACKENDS`.
        protocol: how tool calls are written: a name in :data:`bat_gym.protocol.PROTOCOLS`
            (or a :class:`~bat_gym.protocol.ToolProtocol`).
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
        self.record: ExecutionRecord | None = None
        self._last_scan: Snapshot | None = None
        self.rejection: WorkspaceRejected | None = None
        """Why the workspace was refused mid-episode, if it was; the episode ended there."""
        self._done = True
        self._task: Any = None
        self.service: Any = None
        """The benchmark's service for this env (:meth:`Benchmark.make_service`), or None."""
        self.turns = self.tool_calls = self.response_tokens = 0

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
        from bat_gym.service import restore_service

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
        self.record = ExecutionRecord(
            start_digest=snapshot.digest, workspace_root=sandbox.agent_workspace
        )
        self._last_scan = snapshot  # the workspace as the last call (none yet) left it
        self._task = None  # regenerated when a benchmark tool first asks for it
        self.rejection = None
        self.turns = self.tool_calls = self.response_tokens = 0
        self._done = False
        return self._render_messages(self.messages), self._info()

    def _draw(self, ids: list[str]) -> StageState | None:
        """The first admitted state of ``ids`` in an order drawn from ``np_random``; None if none.

        Each id is ranked by a hash of it keyed with one seeded draw, not by its place
        in the list, so skipping a row that turns out not to be admitted
        (:class:`~bat_gym.errors.StateNotAdmitted`, from a source that builds lazily)
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
        if self._done or self.state is None or self.record is None:
            raise ResetNeeded("call reset() before step(), and again after an episode ends")
        if not isinstance(action, str):
            raise NotAnAction(
                f"the action is the assistant's message as a str, got {type(action).__name__}"
            )
        self.turns += 1
        self.response_tokens += self._count_tokens(action)
        action = clean_text(action)  # a lone surrogate reaches no process, file or log
        parsed = self.protocol.parse(action)
        error = parsed.error
        arguments: list[Any] = []
        if error is None:
            for c in parsed.calls:
                checked = self._check_call(c)
                if isinstance(checked, str):
                    error = checked
                    break
                arguments.append(checked)
        new: list[dict[str, Any]] = []
        terminated = truncated = False
        if error is not None:
            self.messages.append({"role": "assistant", "content": action})
            new.append({"role": "user", "content": f"[tool call error] {error}"})
        else:
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
            for call, args in zip(calls, arguments, strict=True):
                if call.name == "finish":
                    terminated = True
                    new.append(self._tool_message(call, "Finished."))
                    break
                if self.tool_calls >= self.budgets.max_tool_calls:
                    truncated = True
                    new.append(self._tool_message(call, "[not run: the tool-call budget is spent]"))
                    break
                if call.name in self.tools:
                    content = self._use_tool(self.tools[call.name], args)
                else:
                    content = self._execute(call.arguments["language"], call.arguments["code"])
                new.append(self._tool_message(call, content))
                if self.rejection is not None:
                    truncated = True
                    break
        if not terminated and (
            self.turns >= self.budgets.max_turns
            or self.response_tokens >= self.budgets.max_response_tokens
        ):
            truncated = True
        self.messages.extend(new)
        self._done = terminated or truncated
        obs = "\n\n".join(m["content"] for m in new)
        return obs, 0.0, terminated, truncated, self._info()

    def render(self) -> str | None:
        """The transcript so far as text (``render_mode="ansi"``)."""
        if self.render_mode == "ansi":
            return self._render_messages(self.messages)
        return None

    def close(self) -> None:
        """Release the sandbox and the service."""
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

    # -- helpers ------------------------------------------------------------------------

    def _count_tokens(self, action: str) -> int:
        n = getattr(action, "num_tokens", None)
        if n is not None:
            return int(n)
        return self.token_counter(action) if self.token_counter is not None else 0

    def _check_call(self, call: ToolCall) -> Any:
        """A call's arguments (the model, for a benchmark tool), or what is wrong with it."""
        tool = self.tools.get(call.name)
        if tool is None:
            return validate_call(call, self.tool_schemas) or call.arguments
        return tool.parse(call.arguments)

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

    def _use_tool(self, tool: Tool, args: Any) -> str:
        """Run one call of a benchmark tool; record it; return what the agent sees."""
        assert self.record is not None
        index, ctx = self.tool_calls, self._tool_context(tool)
        if tool.runs_in == "sandbox":
            return self._use_sandbox_tool(tool, args, ctx)
        outcome = run_host_tool(tool, args, ctx)
        self.tool_calls += 1
        # No wall-clock time in what the agent sees (see format_result); the record has it.
        if outcome.status == "ok":
            status = f"[{tool.name}: ok]"
        elif outcome.status == "error":
            status = f"[{tool.name}: error]"
        elif outcome.status == "timed_out":
            status = f"[{tool.name}: timed out at the {ctx.timeout_s:g} s limit]"
        else:
            status = (
                f"[{tool.name}: the tool failed with an internal error ({outcome.text}); "
                "this is not your call's fault, and its details are in the host's log]"
            )
        shown = "" if outcome.status == "crashed" else outcome.text
        if outcome.chars is not None and outcome.chars > len(outcome.text):
            status += (
                f"\n[the result has {outcome.chars} characters; "
                f"its first {len(outcome.text)} came back]"
            )
        self._record_use(
            tool,
            args,
            index,
            outcome.status,
            outcome.duration_s,
            outcome.text,
            chars=outcome.chars,
            sha256=outcome.sha256,
        )
        return _clip(f"{status}\n{shown}".rstrip("\n"), self.budgets.max_observation_chars)

    def _use_sandbox_tool(self, tool: Tool, args: Any, ctx: ToolContext) -> str:
        assert self.record is not None
        index = self.tool_calls
        # Building the program is the benchmark's code: a fault there is a crash of the
        # tool, never an exception out of step.
        builder = Tool(tool.name, tool.description, tool.arguments, partial(_program, tool))
        built = run_host_tool(builder, args, ctx)
        if built.status != "ok":
            self.tool_calls += 1
            self._record_use(tool, args, index, "not_run", built.duration_s, "")
            why = (
                built.text if built.status == "error" else "the tool failed with an internal error"
            )
            return f"[{tool.name}: not run: {why}]"
        program = json.loads(built.text)
        before = len(self.record.calls)
        text = self._execute(program["language"], program["code"], tool=tool.name)
        if len(self.record.calls) == before:  # refused before it started
            self.tool_calls += 1
            self._record_use(tool, args, index, "not_run", built.duration_s, "")
            return text
        run = self.record.calls[-1]
        status = "ok" if run.succeeded else ("timed_out" if run.timed_out else "error")
        self._record_use(
            tool, args, index, status, built.duration_s + run.duration_s, run.output, call=run.index
        )
        return text

    def _record_use(
        self,
        tool: Tool,
        args: Any,
        index: int,
        status: str,
        duration_s: float,
        text: str,
        call: int | None = None,
        *,
        chars: int | None = None,
        sha256: str | None = None,
    ) -> None:
        # chars and sha256: of the whole result when ``text`` is only its head.
        assert self.record is not None
        cap = SandboxLimits().record_output_bytes
        self.record.append_tool_use(
            ToolUseRecord(
                index=index,
                turn=self.turns - 1,
                name=tool.name,
                arguments=args.model_dump(mode="json"),
                status=status,  # type: ignore[arg-type]
                duration_s=max(0.0, duration_s),
                output=text[:cap],
                output_chars=len(text) if chars is None else chars,
                result_sha256=sha256 or hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
                call=call,
            )
        )

    def _execute(self, language: str, code: str, *, tool: str | None = None) -> str:
        assert self.sandbox is not None and self.record is not None
        try:
            before = self.sandbox.scan()
        except WorkspaceRejected as exc:  # changed since the last call returned
            self.rejection = exc
            return f"[not run: {exc}. Failure category: {exc.category}]"
        self.note_unattributed(before)
        res = self.sandbox.execute_code(language, code, timeout_s=self.budgets.tool_timeout_s)  # type: ignore[arg-type]
        try:
            after: Snapshot | None = self.sandbox.scan()
        except WorkspaceRejected as exc:
            # The call left a workspace the host will not take: the episode ends here.
            self.rejection = exc
            after = None
        if after is not None:
            self._last_scan = after
        prov = res.provenance
        self.record.append(
            ToolCallRecord(
                index=self.tool_calls,
                turn=self.turns - 1,
                language=language,
                code=code,
                exit_code=res.exit_code,
                duration_s=res.duration_s,
                output=res.output,
                output_bytes=res.output_bytes,
                timed_out=res.timed_out,
                restarted=res.restarted,
                digest_before=before.digest,
                digest_after="" if after is None else after.digest,
                writes=None if after is None else list(changed_paths(before, after)),
                reads=None if prov.reads is None else list(prov.reads),
                runs=None if prov.runs is None else list(prov.runs),
                runs_dropped=prov.runs_dropped,
                tool=tool,
            )
        )
        self.tool_calls += 1
        text = format_result(
            res, self.budgets.max_observation_chars, timeout_s=self.budgets.tool_timeout_s
        )
        if self.rejection is not None:
            text += (
                f"\n[the episode ends here: {self.rejection}. "
                f"Failure category: {self.rejection.category}]"
            )
        return text

    def note_unattributed(self, now: Snapshot) -> tuple[str, ...]:
        """Record the paths that differ between ``now`` and the last call's end.

        Nothing but a tool call may change the workspace during an episode; a path
        changed between calls (or before the freeze) was changed by something that
        outlived its call, and the verifier will not credit it.
        """
        assert self.record is not None
        paths = changed_paths(self._last_scan, now) if self._last_scan is not None else ()
        if paths:
            self.record.add_unattributed(paths)
        return paths

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
            "isolation": self.sandbox.isolation.value if self.sandbox else None,
            # How the sandbox's memory and tasks are capped: "v1"/"v2" cgroups, "none"
            # (uncapped, by opt-in), or "container" (the engine's own limits).
            "caps": None if self.sandbox is None else _caps(self.sandbox),
        }


def _program(tool: Tool, args: Any, ctx: ToolContext) -> dict[str, str]:
    """A sandbox tool's program, checked, as JSON-ready data."""
    program = tool.handler(args, ctx)
    if not isinstance(program, SandboxProgram) or program.language not in ("python", "bash"):
        raise TypeError(
            f"sandbox tool {tool.name!r} returned {type(program).__name__}, "
            "not a SandboxProgram('python' | 'bash', code)"
        )
    return {"language": program.language, "code": str(program.code)}


def _caps(sandbox: Sandbox) -> str:
    caps = getattr(sandbox, "caps", None)
    return str(caps.value) if caps is not None else "container"
