"""The one episode loop: reset, then act, step, restart check, end check, every consumer.

An episode is ``reset`` to a state, then turns of *act* (a policy, a recorded
trajectory, a token sampler produces the assistant's message) and *step* (the env runs
the tool calls it holds) until the policy calls ``finish`` (``terminated``), a budget
runs out (``truncated``), or the actor has nothing more to say.

:func:`episode_loop` is that loop, written once. What varies between consumers is
*where a turn comes from* (the turn source: a text :class:`~bat_gym.policies.Policy`,
a token sampler, a versioned sampler, an async server) and *what a consumer keeps*;
both are hooks (:class:`TurnHooks`, overridden by subclasses such as
:class:`~bat_gym.rollout.token_episode.TokenEpisode`), and the loop never changes.
The loop is a generator: it yields each turn's request and is sent the source's reply,
so one loop serves a plain call (:func:`drive`), an event loop
(:meth:`TokenEpisode.arun <bat_gym.rollout.token_episode.TokenEpisode.arun>`), and many
episodes advanced in lockstep by one batched call
(:func:`~bat_gym.rollout.token_episode.play_in_lockstep`).

The guarantee: nothing a policy writes makes a step raise. The env turns every
message, malformed or hostile, into an observation (a ``[tool call error]`` reply, a
refused workspace ending the episode); :func:`step` is the only place the consumers
call ``env.step``. What still raises from it is never the policy's doing: a caller's
bug (:class:`~bat_gym.core.errors.ResetNeeded`, :class:`~bat_gym.core.errors.NotAnAction`) or
infrastructure (a sandbox that could not run). A sandbox that crashed during a tool
call and was restarted is infrastructure too; the step reports it
(:attr:`Step.restarted`) and the loop raises :class:`SandboxRestarted` unless told to
carry on, so a crash is never scored as the policy's failure (the
:class:`~bat_gym.rollout.runner.Runner` plays such an episode again).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bat_gym.core.completion import Completion
from bat_gym.core.errors import BatGymError

if TYPE_CHECKING:
    from bat_gym.benchmark import Benchmark
    from bat_gym.core.spec import StageState
    from bat_gym.policies.base import Policy, SeedKey

__all__ = [
    "Action",
    "Actor",
    "Rollout",
    "SandboxRestarted",
    "Step",
    "TurnHooks",
    "advance",
    "drive",
    "episode_loop",
    "policy_actor",
    "reset_info",
    "run_episode",
    "sandbox_restarted",
    "step",
]

Action = str | Completion
"""An assistant message: its text, or a :class:`~bat_gym.core.completion.Completion` with tokens."""

Actor = Callable[[dict[str, Any]], Action | None]
"""Given the env's latest ``info`` (``messages``, ``tools``, ``turns``), the next message.

None: the actor has nothing more to say (a recorded trajectory ran out) and the
episode stops where it is, neither terminated nor truncated.
"""


class SandboxRestarted(BatGymError, RuntimeError):
    """The sandbox crashed during a tool call and was restarted: infrastructure, not the policy.

    Attributes:
        turn: the 1-based assistant turn whose tool call crashed the sandbox.
    """

    def __init__(self, turn: int) -> None:
        super().__init__(
            f"the sandbox crashed during a tool call of turn {turn} and was restarted; "
            "the episode is not the policy's doing: play it again"
        )
        self.turn = turn


@dataclass(frozen=True)
class Step:
    """One turn of an episode, as the env answered it.

    Attributes:
        turn: the 1-based index of the turn in the episode.
        action: the message the env was stepped with.
        observation: the env's reply (tool results, or a ``[tool call error]``).
        reward: the step's reward (0 until the last step under a rubric reward).
        terminated: the policy called ``finish``.
        truncated: a budget ran out, or the workspace was refused.
        info: the env's ``info`` after the step.
    """

    turn: int
    action: Action
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @property
    def done(self) -> bool:
        """Whether the episode ended with this step."""
        return self.terminated or self.truncated

    @property
    def restarted(self) -> bool:
        """Whether a tool call of this step crashed the sandbox (see :func:`sandbox_restarted`)."""
        return sandbox_restarted(self.info)


@dataclass(frozen=True)
class Rollout:
    """How an episode ended.

    Attributes:
        info: the env's ``info`` after the last step (after the reset, if none).
        turns: the steps taken.
        terminated: the policy called ``finish``.
        truncated: a budget ran out, or the workspace was refused.
        reward: the last step's reward (None: no step was taken).
    """

    info: dict[str, Any]
    turns: int
    terminated: bool
    truncated: bool
    reward: float | None

    @property
    def finished(self) -> bool:
        """Whether the policy ended the episode itself (``terminated``)."""
        return self.terminated


def sandbox_restarted(info: dict[str, Any]) -> bool:
    """Whether the last step's execution record holds a call that restarted the sandbox."""
    record = info.get("record")
    return record is not None and any(c.restarted for c in record.calls)


