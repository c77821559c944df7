"""The execution record: every tool call of an episode, as evidence for the verifier.

Rubric checks read it to decide whether a command that mentions an artifact really ran
and exited 0, whether a file was written by a tool call rather than present from the
start, and whether any call succeeded and changed the workspace (the reference gate).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ToolCallRecord", "ExecutionRecord"]


class ToolCallRecord(BaseModel):
    """One ``execute_code`` call and what it did.

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

    @property
    def succeeded(self) -> bool:
        """Ran to completion with exit code 0."""
        return self.exit_code == 0

    @property
    def changed_workspace(self) -> bool:
        """The workspace digest differs after the call."""
        return self.digest_before != self.digest_after


class ExecutionRecord(BaseModel):
    """All tool calls of one episode, in order."""

    model_config = ConfigDict(extra="forbid")

    start_digest: str = Field(description="Workspace digest at reset.")
    calls: list[ToolCallRecord] = Field(default_factory=list)

    def append(self, call: ToolCallRecord) -> None:
        """Add the next call."""
        self.calls.append(call)

    @property
    def any_success(self) -> bool:
        """At least one call exited 0."""
        return any(c.succeeded for c in self.calls)

    @property
    def any_change(self) -> bool:
        """At least one call changed the workspace."""
        return any(c.changed_workspace for c in self.calls)
