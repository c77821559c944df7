"""SkyRL: a bat_gym env as a SkyRL-Gym ``BaseTextEnv``.

SkyRL's generator makes one env per trajectory with
``skyrl_gym.make(env_class, env_config=..., extras=<the dataset row's extra fields>)``,
calls ``init(prompt)`` for the opening conversation, then ``step(text)`` per assistant
turn, and renders the returned ``observations`` (OpenAI-format messages) with the chat
template itself, masking them out of the loss. :class:`BatTextEnv` maps that onto a
bat_gym env: ``init`` resets to the row's ``state_id`` (SkyRL's samples of a row share
it) and returns the env's conversation in place of the dataset's prompt; ``step``
returns the env's new messages (tool results, or the error for a malformed call) and,
on the last step, the rubric reward.

The tool schemas ride in ``info["tools"]``, not in the messages: SkyRL renders the
prompt without tools unless the generator's ``chat_template_kwargs`` carries them
(:func:`chat_template_kwargs`).

>>> register_env()  # doctest: +SKIP
>>> skyrl_dataset("banks/med", focus="S3").to_parquet("train.parquet")  # doctest: +SKIP
>>> # generator.chat_template_kwargs = chat_template_kwargs(); environment.env_class = bat_gym
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bat_gym.integrations._states import conversation_text, make_env, state_id_of, state_rows
from bat_gym.rollout import step

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError as exc:
    raise ImportError("bat_gym.integrations.skyrl needs SkyRL-Gym: pip install skyrl-gym") from exc

if TYPE_CHECKING:
    import datasets

__all__ = ["ENV_CLASS", "BatTextEnv", "chat_template_kwargs", "register_env", "skyrl_dataset"]

ENV_CLASS = "bat_gym"
"""The ``env_class`` rows carry and :func:`register_env` registers."""


def _plain(value: Any) -> Any:
    # SkyRL hands configs over as OmegaConf containers; gym.make wants plain values.
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


class BatTextEnv(BaseTextEnv):
    """A SkyRL-Gym text env playing one bat_gym episode.

    Args:
        env_config: SkyRL's per-env config (``skyrl_gym_config.bat_gym``): ``env``, a
            ``bat/...-v0`` id (default ``bat/E2E-v0``), and ``env_kwargs``, its
            ``gym.make`` keyword arguments (e.g. ``states: banks/med``).
        extras: the dataset row's extra fields; ``state_id`` (or
            ``extra_info.state_id``) names the state to play.
    """

    def __init__(
        self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        config = _plain(env_config or {})
        self.env_id: str = config.get("env", "bat/E2E-v0")
        self.env_kwargs: dict[str, Any] = dict(config.get("env_kwargs") or {})
        self.state_id = state_id_of(extras or {})
        self._env: Any = None
        self._info: dict[str, Any] = {}
        self._reward = 0.0
        self._verdict: Any = None

    def init(self, prompt: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Reset to the row's state and return its conversation (``prompt`` is not used).

        Returns:
            The env's messages (OpenAI chat format) and metadata: ``state_id``,
            ``stage``, ``track`` and the tool schemas (``tools``).
        """
        if self._env is None:
            self._env = make_env(self.env_id, self.env_kwargs)
        _, self._info = self._env.reset(options={"state_id": self.state_id})
        self.turns = 0
        messages = [dict(m) for m in self._info["messages"]]
        return messages, {
            "state_id": self._info["state_id"],
            "stage": self._info["stage"],
            "track": self._info["track"],
            "tools": list(self._info["tools"]),
        }

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Step the env with the assistant's message.

        ``observations`` are the messages the env added after the assistant's turn;
        on the last step they are empty (nothing is generated after them) and the
        env's reply is in ``metadata["final_observation"]``.
        """
        if self._env is None:
            raise RuntimeError("call init() before step()")
        before = len(self._info["messages"])
        answer = step(self._env, action, turn=self.turns + 1)  # bat_gym.rollout: the one step
        obs, reward, info = answer.observation, answer.reward, answer.info
        terminated, truncated = answer.terminated, answer.truncated
        self._info = info
        self.turns += 1
        done = bool(terminated or truncated)
        metadata: dict[str, Any] = {
            "state_id": info["state_id"],
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "tool_calls": info["tool_calls"],
        }
        if done:
            self._reward = float(reward)
            self._verdict = info.get("verdict")
            metadata["final_observation"] = obs
            if self._verdict is not None:
                metadata["verdict"] = self._verdict.model_dump(mode="json")
        new = [dict(m) for m in info["messages"][before + 1 :]]
        return BaseTextEnvStepOutput(
            observations=[] if done else new,
            reward=float(reward),
            done=done,
            metadata=metadata,
        )

    def get_metrics(self) -> dict[str, Any]:
        """Per-episode numbers SkyRL averages: turns, tool calls, reward, task score."""
        verdict = self._verdict
        return {
            "turns": self.turns,
            "tool_calls": self._info.get("tool_calls", 0),
            "reward": self._reward,
            "task_score": None if verdict is None else verdict.task_score,
        }

    def close(self) -> None:
        """Release the env's sandbox."""
        if self._env is not None:
            self._env.close()
            self._env = None


