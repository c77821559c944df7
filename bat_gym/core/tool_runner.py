"""ToolRunner: runs one episode's tool calls and keeps its execution record.

:class:`~bat_gym.env.StageEnv` decides which calls of a message run (the protocol,
the argument checks, ``finish`` and the budgets); the runner runs each one: an
``execute_code`` call or a sandbox tool's program in the sandbox, a host tool's handler
on the host. It appends what happened to the episode's
:class:`~bat_gym.core.record.ExecutionRecord` (the verifier's evidence), notes workspace
changes no call made, and returns the text the agent sees: a status line and clipped
output, never a wall-clock time (see :func:`format_result`).

A workspace the host will not take (past its quota, or holding what the host must not
follow or store) sets :attr:`ToolRunner.rejection`: the env ends the episode there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial
from typing import Any

from bat_gym.core.errors import WorkspaceRejected
from bat_gym.core.record import ExecutionRecord, ToolCallRecord, ToolUseRecord
from bat_gym.core.sandbox import ExecResult, Sandbox, SandboxLimits
from bat_gym.core.sandbox.snapshot import Snapshot, changed_paths
from bat_gym.core.spec import Budgets
from bat_gym.core.tools import SandboxProgram, Tool, ToolContext, run_host_tool

__all__ = ["ToolRunner", "format_result"]


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


class ToolRunner:
    """Runs the tool calls of one episode, from the workspace ``start``, and records them.

    Args:
        sandbox: the episode's sandbox, restored to ``start``.
        start: the workspace snapshot the episode starts from.
        budgets: the episode's limits (tool timeout, observation size).
        tools: the benchmark's own tools, by name; any other call is ``execute_code``.
        context: what a benchmark tool's handler gets for a call of it.

    Attributes:
        record: the execution record: every call, in order.
        calls: tool calls run (or refused by the host) so far; the next call's index.
        turn: the 0-based turn the next calls belong to (the env sets it per step).
        rejection: why the workspace was refused, if it was; the episode ends there.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        start: Snapshot,
        budgets: Budgets,
        tools: dict[str, Tool],
        context: Callable[[Tool], ToolContext],
    ) -> None:
        self.sandbox: Sandbox | None = sandbox
        self.budgets = budgets
        self.tools = tools
        self._context = context
        self.record = ExecutionRecord(
            start_digest=start.digest, workspace_root=sandbox.agent_workspace
        )
        self.calls = 0
        self.turn = 0
        self.rejection: WorkspaceRejected | None = None
        self._last_scan: Snapshot = start  # the workspace as the last call left it

    def run(self, name: str, args: Any) -> str:
        """Run one checked call of the tool ``name``; return what the agent sees."""
        if name in self.tools:
            return self._use_tool(self.tools[name], args)
        return self._execute(args["language"], args["code"])

    def close(self) -> None:
        """Let go of the sandbox (the env closes it); the record stays readable."""
        self.sandbox = None

    def _use_tool(self, tool: Tool, args: Any) -> str:
        """Run one call of a benchmark tool; record it; return what the agent sees."""
        index, ctx = self.calls, self._context(tool)
        if tool.runs_in == "sandbox":
            return self._use_sandbox_tool(tool, args, ctx)
        outcome = run_host_tool(tool, args, ctx)
        self.calls += 1
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
        index = self.calls
        # Building the program is the benchmark's code: a fault there is a crash of the
        # tool, never an exception out of step.
        builder = Tool(tool.name, tool.description, tool.arguments, partial(_program, tool))
        built = run_host_tool(builder, args, ctx)
        if built.status != "ok":
            self.calls += 1
            self._record_use(tool, args, index, "not_run", built.duration_s, "")
            why = (
                built.text if built.status == "error" else "the tool failed with an internal error"
            )
            return f"[{tool.name}: not run: {why}]"
        program = json.loads(built.text)
        before = len(self.record.calls)
        text = self._execute(program["language"], program["code"], tool=tool.name)
        if len(self.record.calls) == before:  # refused before it started
            self.calls += 1
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
        cap = SandboxLimits().record_output_bytes
        self.record.append_tool_use(
            ToolUseRecord(
                index=index,
                turn=self.turn,
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
        """Run ``code`` in the sandbox (for the sandbox tool ``tool``, if given); record it.

        Returns what the agent sees; a refused workspace before or after the run sets
        :attr:`rejection` and says so in the text.
        """
        assert self.sandbox is not None, "the runner was closed"
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
                index=self.calls,
                turn=self.turn,
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
        self.calls += 1
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
        paths = changed_paths(self._last_scan, now) if self._last_scan is not None else ()
        if paths:
            self.record.add_unattributed(paths)
        return paths


def _program(tool: Tool, args: Any, ctx: ToolContext) -> dict[str, str]:
    """A sandbox tool's program, checked, as JSON-ready data."""
    program = tool.handler(args, ctx)
    if not isinstance(program, SandboxProgram) or program.language not in ("python", "bash"):
        raise TypeError(
            f"sandbox tool {tool.name!r} returned {type(program).__name__}, "
            "not a SandboxProgram('python' | 'bash', code)"
        )
    return {"language": program.language, "code": str(program.code)}
