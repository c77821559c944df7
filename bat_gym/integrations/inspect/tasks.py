"""``inspect eval bat_gym/stage`` and ``inspect eval bat_gym/heldout``: a stage env as Inspect tasks.

* ``bat_gym/stage``: a sample per Stage Bank state of one focus (a stage, or E2E),
  from a bank directory (``-T bank=DIR``) or the benchmark's default states.
* ``bat_gym/heldout``: a sample per held-out cell (track, held-out seed, repeat), each
  an E2E episode from the task's start state, the cells ``bat-gym eval`` plays (its
  ``held_out_cells``, in its order, keyed as it keys them).

Every sample runs in the ``bat_gym`` sandbox (the project's own sandbox behind the
sample's StageEnv), is played by :func:`~bat_gym.integrations.inspect.agent.play_stage`
with the env's tools, and is scored by
:func:`~bat_gym.integrations.inspect.scorer.rubric_scorer`. A sample's input is the
state's conversation as the env's reset gives it (system prompt, task, and the earlier
stages' turns for a mid-pipeline state).

The firewall: a held-out run's log carries aggregates only, as ``bat-gym eval``'s
``aggregates.json`` does for training. ``bat_gym/heldout`` refuses to start unless
Inspect keeps no samples (``--no-log-samples``), so no held-out prompt, transcript
or verdict lands in the log; what Inspect still writes per sample (its score
reductions) is numbers under the cell's track and repeat (the scorer gives a held-out
cell no explanation), and the task's metrics are the aggregates: mean reward,
overall and task score.
"""

from __future__ import annotations

import tempfile
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.hooks import Hooks, TaskStart, hooks
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
)
from inspect_ai.util import LimitExceededError, SandboxEnvironmentSpec

from bat_gym.core.errors import ConfigError
from bat_gym.integrations.inspect.agent import play_stage
from bat_gym.integrations.inspect.sandbox import SANDBOX_NAME, StageSandboxConfig, register_states
from bat_gym.integrations.inspect.scorer import rubric_scorer
from bat_gym.viewer.export import inspect_messages

__all__ = ["HeldOutFirewall", "chat_messages", "heldout", "stage"]

HELDOUT_TASK = "bat_gym/heldout"

_MESSAGE_TYPES: dict[str, type[ChatMessage]] = {
    "system": ChatMessageSystem,
    "user": ChatMessageUser,
    "assistant": ChatMessageAssistant,
    "tool": ChatMessageTool,
}


