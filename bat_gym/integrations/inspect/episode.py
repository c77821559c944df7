"""One rubric-scored StageEnv episode, stepped by an Inspect sample one action at a time.

The sample's sandbox (:class:`~bat_gym.integrations.inspect.sandbox.StageSandbox`)
holds one :class:`StageEpisode`; the Inspect tools and the solver step it, the scorer
reads its verdict. Every env operation runs on the episode's own worker thread, in
the order the sample asks for them, so the project's sandbox has one caller as it
does in-process, and Inspect's event loop is never blocked by a tool call.

Two kinds of action step the env, each exactly one ``env.step``:

* a tool call (:meth:`StageEpisode.call`): the action is that single call written in
  the env's protocol (:meth:`ToolProtocol.render <bat_gym.core.protocol.ToolProtocol.render>`),
  so the env parses, checks, budgets, runs and records it as it does a policy's turn;
* an assistant message with no native tool call (:meth:`StageEpisode.message`): the
  message's text, as a text policy's turn. A call written in the protocol's text form
  runs; plain prose is the env's ``[tool call error]`` turn, as in-process.

The step that ends the episode (``finish``, a budget) is scored by the rubric
(:class:`~bat_gym.rubrics.verifier.reward.RubricReward`). An episode Inspect stops first (its
message, token or time limit) is scored as it stands by :meth:`StageEpisode.score`,
as :class:`~bat_gym.rubrics.verifier.reward.TruncationVerdict` scores a cut episode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from bat_gym.core.errors import ConfigError
from bat_gym.core.protocol import ToolCall
from bat_gym.rubrics.verifier.reward import RubricReward

if TYPE_CHECKING:
    from bat_gym.rubrics.verifier.verdict import Verdict

__all__ = ["INSPECT_LIMIT", "StageEpisode", "StepReply"]

INSPECT_LIMIT = "inspect_limit"
"""``stop_reason`` of an episode that Inspect stopped (a sample limit) before the env did."""

T = TypeVar("T")


@dataclass(frozen=True)
class StepReply:
    """What one action returned.

    Attributes:
        text: the env's observation (on the last step, followed by the ending line).
        refused: the env refused the action (``info["tool_errors"]``), or the episode
            had already ended.
        ended: the episode is over (this action or an earlier one ended it).
    """

    text: str
    refused: bool
    ended: bool


class StageEpisode:
    """One episode of a rubric-wrapped StageEnv from one state.

    Args:
        env: a :class:`~bat_gym.rubrics.verifier.reward.RubricReward` around a
            :class:`~bat_gym.env.StageEnv`.
        state_id: the state the episode starts from.

    Attributes:
        info: the env's info after the last step (or the reset).
        verdict: the rubric's verdict once the episode ended (or was scored), else None.
        reward: the episode's reward once scored, else None.
        stop_reason: why it ended: the env's :data:`~bat_gym.env.StopReason`,
            :data:`INSPECT_LIMIT`, or None while it runs.
    """

    def __init__(self, env: RubricReward, state_id: str) -> None:
        if not isinstance(env, RubricReward):
            raise ConfigError(
                "StageEpisode scores with the rubric: expected a RubricReward around a "
                f"StageEnv (bat_gym.rubrics.verifier.reward.make_env), got {type(env).__name__}"
            )
        self.env = env
        self.state_id = state_id
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bat-gym-inspect")
        self.info: dict[str, Any] = {}
        self.verdict: Verdict | None = None
        self.reward: float | None = None
        self.stop_reason: str | None = None

    async def reset(self) -> dict[str, Any]:
        """Reset the env to the state; returns its info (``tools``, ``messages``)."""
        _, self.info = await self.run(self.env.reset, options={"state_id": self.state_id})
        return self.info

    @property
    def ended(self) -> bool:
        """Whether the episode is over: the env ended it, or it was scored as it stood."""
        return self.stop_reason is not None

    async def call(self, name: str, arguments: dict[str, Any]) -> StepReply:
        """Step the env with one tool call (see the module docstring)."""
        return await self.run(self._step_call, name, dict(arguments))

    async def message(self, text: str) -> StepReply:
        """Step the env with an assistant message that held no native tool call."""
        return await self.run(self._step, text)

    async def score(self) -> Verdict:
        """The verdict: the ending step's, or, for an episode still running, scored now."""
        return await self.run(self._score_now)

    async def close(self) -> None:
        """Close the env (its sandbox and service) and stop the worker thread."""
        try:
            await self.run(self.env.close)
        finally:
            self._worker.shutdown(wait=False)

    def ending(self) -> str:
        """The line that closes the episode: why it ended, the reward, the verdict's summary."""
        if self.verdict is None:
            return "[the episode is still running]"
        reward = "-" if self.reward is None else f"{self.reward:.3f}"
        return f"[episode ended: {self.stop_reason}; reward {reward}]\n{self.verdict.summary()}"

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the episode's worker thread (after what was asked before it)."""
        return await asyncio.wrap_future(self._worker.submit(fn, *args, **kwargs))

    def _step_call(self, name: str, arguments: dict[str, Any]) -> StepReply:
        protocol = self.env.unwrapped.protocol  # type: ignore[attr-defined]
        return self._step(protocol.render("", [ToolCall(name=name, arguments=arguments)]))

    def _step(self, action: str) -> StepReply:
        if self.ended:
            return StepReply(f"[not run: the episode has ended]\n{self.ending()}", True, True)
        obs, reward, terminated, truncated, self.info = self.env.step(action)
        refused = bool(self.info["tool_errors"])
        if not (terminated or truncated):
            return StepReply(obs, refused, False)
        self.verdict, self.reward = self.info["verdict"], float(reward)
        self.stop_reason = self.info["stop_reason"]
        return StepReply(f"{obs}\n\n{self.ending()}", refused, True)

    def _score_now(self) -> Verdict:
        if self.verdict is None:
            verdict = self.env.score_episode()
            self.env.last_verdict = verdict
            self.verdict = verdict
            self.reward = 0.0 if verdict.reward is None else verdict.reward
            self.stop_reason = INSPECT_LIMIT
            self.info = {**self.info, "verdict": verdict, "stop_reason": None}
        return self.verdict