def chat_template_kwargs(benchmark: Any = None) -> dict[str, Any]:
    """The generator's ``chat_template_kwargs`` that put bat_gym's tool schemas in the prompt.

    Args:
        benchmark: a benchmark (or its registered name) whose own tools join the
            built-in ones; None: the built-in tools only.
    """
    from bat_gym.core.protocol import TOOLS

    tools = [dict(t) for t in TOOLS]
    if benchmark is not None:
        from bat_gym.benchmark import Benchmark
        from bat_gym.catalog import get_benchmark

        bench = benchmark if isinstance(benchmark, Benchmark) else get_benchmark(benchmark)
        tools += [t.schema() for t in bench.tools()]
    return {"tools": tools}


def register_env(name: str = ENV_CLASS) -> None:
    """Register :class:`BatTextEnv` with SkyRL-Gym under ``name`` (idempotent)."""
    import skyrl_gym

    if name not in skyrl_gym.registry:
        skyrl_gym.register(id=name, entry_point=f"{__name__}:BatTextEnv")


def skyrl_dataset(
    source: Any,
    *,
    focus: str | None = None,
    track: str | None = None,
    state_ids: Sequence[str] | None = None,
    env_class: str = ENV_CLASS,
) -> datasets.Dataset:
    """Rows for SkyRL's prompt dataset: one per state; write them with ``.to_parquet(path)``.

    Columns: ``prompt`` (the state's conversation as role/content text; the env's
    ``init`` supplies the real one), ``env_class``, ``reward_spec`` (unused: the env
    returns the reward), ``state_id``, and ``extra_info`` (``focus``, ``track``).

    Args:
        source: a bank directory, a :class:`~bat_gym.bank.StageBank`, or a
            :class:`~bat_gym.curriculum.wrapper.StageCurriculum` (its current round in order).
        focus: only states of this focus.
        track: only states of this track.
        state_ids: exactly these states, in order.
        env_class: the registered env name.
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the train extra brings it
        raise ImportError("skyrl_dataset needs datasets: pip install 'bat-gym[train]'") from exc

    rows = [
        {
            "prompt": conversation_text(row["messages"]),
            "env_class": env_class,
            "data_source": f"bat_gym/{row['benchmark']}",
            "reward_spec": {"method": "env", "ground_truth": ""},
            "state_id": row["state_id"],
            "extra_info": {"focus": row["focus"], "track": row["track"]},
        }
        for row in state_rows(source, focus=focus, track=track, state_ids=state_ids)
    ]
    return datasets.Dataset.from_list(rows)