def chat_messages(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    """A state's conversation (OpenAI chat format) as Inspect chat messages."""
    trace = {"messages": messages, "prefix_messages": len(messages)}
    return [_MESSAGE_TYPES[m["role"]].model_validate(m) for m in inspect_messages(trace)]


def _budgets(bench: Any, max_turns: int | None) -> dict[str, Any] | None:
    if max_turns is None:
        return None
    if max_turns < 1:
        raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
    return bench.spec.budgets.model_copy(update={"max_turns": max_turns}).model_dump()


def _sample(state: Any, sample_id: str, **metadata: Any) -> Sample:
    return Sample(
        id=sample_id,
        input=chat_messages([dict(m) for m in state.messages]),
        metadata={
            "state_id": state.state_id,
            "benchmark": state.benchmark,
            "focus": state.focus,
            "track": state.track,
            **metadata,
        },
    )


def _task(name: str, samples: list[Sample], config: StageSandboxConfig, name_state: bool) -> Task:
    return Task(
        dataset=samples,
        solver=play_stage(name_state=name_state),
        scorer=rubric_scorer(),
        sandbox=SandboxEnvironmentSpec(SANDBOX_NAME, config),
        name=name,
        metadata={"benchmark": config.benchmark, "stage": config.stage},
    )


@task
def stage(
    benchmark: str | None = None,
    stage: str = "E2E",
    track: str | None = None,
    bank: str | None = None,
    backend: str = "local",
    max_turns: int | None = None,
    name_state: bool = False,
) -> Task:
    """A sample per Stage Bank state of one focus.

    Args:
        benchmark: a registered benchmark (``toy_pipeline``); default: the installed default.
        stage: the focus: ``E2E``, a stage id (``S3``) or name (``validate``).
        track: only states of this track.
        bank: a Stage Bank directory; default: the benchmark's default states.
        backend: the project's sandbox backend, ``local`` or ``docker``.
        max_turns: override the benchmark's turn budget (assistant turns per episode).
        name_state: send each request the state's id (see
            :func:`~bat_gym.integrations.inspect.agent.play_stage`).
    """
    from bat_gym.catalog import get_benchmark, state_source

    bench = get_benchmark(benchmark)
    focus = bench.spec.focus(stage)
    source = state_source(bank, bench)
    ids = source.select(focus=focus, track=track)
    if not ids:
        raise ConfigError(
            f"no {bench.name} states with focus {focus} and track {track!r} in "
            f"{bank or 'the default states'}; pick another stage or track, or build a bank"
        )
    samples = [_sample(source.get(i), i) for i in ids]
    config = StageSandboxConfig(
        benchmark=bench.name,
        stage=focus,
        backend=backend,
        bank=bank,
        budgets=_budgets(bench, max_turns),
    )
    return _task(f"bat_gym/stage/{bench.name}/{focus}", samples, config, name_state)


@task
def heldout(
    benchmark: str | None = None,
    repeats: int | None = None,
    track: str | None = None,
    backend: str = "local",
    max_turns: int | None = None,
    name_state: bool = False,
) -> Task:
    """A sample per held-out cell, as ``bat-gym eval`` plays them (aggregates-only log).

    Args:
        benchmark: a registered benchmark; default: the installed default.
        repeats: held-out tasks per track (at most the benchmark's
            ``splits.heldout_repeats``, the default).
        track: only this track's cells.
        backend: the project's sandbox backend, ``local`` or ``docker``.
        max_turns: override the benchmark's turn budget.
        name_state: send each request the state's id (see
            :func:`~bat_gym.integrations.inspect.agent.play_stage`).
    """
    from bat_gym.bank import task_states
    from bat_gym.catalog import get_benchmark
    from bat_gym.core.sandbox.snapshot import BlobStore
    from bat_gym.evaluation import EvalConfig, held_out_cells

    bench = get_benchmark(benchmark)
    cfg = EvalConfig(repeats=repeats, tracks=() if track is None else (track,), progress=False)
    cells = held_out_cells(bench, cfg)
    # Held-out start states never enter a bank: built in memory, their files in a
    # store that lives as long as this process (removed at exit).
    scratch = tempfile.TemporaryDirectory(prefix="bat-gym-inspect-heldout-")
    store = BlobStore(scratch.name)
    source = task_states(bench, sorted({(c.track, c.seed) for c in cells}), "heldout", store)
    by_task = {(s.track, s.provenance["seed"]): s for s in map(source.get, source.select())}
    # A cell is named by its track and repeat, as the aggregates name tracks: its
    # held-out seed (which task it is) stays out of the log.
    samples = [
        _sample(by_task[(c.track, c.seed)], f"{c.track}-r{c.repeat}", repeat=c.repeat, heldout=True)
        for c in cells
    ]
    config = StageSandboxConfig(
        benchmark=bench.name,
        stage="E2E",
        backend=backend,
        states_token=register_states(source, keep=scratch),
        budgets=_budgets(bench, max_turns),
    )
    return _task(HELDOUT_TASK, samples, config, name_state)


def _held_out_logged() -> str:
    return (
        "a held-out run's log carries aggregates only (the firewall): run `inspect eval "
        "bat_gym/heldout --no-log-samples ...`; for per-cell detail use `bat-gym eval`, "
        "whose cells stay on the evaluation side, and `bat-gym view`"
    )


@hooks(name="bat_gym_firewall", description="Held-out bat_gym runs log aggregates only.")
class HeldOutFirewall(Hooks):
    """Stops a ``bat_gym/heldout`` run whose log would keep its samples, before any runs.

    Inspect swallows what a hook raises, except a limit: the refusal is a ``custom``
    limit, which ends the task with the message above and no sample.
    """

    async def on_task_start(self, data: TaskStart) -> None:  # noqa: D102
        if data.spec.task == HELDOUT_TASK and data.spec.config.log_samples is not False:
            raise LimitExceededError("custom", value=1, limit=0, message=_held_out_logged())
