"""The Policy protocol: a conversation and its tools in, one assistant message out.

Every agent that plays a bat_gym episode, scripted or learned, local or behind a server,
is a :class:`Policy`. The evaluation harness, the GRPO trainer and the Stage Bank's
teacher all drive envs through it, so a new backend works everywhere at once.

A request carries what the env shows (``info["messages"]``, ``info["tools"]``) and,
separately, an :class:`EpisodeContext`: the benchmark and the state being played.
Only scripted policies (the benchmark's own teacher and baselines) may read the
context; learned policies must ignore it, since it names the task.
"""

from __future__ import annotations

import hashlib
import json
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bat_gym.core.completion import Completion
from bat_gym.core.errors import BatGymError

if TYPE_CHECKING:
    from bat_gym.benchmark import Benchmark
    from bat_gym.core.spec import StageState

__all__ = [
    "EpisodeContext",
    "Policy",
    "PolicyError",
    "PolicyKind",
    "PolicyOutput",
    "PolicyRequest",
    "SeedKey",
    "keyed_seed",
]

#: Names one request within a run, whatever order requests arrive in: e.g.
#: ``("cell", "segmentation", 1042, 0, 3)`` for turn 3 of an evaluation cell.
SeedKey = tuple[str | int, ...]


class PolicyError(BatGymError, RuntimeError):
    """The policy could not produce a message (server down, bad reply, engine crash).

    An infrastructure failure, not a model failure: the evaluation marks the cell
    invalid and retries it instead of scoring it.
    """


@dataclass(frozen=True)
class EpisodeContext:
    """Privileged facts about the episode, for scripted policies only.

    Attributes:
        benchmark: the benchmark being played.
        state: the Stage Bank state the episode started from.
        turn: assistant turns already taken in this episode (0 at the first call).
    """

    benchmark: Benchmark
    state: StageState
    turn: int


@dataclass(frozen=True)
class PolicyRequest:
    """One call to a policy.

    Attributes:
        messages: the conversation so far, OpenAI chat format (``info["messages"]``).
        tools: the OpenAI tool schemas the env accepts (``info["tools"]``).
        context: privileged episode facts; learned policies must not read them.
        seed_key: names this request within the run (the episode and the turn), so a
            seeded policy samples it with :func:`keyed_seed` of its seed and this key:
            concurrent episodes then draw the same tokens however their requests
            interleave. None: a seeded policy gives the n-th request to arrive the n-th
            seed of its sequence.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    context: EpisodeContext | None = None
    seed_key: SeedKey | None = None


def keyed_seed(base_seed: int, key: SeedKey) -> int:
    """The sampling seed of the request named ``key`` under a policy seeded ``base_seed``.

    A hash (SHA-256) of both, so nearby keys (turn 2 and turn 3) get unrelated seeds.

    Returns:
        An integer in ``[0, 2**63)``.
    """
    # operator.index takes numpy integers too, and refuses floats and other strays.
    parts = [k if isinstance(k, str) else operator.index(k) for k in key]
    text = json.dumps([operator.index(base_seed), parts], separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass
class PolicyOutput:
    """One assistant message, with the tokens behind it when the backend has them.

    Attributes:
        text: the message written in the env's tool protocol: pass :meth:`action` to
            ``env.step``.
        prompt_token_ids: the tokens the model was conditioned on, shape ``(P,)``.
        token_ids: the sampled tokens, shape ``(T,)``; None for scripted policies and
            servers that do not return them.
        logprobs: log-probability of each sampled token under the sampling policy,
            shape ``(T,)``, natural log.
        finish_reason: ``"stop"``, ``"length"``, ... as the backend reports it.
        usage: backend-reported counts (e.g. ``{"completion_tokens": 57}``).
    """

    text: str
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int | None:
        """Generated tokens, for the env's response-token budget (None: unknown)."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return self.usage.get("completion_tokens")

    def action(self) -> Completion:
        """The message as an env action that counts its own tokens."""
        return Completion(self.text, self.num_tokens)


