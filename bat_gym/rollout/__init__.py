"""Rollouts: the one episode loop, its token episode, and the runner of many episodes.

* :mod:`bat_gym.rollout.loop`: :func:`episode_loop`, the one loop (reset, act, step,
  restart check, end check), its hooks (:class:`TurnHooks`) and drivers
  (:func:`run_episode` for text actors).
* :mod:`bat_gym.rollout.chat_tokens`: chat-template token arithmetic (prompt ids, stop
  tokens, the tokens of an env reply).
* :mod:`bat_gym.rollout.token_episode`: :class:`TokenEpisode`, the loop's token hooks
  every trainer and adapter shares.
* :mod:`bat_gym.rollout.runner`: :class:`Runner`, many episodes on a pool of envs with
  one retry rule.
"""

from __future__ import annotations

from bat_gym.rollout.chat_tokens import ChatTemplateError, default_stop_token_ids, render_ids
from bat_gym.rollout.loop import (
    Actor,
    Rollout,
    SandboxRestarted,
    Step,
    TurnHooks,
    episode_loop,
    policy_actor,
    run_episode,
    sandbox_restarted,
    step,
)
from bat_gym.rollout.runner import Played, Runner
from bat_gym.rollout.token_episode import (
    BatchGenerate,
    EpisodeResult,
    PromptTooLong,
    TokenEpisode,
    play_in_lockstep,
)

__all__ = [
    # the loop
    "Actor",
    "Rollout",
    "SandboxRestarted",
    "Step",
    "TurnHooks",
    "episode_loop",
    "policy_actor",
    "run_episode",
    "sandbox_restarted",
    "step",
    # token episodes
    "BatchGenerate",
    "ChatTemplateError",
    "EpisodeResult",
    "PromptTooLong",
    "TokenEpisode",
    "default_stop_token_ids",
    "play_in_lockstep",
    "render_ids",
    # many episodes
    "Played",
    "Runner",
]