def step(env: Any, action: Action, *, turn: int = 0) -> Step:
    """Step ``env`` once with the assistant message ``action``; the one call of ``env.step``.

    Args:
        env: a StageEnv or a wrapper stack over one.
        action: the whole assistant message.
        turn: the 1-based turn index to record in the step (0: not counted).

    Returns:
        The env's answer as a :class:`Step`.
    """
    observation, reward, terminated, truncated, info = env.step(action)
    return Step(
        turn=turn,
        action=action,
        observation=observation,
        reward=float(reward),
        terminated=bool(terminated),
        truncated=bool(truncated),
        info=info,
    )


class TurnHooks:
    """What an episode does around each turn; subclass and override, the loop stays.

    The defaults play text turns: the turn source is asked with the env's latest
    ``info`` and answers with the assistant's message.
    """

    def request(self, info: dict[str, Any]) -> Any | None:
        """What the turn source is asked for the next turn; None ends the episode here.

        Args:
            info: the env's latest ``info`` (``messages``, ``tools``, ``turns``).
        """
        return info

    def action(self, reply: Any) -> Action | None:
        """The turn source's reply as the message to step the env with; None ends here."""
        return reply

    def observe(self, step: Step) -> bool:
        """Called with every step, after the restart check; True ends the episode here."""
        return False


def episode_loop(
    env: Any, hooks: TurnHooks, info: dict[str, Any], *, on_restart: str = "raise"
) -> Generator[Any, Any, Rollout]:
    """The one episode loop, from a reset env: yields each turn's request, is sent the reply.

    Args:
        env: a StageEnv or a wrapper stack over one, just reset.
        hooks: the consumer's hooks (see :class:`TurnHooks`).
        info: the ``info`` the reset returned.
        on_restart: ``"raise"`` :class:`SandboxRestarted` when a step's tool call
            crashed the sandbox, or ``"ignore"`` to carry on (the step still reports
            it in :attr:`Step.restarted`).

    Returns:
        (as the generator's return value) how the episode ended.

    Raises:
        SandboxRestarted: a tool call crashed the sandbox and ``on_restart="raise"``.
    """
    if on_restart not in ("raise", "ignore"):
        raise ValueError(f"on_restart must be 'raise' or 'ignore', got {on_restart!r}")
    turns = 0
    last: Step | None = None
    while (request := hooks.request(info)) is not None:
        action = hooks.action((yield request))
        if action is None:
            break
        turns += 1
        last = step(env, action, turn=turns)
        info = last.info
        if on_restart == "raise" and last.restarted:
            raise SandboxRestarted(turns)
        if hooks.observe(last) or last.done:
            break
    return Rollout(
        info=info,
        turns=turns,
        terminated=last is not None and last.terminated,
        truncated=last is not None and last.truncated,
        reward=None if last is None else last.reward,
    )


