"""What every trainer adapter needs besides tokens: envs to play and rows naming states.

A trainer's dataset row names one Stage Bank state (``state_id``); the trainer repeats
the row for its group (TRL's ``num_generations``, verl's ``rollout.n``, SkyRL's
``n_samples_per_prompt``), and every repeat resets an env to that exact state. The
rows come from a bank (all its states, or a focus/track slice) or from a
:class:`~bat_gym.curriculum.wrapper.StageCurriculum` (its current round, in order).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from bat_gym.core.errors import ConfigError

__all__ = [
    "EnvSpec",
    "conversation_text",
    "make_env",
    "state_id_of",
    "state_rows",
]

EnvSpec = str | Callable[[], gym.Env[str, str]]
"""A ``bat/...-v0`` id (made with ``gym.make(id, **env_kwargs)``) or a zero-argument factory."""


@functools.lru_cache(maxsize=8)
def _bank(root: str) -> Any:
    from bat_gym.bank import StageBank

    # Loading validates every row; adapters that make an env per episode (verl,
    # SkyRL) would otherwise reload the bank each time.
    return StageBank(root)


def make_env(env: EnvSpec, env_kwargs: Mapping[str, Any] | None = None) -> gym.Env[str, str]:
    """Make one env: ``gym.make(env, **env_kwargs)`` for an id, ``env()`` for a factory.

    A bank directory given as ``states`` is loaded once per process and shared.
    """
    kwargs = dict(env_kwargs or {})
    if callable(env):
        if kwargs:
            raise ConfigError("env_kwargs apply to an env id; a factory takes no arguments")
        return env()
    if not isinstance(env, str):
        raise TypeError(f"expected a bat/...-v0 id or a factory, got {type(env).__name__}")
    states = kwargs.get("states")
    if isinstance(states, (str, Path)):
        kwargs["states"] = _bank(str(Path(states).resolve()))
    return gym.make(env, **kwargs)


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """A conversation as ``{"role", "content"}`` strings, for dataset columns and logs.

    Tool calls are written as Hermes ``<tool_call>`` blocks after the content. The env,
    not this text, is what the model is prompted with.
    """
    out = []
    for m in messages:
        text = str(m.get("content") or "")
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            args = fn["arguments"]
            body = {
                "name": fn["name"],
                "arguments": json.loads(args) if isinstance(args, str) else args,
            }
            text += (
                "\n" if text else ""
            ) + f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"
        out.append({"role": str(m["role"]), "content": text})
    return out


def _source_of(source: Any) -> Any:
    if isinstance(source, (str, Path)):
        return _bank(str(Path(source).resolve()))
    return source


def state_rows(
    source: Any,
    *,
    focus: str | None = None,
    track: str | None = None,
    state_ids: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per state: ``state_id``, ``benchmark``, ``focus``, ``track``, ``outcome``, ``messages``.

    Args:
        source: a bank directory, a state source (:class:`~bat_gym.bank.StageBank`), or
            a :class:`~bat_gym.curriculum.wrapper.StageCurriculum` (its current round's rows in
            order, with ``pool`` and ``target`` added).
        focus: only states of this focus (``"S3"``, ``"E2E"``); not with a curriculum.
        track: only states of this track; not with a curriculum.
        state_ids: exactly these states, in this order (repeats allowed).

    Raises:
        ValueError: filters given with a curriculum, or no state matches.
    """
    from bat_gym.curriculum.wrapper import StageCurriculum

    if isinstance(source, StageCurriculum):
        if focus is not None or track is not None or state_ids is not None:
            raise ConfigError(
                "a curriculum chooses its own states; pass focus/track/state_ids with a bank instead"
            )
        states = source.env.unwrapped.states
        rows = []
        for r in source.current_round:
            row = _row(states.get(r.state_id))
            row.update(pool=r.pool, target=r.target)
            rows.append(row)
        return rows
    states = _source_of(source)
    ids = list(state_ids) if state_ids is not None else states.select(focus=focus, track=track)
    if not ids:
        raise ConfigError(f"no states with focus {focus!r} and track {track!r} in {source!r}")
    return [_row(states.get(i)) for i in ids]


def _row(state: Any) -> dict[str, Any]:
    return {
        "state_id": state.state_id,
        "benchmark": state.benchmark,
        "focus": state.focus,
        "track": state.track,
        "outcome": state.outcome,
        "messages": [dict(m) for m in state.messages],
    }


def state_id_of(row: Mapping[str, Any]) -> str:
    """The ``state_id`` of a trainer's dataset row: top level, or in ``extra_info``.

    Raises:
        KeyError: the row names no state.
    """
    value = row.get("state_id")
    if value is None:
        extra = row.get("extra_info")
        if isinstance(extra, Mapping):
            value = extra.get("state_id")
    if value is None:
        raise KeyError(
            f"the dataset row names no state: expected a 'state_id' column or "
            f"extra_info['state_id'], got keys {sorted(row)}; build rows with bat_gym.integrations"
        )
    return str(value)
