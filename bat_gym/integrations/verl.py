"""verl: a bat_gym env as an agent loop of verl's multi-turn rollout.

verl (``verl.experimental.agent_loop``) instantiates one agent loop per sample and
calls ``await loop.run(sampling_params, **row)`` with the dataset row's fields.
:class:`BatAgentLoop` (a subclass of verl's ``AgentLoopBase``, built when first
accessed so that this module imports without verl) resets a bat_gym env to the row's
``state_id`` (verl's ``rollout.n`` samples of a row share it), generates each turn
through verl's server manager token in, token out, and returns an
``AgentLoopOutput`` whose ``response_mask`` is 1 on sampled tokens and 0 on the env's
replies, with the rubric reward as ``reward_score`` (verl then skips its reward
manager for the sample).

Setup: rows from :func:`verl_dataset` (written to parquet), an agent loop config
from :func:`agent_loop_config`, and in the trainer config
``actor_rollout_ref.rollout.mode=async``,
``actor_rollout_ref.rollout.agent.agent_loop_config_path=<that file>``.

The token bookkeeping is :class:`~bat_gym.rollout.TokenEpisode` on the one episode
loop, shared with the other adapters; :func:`run_episode` and :func:`agent_loop_fields` are the
parts of the loop that need no verl.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from bat_gym.integrations._states import conversation_text, make_env, state_id_of, state_rows
from bat_gym.rollout.runner import Runner
from bat_gym.rollout.token_episode import AsyncGenerate, CutTurn, EpisodeResult, TokenEpisode

if TYPE_CHECKING:
    import datasets
    import gymnasium as gym

__all__ = [
    "AGENT_NAME",
    "AsyncGenerate",
    "BatAgentLoop",  # noqa: F822 - built on first access by the module __getattr__
    "agent_loop_config",
    "agent_loop_fields",
    "run_episode",
    "verl_dataset",
]

AGENT_NAME = "bat_gym"
"""The ``agent_name`` rows carry and the agent loop config registers."""


def verl_dataset(
    source: Any,
    *,
    focus: str | None = None,
    track: str | None = None,
    state_ids: Sequence[str] | None = None,
    agent_name: str = AGENT_NAME,
) -> datasets.Dataset:
    """Rows for verl's ``RLHFDataset``: one per state; write them with ``.to_parquet(path)``.

    Columns: ``prompt`` (the state's conversation as role/content text; verl filters
    over-long prompts on it, the agent loop prompts with what the env renders),
    ``agent_name``, ``data_source`` (``bat_gym/<benchmark>``), ``ability``,
    ``reward_model`` (unused: the loop returns the reward) and ``extra_info`` with
    ``state_id``, ``focus``, ``track`` and ``index``.

    Args:
        source: a bank directory, a :class:`~bat_gym.bank.StageBank`, or a
            :class:`~bat_gym.curriculum.wrapper.StageCurriculum` (its current round in order).
        focus: only states of this focus.
        track: only states of this track.
        state_ids: exactly these states, in order.
        agent_name: the agent loop to run (the name in :func:`agent_loop_config`).
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the train extra brings it
        raise ImportError("verl_dataset needs datasets: pip install 'bat-gym[train]'") from exc

    rows = []
    for i, row in enumerate(state_rows(source, focus=focus, track=track, state_ids=state_ids)):
        rows.append(
            {
                "prompt": conversation_text(row["messages"]),
                "agent_name": agent_name,
                "data_source": f"bat_gym/{row['benchmark']}",
                "ability": "agent",
                # verl's schema expects the column; the reward comes from the env.
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {
                    "index": i,
                    "state_id": row["state_id"],
                    "focus": row["focus"],
                    "track": row["track"],
                },
            }
        )
    return datasets.Dataset.from_list(rows)


