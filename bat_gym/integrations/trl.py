"""TRL: train on ``bat/...-v0`` envs with ``GRPOTrainer`` (TRL >= 1.16).

bat_gym plugs into two of ``GRPOTrainer``'s arguments, used together:

* ``environment_factory``: TRL makes one :class:`BatEnvironment` per rollout and calls
  ``reset(**row)`` with the dataset row, so each rollout restores the row's state
  (``state_id``). TRL repeats a row ``num_generations`` times, so a GRPO group shares
  its state. The environment has no public tool methods: bat_gym's env parses and runs
  the tool calls, so TRL's own tool loop stays off.
* ``rollout_func``: :class:`BatRollout` plays those envs turn by turn with the trainer's
  model through :class:`~bat_gym.rollout.TokenEpisode` and returns the
  token sequences, with ``env_mask`` 0 on the env's replies (TRL multiplies it into the
  loss mask, so tool results never enter the loss).

This is the token-exact path. For TRL's own tool loop instead (an environment whose
public methods are the env's tools, no ``rollout_func``), see
:mod:`bat_gym.integrations.trl_tools`.

The reward is the rubric verdict, read by :func:`rubric_reward` from the rollout's
``bat_reward`` field; it returns None for a null verdict, which TRL leaves out of the
group baseline.

>>> from trl import GRPOConfig, GRPOTrainer  # doctest: +SKIP
>>> rollout = BatRollout("bat/Validate-v0", env_kwargs={"states": "banks/med"})  # doctest: +SKIP
>>> trainer = GRPOTrainer(  # doctest: +SKIP
...     model, reward_funcs=rubric_reward, args=GRPOConfig(num_generations=8),
...     train_dataset=bat_dataset("banks/med", focus="S3"),
...     rollout_func=rollout, environment_factory=rollout.environment_factory)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bat_gym.core.errors import BatGymError
from bat_gym.integrations._states import (
    EnvSpec,
    conversation_text,
    make_env,
    state_id_of,
    state_rows,
)
from bat_gym.rollout.chat_tokens import default_stop_token_ids
from bat_gym.rollout.token_episode import (
    BatchGenerate,
    CutTurn,
    EpisodeResult,
    TokenEpisode,
    play_in_lockstep,
)

if TYPE_CHECKING:
    import datasets
    import gymnasium as gym

__all__ = ["BatEnvironment", "BatRollout", "bat_dataset", "rubric_reward"]


def bat_dataset(
    source: Any,
    *,
    focus: str | None = None,
    track: str | None = None,
    state_ids: Sequence[str] | None = None,
) -> datasets.Dataset:
    """A TRL prompt dataset: one row per state, which TRL repeats ``num_generations`` times.

    Columns: ``prompt`` (the state's conversation as role/content text: for logs; the
    model is prompted with what the env renders), ``state_id``, ``benchmark``,
    ``focus``, ``track``, ``outcome`` (and ``pool``, ``target`` from a curriculum).

    Args:
        source: a bank directory, a :class:`~bat_gym.bank.StageBank`, or a
            :class:`~bat_gym.curriculum.wrapper.StageCurriculum` (its current round in order;
            set ``GRPOConfig(shuffle_dataset=False)`` to keep that order).
        focus: only states of this focus.
        track: only states of this track.
        state_ids: exactly these states, in order.
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the train extra brings it
        raise ImportError("bat_dataset needs datasets: pip install 'bat-gym[trl]'") from exc

    rows = state_rows(source, focus=focus, track=track, state_ids=state_ids)
    for row in rows:
        row["prompt"] = conversation_text(row.pop("messages"))
    return datasets.Dataset.from_list(rows)


