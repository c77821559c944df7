"""A benchmark with tools of its own, for the core's tool tests: the toy pipeline plus six.

* ``lookup_case`` (host): one case's row of the task's data; a :class:`ToolError` for
  an id that is not the task's. The teacher calls it in its S1 turn.
* ``count_files`` (sandbox): a program counting the files under a directory.
* ``slow`` (host): sleeps ``seconds``, honouring :attr:`ToolContext.remaining_s` not at all.
* ``boom`` (host): raises an exception whose text holds a "secret".
* ``chatty`` (host): returns ``size`` characters.
* ``peek`` (host): asks for the private answers without declaring ``sees_private``.
* ``grade`` (host, ``sees_private``): says whether a case's score agrees with the truth.
"""

from __future__ import annotations

import time
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.benchmark import TeacherTurn
from bat_gym.core.protocol import ToolCall
from bat_gym.core.tools import SandboxProgram, Tool, ToolContext, ToolError
from bat_gym.envs.toy_pipeline.suite import ToyPipeline

__all__ = ["ToolBench", "SECRET"]

SECRET = "s3cr3t-0.4242"
_Strict = ConfigDict(extra="forbid")


class CaseArgs(BaseModel):
    model_config = _Strict
    case_id: Annotated[str, Field(pattern=r"^case\d{3}$", description="A case id, e.g. case007.")]


class DirArgs(BaseModel):
    model_config = _Strict
    directory: Annotated[str, Field(pattern=r"^[A-Za-z0-9_./-]{1,64}$")] = "."


class SlowArgs(BaseModel):
    model_config = _Strict
    seconds: Annotated[float, Field(ge=0, le=60)]


class NoArgs(BaseModel):
    model_config = _Strict


class SizeArgs(BaseModel):
    model_config = _Strict
    size: Annotated[int, Field(ge=0, le=2_000_000)]


class GradeArgs(BaseModel):
    model_config = _Strict
    case_id: str
    score: float


class ToolBench(ToyPipeline):
    """The toy pipeline with tools of its own (named ``toy_tools``)."""

    spec = ToyPipeline.spec.model_copy(update={"name": "toy_tools", "default_priority": 0})

    def _rows(self, task) -> dict[str, dict]:
        d = self._draw(task.track, task.seed)
        key = "values" if task.track == "threshold" else "codes"
        return {i: {"id": i, key[:-1]: v} for i, v in zip(d["ids"], d[key], strict=True)}

    def tools(self) -> tuple[Tool, ...]:  # noqa: D102
        def lookup_case(args: CaseArgs, ctx: ToolContext) -> dict:
            rows = self._rows(ctx.task)
            if args.case_id not in rows:
                raise ToolError(f"no case {args.case_id}; data/cases.csv lists the ids")
            return rows[args.case_id]

        def count_files(args: DirArgs, ctx: ToolContext) -> SandboxProgram:
            code = (
                "import os\n"
                f"print(sum(len(f) for _, _, f in os.walk({args.directory!r})), 'files')\n"
            )
            return SandboxProgram("python", code)

        def slow(args: SlowArgs, ctx: ToolContext) -> str:
            time.sleep(args.seconds)
            return "slept"

        def boom(args: NoArgs, ctx: ToolContext) -> str:
            raise RuntimeError(f"internal state {SECRET}")

        def chatty(args: SizeArgs, ctx: ToolContext) -> str:
            return "x" * args.size

        def peek(args: NoArgs, ctx: ToolContext) -> dict:
            return ctx.private_answers()

        def grade(args: GradeArgs, ctx: ToolContext) -> str:
            truth = ctx.private_answers()["scores"]
            if args.case_id not in truth:
                raise ToolError(f"no case {args.case_id}")
            return "agrees" if abs(truth[args.case_id] - args.score) <= 1e-4 else "disagrees"

        return (
            Tool(
                "lookup_case", "One case's row of data/cases.csv, as JSON.", CaseArgs, lookup_case
            ),
            Tool(
                "count_files",
                "Count the files under a workspace directory.",
                DirArgs,
                count_files,
                runs_in="sandbox",
            ),
            Tool("slow", "Sleep.", SlowArgs, slow),
            Tool("boom", "Fail.", NoArgs, boom),
            Tool("chatty", "Talk a lot.", SizeArgs, chatty),
            Tool("peek", "Peek at the answers.", NoArgs, peek),
            Tool("grade", "Grade one case's score.", GradeArgs, grade, sees_private=True),
        )

    # The tool tests play the success path only.
    outcomes = ("success",)

    def teacher_turns(self, task) -> list[TeacherTurn]:  # noqa: D102
        turns = super().teacher_turns(task)
        first = next(iter(self._rows(task)))
        lookup = ToolCall(name="lookup_case", arguments={"case_id": first})
        head = turns[0]
        return [TeacherTurn(head.stage, head.content, (*head.calls, lookup)), *turns[1:]]