def agent_loop_config(
    path: str | Path,
    *,
    env: str = "bat/E2E-v0",
    env_kwargs: Mapping[str, Any] | None = None,
    name: str = AGENT_NAME,
    max_new_tokens_per_turn: int | None = None,
    stop_token_ids: Sequence[int] | None = None,
    cut_turn: CutTurn = "end",
) -> Path:
    """Write the YAML that ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names.

    Args:
        path: the file to write.
        env: the ``bat/...-v0`` id each sample plays.
        env_kwargs: ``gym.make`` keyword arguments (plain YAML values, e.g. a bank path
            as ``states``).
        name: the agent name rows carry in ``agent_name``.
        max_new_tokens_per_turn: cap on one turn's sampled tokens.
        stop_token_ids: the tokens verl's rollout server stops at, when they are not
            the chat template's end-of-turn token and the tokenizer's eos.
        cut_turn: a turn cut by ``max_new_tokens_per_turn`` (no stop token): ``"end"``
            the episode there, or ``"act"`` on its text.

    Returns:
        ``path``.
    """
    import yaml

    entry: dict[str, Any] = {
        "name": name,
        "_target_": f"{__name__}.BatAgentLoop",
        "env": env,
        "env_kwargs": dict(env_kwargs or {}),
    }
    if max_new_tokens_per_turn is not None:
        entry["max_new_tokens_per_turn"] = max_new_tokens_per_turn
    if stop_token_ids is not None:
        entry["stop_token_ids"] = [int(t) for t in stop_token_ids]
    if cut_turn != "end":
        entry["cut_turn"] = cut_turn
    path = Path(path)
    path.write_text(yaml.safe_dump([entry], sort_keys=False))
    return path


async def run_episode(
    env: gym.Env[str, str],
    tokenizer: Any,
    generate: AsyncGenerate,
    *,
    state_id: str,
    max_response_tokens: int | None,
    max_new_tokens_per_turn: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    cut_turn: CutTurn = "end",
    on_restart: str = "ignore",
) -> EpisodeResult:
    """Play one episode from ``state_id`` with an async generator (:meth:`TokenEpisode.arun`).

    ``stop_token_ids`` are the tokens the generator stops at; default: the chat
    template's end-of-turn token and the tokenizer's eos. Pass the server's own when it
    stops at more (verl's vLLM and SGLang servers also stop at the model's generation
    config's eos ids): a turn ending in a token the episode does not know looks cut.
    ``cut_turn`` is what a turn that ends without a stop token does, ``on_restart``
    what a sandbox restarted by a tool call does (see :class:`~bat_gym.rollout.TokenEpisode`).
    """
    episode = TokenEpisode(
        env,
        tokenizer,
        max_response_tokens=max_response_tokens,
        max_new_tokens_per_turn=max_new_tokens_per_turn,
        stop_token_ids=stop_token_ids,
        chat_template_kwargs=chat_template_kwargs,
        cut_turn=cut_turn,
        on_restart=on_restart,
    )
    return await episode.arun(generate, state_id=state_id)


def agent_loop_fields(result: EpisodeResult) -> dict[str, Any]:
    """``AgentLoopOutput`` keyword arguments (all but ``metrics``) for a finished episode.

    ``num_turns`` counts chat turns as verl does: the prompt, each assistant turn and
    each env reply appended. ``extra_fields["reward_extra_info"]`` holds per-sample
    values verl logs next to the reward.
    """
    verdict = result.verdict
    return {
        "prompt_ids": list(result.prompt_ids),
        "response_ids": list(result.response_ids),
        "response_mask": list(result.response_mask),
        "response_logprobs": result.response_logprobs,
        "reward_score": float(result.reward),
        "num_turns": 1 + result.num_turns + result.num_replies,
        "extra_fields": {
            "reward_extra_info": {
                "state_id": result.state_id,
                "stop_reason": result.stop_reason,
                # A null verdict scores 0 here (verl has no way to drop a sample);
                # the flag lets a filter drop it.
                "verdict_null": verdict is not None and verdict.reward is None,
                "task_score": None if verdict is None else verdict.task_score,
            },
        },
    }


async def _play_sample(
    build_env: Callable[[], Any], tokenizer: Any, generate: AsyncGenerate, **episode: Any
) -> EpisodeResult:
    """One sample's episode (:func:`run_episode`'s keywords) on its own env, under the retry rule.

    A crashed sandbox or a lost env plays the episode again
    (:class:`~bat_gym.rollout.Runner`); the env is closed at the end.
    """

    async def play(env: Any) -> EpisodeResult:
        return await run_episode(env, tokenizer, generate, on_restart="raise", **episode)

    runner = Runner(build_env, workers=1)
    try:
        played = await runner.arun(play, what=f"an episode from {episode['state_id']}")
    finally:
        await asyncio.get_running_loop().run_in_executor(None, runner.close)
    return played.unwrap()


