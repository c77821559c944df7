"""The execution record: every tool call of an episode, as evidence for the verifier.

Rubric checks read it to decide whether a pipeline really ran and exited 0, which call
wrote a file, and whether any call succeeded and changed the workspace (the reference
gate). Every fact here comes from the host, never from the agent:

* ``exit_code``, ``output``, ``digest_before``/``digest_after``: what the sandbox
  returned and the workspace scans around the call;
* ``writes``: the paths whose content, mode or existence differs between those scans
  (every backend);
* ``runs`` and ``reads``: what the sandbox observed (:class:`bat_gym.core.sandbox.base.
  Provenance`): each program executed, with argv and exit status, and each
  workspace file read. ``None`` where the backend could not observe it.

Calls of a benchmark's own tools (:mod:`bat_gym.core.tools`) are
:class:`ToolUseRecord` entries in :attr:`ExecutionRecord.tool_uses`: name, validated
arguments, status, duration, the result (capped) and its sha256. ``index`` counts every
tool call of the episode, built in or not, so ``calls`` and ``tool_uses`` interleave by
it and an evidence pointer ``call`` names one call. A sandbox tool's program is also an
entry of ``calls`` (with ``tool`` set, and the same index), so workspace accounting
stays whole.

A change no call accounts for (a byte that differs between one call's end and the
next call's start, or between the last call and the frozen workspace) is listed in
:attr:`ExecutionRecord.unattributed`; the verifier treats those paths as absent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.core.sandbox.base import ProgramRun

__all__ = ["ToolCallRecord", "ToolUseRecord", "ExecutionRecord", "ProgramRun"]


class ToolCallRecord(BaseModel):
    """One program run in the sandbox (an ``execute_code`` call) and what it did.

    ``digest_before`` is the workspace digest when the previous call returned (or at
    reset); ``digest_after`` when this one returned. Output is capped; ``output_bytes``
    counts everything the call wrote.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="Position among the episode's tool calls.")
    turn: int = Field(ge=0, description="Assistant turn the call was made in.")
    language: str
    code: str
    exit_code: int | None = Field(
        description="None when killed by the timeout or a sandbox restart."
    )
    duration_s: float = Field(ge=0)
    output: str
    output_bytes: int = Field(ge=0)
    timed_out: bool = False
    restarted: bool = False
    digest_before: str
    digest_after: str
    writes: list[str] | None = Field(
        None, description="Paths the call created, changed or deleted; None if unknown."
    )
    reads: list[str] | None = Field(
        None, description="Workspace files the call read; None where not observed."
    )
    runs: list[ProgramRun] | None = Field(
        None, description="Programs the call executed; None where not observed."
    )
    runs_dropped: int = Field(0, ge=0, description="Programs run past the record's cap.")
    tool: str | None = Field(
        None, description="The benchmark tool that ran this program; None for execute_code."
    )

    @property
    def succeeded(self) -> bool:
        """Ran to completion with exit code 0."""
        return self.exit_code == 0

    @property
    def changed_workspace(self) -> bool:
        """The workspace digest differs after the call."""
        return self.digest_before != self.digest_after


ToolStatus = Literal["ok", "error", "timed_out", "crashed", "not_run"]


class ToolUseRecord(BaseModel):
    """One call of a benchmark-defined tool and how it ended.

    ``status``: ``ok``; ``error`` (the handler refused the request, a
    :class:`~bat_gym.core.tools.ToolError`); ``timed_out``; ``crashed`` (the handler
    raised anything else; ``output`` holds only the exception type); ``not_run`` (a
    sandbox tool whose program was never started). A sandbox tool's outcome is its
    program's (``ok`` when it exited 0), and ``call`` points at that program's entry
    in :attr:`ExecutionRecord.calls`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="Position among the episode's tool calls.")
    turn: int = Field(ge=0, description="Assistant turn the call was made in.")
    name: str
    arguments: dict[str, Any] = Field(description="The validated arguments, as JSON.")
    status: ToolStatus
    duration_s: float = Field(ge=0, description="Wall-clock seconds of the call.")
    output: str = Field(description="The result text, capped at the record's output size.")
    output_chars: int = Field(ge=0, description="Characters of the whole result text.")
    result_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the whole result text (UTF-8)."
    )
    call: int | None = Field(
        None, ge=0, description="Index of the program run in ``calls`` (sandbox tools)."
    )

    @property
    def succeeded(self) -> bool:
        """The tool returned a result (status ``ok``)."""
        return self.status == "ok"


class ExecutionRecord(BaseModel):
    """All tool calls of one episode, in order."""

    model_config = ConfigDict(extra="forbid")

    start_digest: str = Field(description="Workspace digest at reset.")
    workspace_root: str = Field(
        "/workspace", description="Where agent code sees the workspace (paths in runs)."
    )
    calls: list[ToolCallRecord] = Field(default_factory=list)
    tool_uses: list[ToolUseRecord] = Field(
        default_factory=list, description="Calls of the benchmark's own tools, in order."
    )
    unattributed: list[str] = Field(
        default_factory=list,
        description="Paths changed outside every recorded call; the verifier voids them.",
    )

    def append(self, call: ToolCallRecord) -> None:
        """Add the next call."""
        self.calls.append(call)

    def append_tool_use(self, use: ToolUseRecord) -> None:
        """Add the next call of a benchmark tool."""
        self.tool_uses.append(use)

    def uses_of(self, name: str) -> list[ToolUseRecord]:
        """The calls of the benchmark tool ``name``, in order."""
        return [u for u in self.tool_uses if u.name == name]

    @property
    def any_success(self) -> bool:
        """At least one call exited 0."""
        return any(c.succeeded for c in self.calls)

    def add_unattributed(self, paths: list[str] | tuple[str, ...]) -> None:
        """Note paths that changed while no call ran."""
        self.unattributed = sorted({*self.unattributed, *paths})

    def writers(self, path: str) -> list[ToolCallRecord]:
        """Calls whose recorded writes include ``path`` (calls without a write record excluded)."""
        return [c for c in self.calls if c.writes is not None and path in c.writes]

    @property
    def any_change(self) -> bool:
        """At least one call changed the workspace."""
        return any(c.changed_workspace for c in self.calls)