def rubric_reward(
    completions: Sequence[Any],
    bat_reward: Sequence[float | None],
    bat_state_id: Sequence[str],
    state_id: Sequence[str] | None = None,
    **_: Any,
) -> list[float | None]:
    """TRL reward function: the rubric reward of each rollout.

    TRL calls reward functions with every dataset column and rollout field as keyword
    arguments, so the signature takes the ones it reads and ignores the rest.

    Args:
        completions: the completions (only their number is used).
        bat_reward: the env's final reward per rollout, None for a null verdict.
        bat_state_id: the state each rollout played.
        state_id: the dataset column: the state each row asked for.

    Raises:
        BatGymError: a rollout played another state than its row asked for.
    """
    if len(bat_reward) != len(completions):
        raise BatGymError(
            f"expected one bat_reward per completion ({len(completions)}), got {len(bat_reward)}; "
            "pass rollout_func=BatRollout(...) to GRPOTrainer"
        )
    if state_id is not None:
        for want, got in zip(state_id, bat_state_id, strict=True):
            if want != got:
                raise BatGymError(f"a rollout of state {want!r} played state {got!r}")
    return list(bat_reward)


class BatEnvironment:
    """One TRL environment: a bat_gym env that ``reset(**row)`` restores to the row's state.

    TRL turns every public method of an environment into a tool the model may call;
    this class has only ``reset``, because the tools live in the bat_gym env.
    """

    def __init__(self, env: gym.Env[str, str]) -> None:
        self._env = env
        self._info: dict[str, Any] | None = None

    def reset(self, **row: Any) -> None:
        """Reset to ``row["state_id"]``; TRL passes the whole dataset row, prompt included."""
        _, self._info = self._env.reset(options={"state_id": state_id_of(row)})

    @property
    def env(self) -> gym.Env[str, str]:
        """The bat_gym env."""
        return self._env

    @property
    def info(self) -> dict[str, Any]:
        """The ``info`` of the last reset."""
        if self._info is None:
            raise RuntimeError("the environment has not been reset to a state yet")
        return self._info