def advance(loop: Generator[Any, Any, Rollout], reply: Any = None) -> tuple[bool, Any]:
    """Send ``reply`` into ``loop`` (None starts it): ``(False, next request)`` or ``(True, Rollout)``.

    A plain function, so an executor thread can run it (a future cannot carry the
    generator's ``StopIteration``).
    """
    try:
        return False, loop.send(reply)
    except StopIteration as end:
        return True, end.value


def drive(loop: Generator[Any, Any, Rollout], answer: Callable[[Any], Any]) -> Rollout:
    """Play ``loop`` to its end, answering each request with ``answer(request)``."""
    done, value = advance(loop)
    while not done:
        done, value = advance(loop, answer(value))
    return value


class _Observed(TurnHooks):
    """Text turns, with a caller's callback on every step."""

    def __init__(self, on_step: Callable[[Step], None] | None) -> None:
        self.on_step = on_step

    def observe(self, step: Step) -> bool:
        if self.on_step is not None:
            self.on_step(step)
        return False


def reset_info(env: Any, state_id: str | None = None, *, seed: int | None = None) -> dict[str, Any]:
    """Reset ``env`` (to ``state_id`` when given) and return the reset's ``info``."""
    options = None if state_id is None else {"state_id": state_id}
    _, info = env.reset(options=options) if seed is None else env.reset(seed=seed, options=options)
    return info


def run_episode(
    env: Any,
    act: Actor,
    *,
    state_id: str | None = None,
    info: dict[str, Any] | None = None,
    on_step: Callable[[Step], None] | None = None,
    on_restart: str = "raise",
) -> Rollout:
    """Play one text episode: reset, then act and step until it ends or ``act`` returns None.

    Args:
        env: a StageEnv or a wrapper stack over one.
        act: the actor (see :data:`Actor`): called with the latest ``info`` before
            every turn.
        state_id: the state to reset to (``reset(options={"state_id": ...})``); None
            resets to what the env's state source picks.
        info: the ``info`` of a reset already made; then the env is not reset again.
        on_step: called with every step, after the restart check and before the end
            check (so it also sees the last step).
        on_restart: see :func:`episode_loop`.

    Returns:
        How the episode ended.

    Raises:
        SandboxRestarted: a tool call crashed the sandbox and ``on_restart="raise"``.
    """
    if on_restart not in ("raise", "ignore"):
        raise ValueError(f"on_restart must be 'raise' or 'ignore', got {on_restart!r}")
    if info is None:
        info = reset_info(env, state_id)
    return drive(episode_loop(env, _Observed(on_step), info, on_restart=on_restart), act)


def policy_actor(
    policy: Policy,
    benchmark: Benchmark,
    state: StageState,
    *,
    seed_key: SeedKey | None = None,
) -> Callable[[dict[str, Any]], Completion]:
    """An actor asking ``policy`` for each turn, with the episode's privileged context.

    Scripted policies read the context (the benchmark and the start state) to
    regenerate the task; learned policies ignore it. A
    :class:`~bat_gym.policies.PolicyError` from the backend propagates.

    Args:
        policy: who answers each turn.
        benchmark: the benchmark being played (the context's).
        state: the start state of the episode (the context's).
        seed_key: names the episode within the run; turn ``t``'s request then carries
            ``(*seed_key, t)``, so a seeded policy samples this episode the same way
            whatever else runs beside it (see
            :attr:`~bat_gym.policies.PolicyRequest.seed_key`). None: no key.
    """
    from bat_gym.policies.base import EpisodeContext, PolicyRequest

    def act(info: dict[str, Any]) -> Completion:
        turn = info["turns"]
        request = PolicyRequest(
            messages=info["messages"],
            tools=info["tools"],
            context=EpisodeContext(benchmark=benchmark, state=state, turn=turn),
            seed_key=None if seed_key is None else (*seed_key, turn),
        )
        return policy.act(request).action()

    return act