def _missing_for_agent_loop(exc: ImportError) -> str:
    """What to install when verl's agent loop cannot be imported, from the failed import."""
    missing = (exc.name or "").split(".")[0]
    if missing in ("", "verl"):
        return (
            "BatAgentLoop runs inside verl's agent loop: pip install 'bat-gym[verl]' "
            "(verl brings ray and an inference engine; see verl's install guide)"
        )
    return (
        f"verl is installed, but its agent loop imports {missing!r}, which is not: "
        f"pip install {missing} (pip install 'bat-gym[verl]' brings the ones verl "
        f"leaves out); the import failed with: {exc}"
    )


def _build_agent_loop() -> type:
    try:
        from verl.experimental.agent_loop.agent_loop import (
            AgentLoopBase,
            AgentLoopMetrics,
            AgentLoopOutput,
        )
    except ImportError as exc:
        raise ImportError(_missing_for_agent_loop(exc)) from exc

    class BatAgentLoop(AgentLoopBase):  # type: ignore[misc, valid-type]
        """A verl agent loop that plays one bat_gym episode per sample.

        Args:
            trainer_config: verl's trainer config wrapper (verl passes it).
            server_manager: verl's LLM server manager (verl passes it).
            tokenizer: the policy's tokenizer (verl passes it).
            processor: verl's processor, None for text models (verl passes it).
            env: the ``bat/...-v0`` id to play (from the agent loop config).
            env_kwargs: ``gym.make`` keyword arguments (from the agent loop config).
            max_new_tokens_per_turn: cap on one turn's sampled tokens.
            stop_token_ids: the tokens the rollout server stops at (from the agent loop
                config); default: the template's end-of-turn token and the eos.
            cut_turn: what a turn without a stop token does (from the agent loop
                config): ``"end"`` the episode or ``"act"`` on it.
            **kwargs: what verl's version of ``AgentLoopBase`` also takes (dataset
                class and config, ``name`` from the config file), passed on.
        """

        def __init__(
            self,
            trainer_config: Any,
            server_manager: Any,
            tokenizer: Any,
            processor: Any,
            *,
            env: str = "bat/E2E-v0",
            env_kwargs: Mapping[str, Any] | None = None,
            max_new_tokens_per_turn: int | None = None,
            stop_token_ids: Sequence[int] | None = None,
            cut_turn: CutTurn = "end",
            **kwargs: Any,
        ) -> None:
            super().__init__(trainer_config, server_manager, tokenizer, processor, **kwargs)
            self.env_id = env
            self.env_kwargs = dict(env_kwargs or {})
            self.max_new_tokens_per_turn = max_new_tokens_per_turn
            self.stop_token_ids = None if stop_token_ids is None else list(stop_token_ids)
            self.cut_turn: CutTurn = cut_turn
            rollout = trainer_config.config.actor_rollout_ref.rollout
            self.response_length = int(rollout.response_length)
            self.chat_template_kwargs = dict(
                trainer_config.config.get("data", {}).get("apply_chat_template_kwargs", {}) or {}
            )

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            """Play the row's state; ``kwargs`` are the dataset row's fields."""
            state_id = state_id_of(kwargs)
            request_id = uuid4().hex  # one id per episode: verl keeps it on one server

            async def generate(
                context_ids: list[int], max_new: int | None
            ) -> tuple[list[int], list[float] | None]:
                params = dict(sampling_params)
                if max_new is not None:
                    params["max_tokens"] = max_new
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=context_ids, sampling_params=params
                )
                return list(out.token_ids), out.log_probs

            result = await _play_sample(
                functools.partial(make_env, self.env_id, self.env_kwargs),
                self.tokenizer,
                generate,
                state_id=state_id,
                max_response_tokens=self.response_length,
                max_new_tokens_per_turn=self.max_new_tokens_per_turn,
                chat_template_kwargs=self.chat_template_kwargs,
                stop_token_ids=self.stop_token_ids,
                cut_turn=self.cut_turn,
            )
            return AgentLoopOutput(**agent_loop_fields(result), metrics=AgentLoopMetrics())

    BatAgentLoop.__module__ = __name__
    BatAgentLoop.__qualname__ = "BatAgentLoop"
    return BatAgentLoop


_built: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    # Built on first access, so the pure helpers above import without verl.
    if name == "BatAgentLoop":
        if name not in _built:
            _built[name] = _build_agent_loop()
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