class BatRollout:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` that plays bat_gym episodes.

    Pass the instance as ``rollout_func`` and its :meth:`environment_factory` as
    ``environment_factory``. All rollouts of a batch advance in lockstep: each turn,
    the unfinished ones are generated as one batch.

    Args:
        env: a ``bat/...-v0`` id or a zero-argument factory of bat_gym envs.
        env_kwargs: keyword arguments of ``gym.make`` (e.g. ``{"states": "banks/med"}``).
        max_response_tokens: the token budget of a rollout's completion (sampled plus
            reply tokens); default: the trainer's ``max_completion_length``.
        max_new_tokens_per_turn: cap on one turn's sampled tokens; None: the remaining
            budget.
        generate: a batch generator to use instead of the trainer's model (e.g. a vLLM
            server); it must sample from the policy being trained. The default samples
            with ``model.generate`` and the trainer's generation config, on one process
            or DDP; ZeRO-3 and FSDP need a ``generate`` of their own.
        stop_token_ids: the tokens that end a turn, which ``generate`` stops at. Default:
            the trainer's ``eos_token_ids`` (or the tokenizer's eos) and the chat
            template's end-of-turn token; the default generator stops at them.
        cut_turn: a turn that ends without a stop token (``max_new_tokens_per_turn`` ran
            out): ``"end"`` the rollout there, or ``"act"`` on its text (see
            :class:`~bat_gym.rollout.TokenEpisode`).
    """

    def __init__(
        self,
        env: EnvSpec = "bat/E2E-v0",
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_response_tokens: int | None = None,
        max_new_tokens_per_turn: int | None = None,
        generate: BatchGenerate | None = None,
        stop_token_ids: Sequence[int] | None = None,
        cut_turn: CutTurn = "end",
    ) -> None:
        if max_response_tokens is not None and max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be positive, got {max_response_tokens}")
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.max_response_tokens = max_response_tokens
        self.max_new_tokens_per_turn = max_new_tokens_per_turn
        self.generate = generate
        self.stop_token_ids = None if stop_token_ids is None else [int(t) for t in stop_token_ids]
        self.cut_turn: CutTurn = cut_turn
        self.last_results: list[EpisodeResult] = []
        self._made: list[BatEnvironment] = []

    def environment_factory(self) -> BatEnvironment:
        """A new environment (TRL calls it once per concurrent rollout and reuses them)."""
        environment = BatEnvironment(make_env(self.env, self.env_kwargs))
        self._made.append(environment)
        return environment

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any] | None]:
        """Play one episode per prompt; TRL's ``rollout_func(prompts, trainer)``.

        Returns:
            ``prompt_ids``, ``completion_ids``, ``logprobs`` (None: TRL recomputes
            them), ``env_mask`` (1 sampled, 0 env reply), and per rollout the fields
            TRL forwards to reward functions: ``bat_reward``, ``bat_state_id``,
            ``bat_num_turns``, ``bat_stop_reason``.
        """
        environments = getattr(trainer, "environments", None)
        if (
            environments is None
            or len(environments) != len(prompts)
            or not all(isinstance(e, BatEnvironment) for e in environments)
        ):
            raise BatGymError(
                "BatRollout plays the environments TRL reset to each row's state: pass "
                "environment_factory=rollout.environment_factory to GRPOTrainer as well"
            )
        tokenizer = trainer.processing_class
        budget = self.max_response_tokens or trainer.max_completion_length
        template_kwargs = getattr(trainer, "chat_template_kwargs", None)
        stops = self.stop_token_ids
        if stops is None:
            # The trainer's eos alone may not end a chat turn (a Qwen base tokenizer's eos
            # is <|endoftext|>, its turns end in <|im_end|>): add the template's.
            eos = list(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
            stops = list(dict.fromkeys(eos + default_stop_token_ids(tokenizer, template_kwargs)))
        episodes = []
        for environment in environments:
            episode = TokenEpisode(
                environment.env,
                tokenizer,
                max_response_tokens=budget,
                max_new_tokens_per_turn=self.max_new_tokens_per_turn,
                stop_token_ids=stops,
                chat_template_kwargs=template_kwargs,
                cut_turn=self.cut_turn,
            )
            episode.begin(environment.info)
            episodes.append(episode)
        results = play_in_lockstep(episodes, self.generate or _model_generator(trainer, stops))
        self.last_results = results
        return {
            "prompt_ids": [r.prompt_ids for r in results],
            "completion_ids": [r.response_ids for r in results],
            "logprobs": None,
            "env_mask": [r.response_mask for r in results],
            "bat_reward": [r.reward_or_none for r in results],
            "bat_state_id": [r.state_id for r in results],
            "bat_num_turns": [r.num_turns for r in results],
            "bat_stop_reason": [r.stop_reason for r in results],
        }

    def close(self) -> None:
        """Close every env this rollout made (their sandboxes)."""
        for environment in self._made:
            environment.env.close()
        self._made.clear()

    def __enter__(self) -> BatRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _model_generator(trainer: Any, stops: Sequence[int]) -> BatchGenerate:
    """Sample one turn per context with the trainer's model and generation config."""
    if getattr(trainer, "use_vllm", False):
        raise BatGymError(
            "BatRollout samples with the trainer's model by default; with use_vllm=True pass "
            "BatRollout(generate=...) backed by the vLLM engine"
        )
    import copy

    import torch
    from trl.models.utils import unwrap_model_for_generation

    tokenizer = trainer.processing_class
    stop_set = set(stops)

    def generate(contexts: list[list[int]], max_new: list[int | None]) -> list[list[int]]:
        width = max(len(c) for c in contexts)
        pad = tokenizer.pad_token_id
        device = trainer.accelerator.device
        # Left padding, so every row's next token comes right after its context.
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], device=device)
        mask = torch.tensor(
            [[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device
        )
        caps = [m for m in max_new if m is not None]
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max(caps) if caps else trainer.max_completion_length
        # Stop where the episode says a turn ends, not only at the config's eos.
        config.eos_token_id = list(stops)
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                generation_kwargs=getattr(trainer, "generation_kwargs", None),
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        turns = []
        for row, cap in zip(out[:, width:].tolist(), max_new, strict=True):
            # Keep up to the first stop token: what follows is padding.
            end = next((i + 1 for i, t in enumerate(row) if t in stop_set), len(row))
            turns.append(row[: min(end, cap) if cap is not None else end])
        return turns

    return generate