class Policy(ABC):
    """Maps conversations to assistant messages.

    Subclasses implement :meth:`act_batch`; :meth:`act` is one request of it.
    Implementations must be safe to call from several threads at once (the evaluation
    harness and the GRPO rollouts play episodes concurrently); a backend that batches
    on its own gathers concurrent calls into one batch.
    """

    #: Short label used in reports, e.g. ``"teacher"`` or ``"hf:tiny-qwen"``.
    name: str = "policy"

    @abstractmethod
    def act_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        """One assistant message for each request, in order.

        Raises:
            PolicyError: the backend failed; nothing is known about the model's answer.
        """

    def act(self, request: PolicyRequest) -> PolicyOutput:
        """One assistant message for one request."""
        return self.act_batch([request])[0]

    def check_ready(self) -> None:
        """Fail fast when the backend cannot answer at all (nothing to check by default).

        Called once before a run plays any episode, so a server that is down is one
        clear error up front instead of a retry storm in every cell.

        Raises:
            PolicyError: the backend is unreachable or refuses to serve.
        """
        return None

    def check_benchmark(self, benchmark: Any) -> None:
        """Refuse, before any episode, a benchmark this policy cannot play.

        The evaluation harness calls it once, so a policy that needs something the
        benchmark does not define fails with one clear error instead of one
        infrastructure failure per cell. Default: every benchmark is playable.

        Raises:
            UnsupportedPolicy: naming what the benchmark lacks.
        """
        return None

    def identity(self) -> dict[str, Any]:
        """What reproduces this policy, for run manifests: kind, model digest or server+model.

        Must hold no secrets (API keys) and enough to tell two policies apart.
        """
        return {"kind": type(self).__name__, "name": self.name}

    def observed(self) -> dict[str, Any]:
        """What the policy learned about itself while playing, for the run's manifest.

        An external agent reports its own name and version only once it connects
        (:class:`~bat_gym.integrations.mcp_agent.McpAgentPolicy`). Kept apart from
        :meth:`identity`, which must not change when a run resumes. Default: nothing.
        """
        return {}

    def end_episode(self, seed_key: SeedKey | None, info: dict[str, Any] | None) -> None:
        """Called when an episode this policy played has ended, or was abandoned.

        For a policy that holds something per episode (an external agent's process and
        the call it waits on). The evaluation harness calls it after every attempt.

        Args:
            seed_key: the episode's key (its requests' ``seed_key`` without the turn).
            info: the env's ``info`` after the last step; None when the attempt failed
                (an infrastructure error) before the episode ended.
        """
        return None

    def close(self) -> None:
        """Release engines, threads and connections (nothing to release by default)."""
        return None

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class PolicyKind:
    """One kind of policy, as a spec string names it: ``KIND`` or ``KIND:ARGUMENT``.

    The kind is the spec's part before the first ``:``; what follows is the argument
    (a model path, a server address). A kind is registered under its name in
    :data:`bat_gym.policies.POLICIES` (entry point group ``bat_gym.policies``), and its
    forms and description are what ``bat-gym eval --help`` and the error for an unknown
    spec show.

    Attributes:
        forms: the spec forms it takes, as help shows them (``"hf:PATH"``); each starts
            with the kind's name.
        description: one line: what the policy is.
        build: ``build(argument, **options)`` returns the policy; ``argument`` is ``""``
            when the spec has no ``:``. It raises
            :class:`~bat_gym.core.errors.ConfigError` for an argument it cannot take, naming
            the form to write.
        sampling: whether it takes the sampling options of a model (``max_new_tokens``,
            ``temperature``, ``seed``, ``chat_template_kwargs``); a scripted policy does
            not.
    """

    forms: tuple[str, ...]
    description: str
    build: Callable[..., Policy]
    sampling: bool = True
