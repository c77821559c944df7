"""TRL's ``environment_factory`` with public tool methods: GRPO on bat_gym with no rollout_func.

TRL's ``GRPOTrainer(environment_factory=...)`` (TRL >= 1.16) makes one environment per
rollout, calls ``reset(**row)`` with the dataset row, turns every public method of the
environment's class into a tool the model may call (its type hints and Google
docstring are the schema), runs its own tool loop, and asks ``get_reward()`` once the
rollout ends. :class:`BatToolEnvironments` is such a factory over OpenEnv:

* each environment plays one OpenEnv session: a ``bat-gym serve openenv`` server's
  (``base_url``: OpenEnv's typed client, one WebSocket per rollout) or an in-process
  :class:`~bat_gym.integrations.openenv.BatOpenEnv`; either way the real StageEnv
  with the rubric reward plays the calls;
* its tool methods are the env's tools, ``execute_code``, ``finish`` and the
  benchmark's own, made from the env's tool schemas, so TRL prompts with exactly the
  schemas the env checks calls against; each call is one env step and returns the
  env's observation text;
* ``get_reward()`` is the rubric verdict's reward. A rollout that ends without
  ``finish`` (the model stopped calling tools, or TRL's limits cut it) is finished
  for it with a ``finish`` call, so the workspace is scored as the model left it.

This path is TRL's own tool loop: the model's tool calls are parsed by TRL's response
parser for the chat template and the env sees only the calls. The token-exact path,
where the env parses the model's text and masks its own replies, is
:class:`~bat_gym.integrations.trl.BatRollout` (``rollout_func``).

>>> from trl import GRPOConfig, GRPOTrainer  # doctest: +SKIP
>>> from bat_gym.integrations.trl import bat_dataset  # doctest: +SKIP
>>> environments = BatToolEnvironments("http://127.0.0.1:8000", benchmark="toy_pipeline")  # doctest: +SKIP
>>> trainer = GRPOTrainer(model, args=GRPOConfig(num_generations=8),  # doctest: +SKIP
...     train_dataset=bat_dataset("banks/toy"), environment_factory=environments)
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from bat_gym.core.errors import ConfigError
from bat_gym.integrations._states import EnvSpec, state_id_of
from bat_gym.integrations.openenv import BatAction, BatObservation, BatOpenEnv

__all__ = ["BatToolEnvironment", "BatToolEnvironments", "tool_environment_class"]

UNFINISHED_SUMMARY = "[the rollout ended without calling finish]"
"""The summary of the ``finish`` call that ends a rollout the model left unfinished."""

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


class BatToolEnvironment:
    """One rollout's OpenEnv session; its subclasses add one public method per env tool.

    Args:
        session: an OpenEnv environment (:class:`~bat_gym.integrations.openenv.BatOpenEnv`)
            or OpenEnv's blocking client of one (``BatEnvClient(...).sync()``).
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self._last: BatObservation | None = None

    def reset(self, **row: Any) -> None:
        """Restore the row's state (``state_id``); TRL passes the whole dataset row.

        Returns None: the row's ``prompt`` already holds the state's conversation.
        """
        self._last = _observation(self._session.reset(state_id=state_id_of(row)))

    def get_reward(self) -> float:
        """The rubric reward of the rollout, finishing it first if the model did not."""
        if self._last is None:
            raise ConfigError("get_reward before reset: TRL resets each environment first")
        if not self._last.done:
            self._call("finish", {"summary": UNFINISHED_SUMMARY})
        return float(self._last.reward or 0.0)

    @property
    def observation(self) -> BatObservation | None:
        """The last observation (the final one carries the verdict and stage scores)."""
        return self._last

    def _close(self) -> None:
        # Not public: TRL offers every public method to the model as a tool.
        self._session.close()

    def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        """Run one call as one env step; the text the model reads back."""
        self._last = _observation(self._session.step(BatAction(tool=tool, arguments=arguments)))
        if self._last.done and self._last.verdict is not None:
            return f"{self._last.text}\n\n[episode ended; reward {self._last.reward:.3f}]"
        return self._last.text


def _observation(result: Any) -> BatObservation:
    """The observation of an environment's answer or of a client's ``StepResult``."""
    return result if isinstance(result, BatObservation) else result.observation


def tool_environment_class(
    tool_schemas: Sequence[Mapping[str, Any]], name: str = "BatToolEnvironment"
) -> type[BatToolEnvironment]:
    """A :class:`BatToolEnvironment` subclass with one public method per tool schema.

    Each method's signature, type hints and Google docstring are made from the tool's
    OpenAI function schema (top-level properties: JSON types to Python types, ``enum``
    to ``Literal``), so ``transformers.utils.get_json_schema`` gives TRL the schema
    back; the call's arguments go to the env unchanged.

    Raises:
        ConfigError: a tool is named like a method TRL itself calls (``reset``,
            ``get_reward``).
    """
    methods: dict[str, Any] = {}
    for schema in tool_schemas:
        function = schema["function"]
        if function["name"] in ("reset", "get_reward") or function["name"].startswith("_"):
            raise ConfigError(
                f"a tool named {function['name']!r} cannot be a TRL environment method; rename the tool"
            )
        methods[function["name"]] = _tool_method(function)
    return type(name, (BatToolEnvironment,), methods)


def _tool_method(function: Mapping[str, Any]) -> Any:
    tool = function["name"]
    params = function.get("parameters") or {}
    props: Mapping[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or ())

    def call(self: BatToolEnvironment, **arguments: Any) -> str:
        return self._call(tool, {k: v for k, v in arguments.items() if v is not None})

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    hints: dict[str, Any] = {"return": str}
    lines = [(function.get("description") or f"Call the {tool} tool.").strip(), "", "Args:"]
    for arg, prop in sorted(props.items(), key=lambda kv: kv[0] not in required):
        hint = _hint(prop)
        optional = arg not in required
        hints[arg] = hint | None if optional else hint
        parameters.append(
            inspect.Parameter(
                arg,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if optional else inspect.Parameter.empty,
                annotation=hints[arg],
            )
        )
        about = prop.get("description") or (
            f"One of {', '.join(map(str, prop['enum']))}." if prop.get("enum") else f"The {arg}."
        )
        lines.append(f"    {arg}: {about.strip()}")
    lines += [
        "",
        "Returns:",
        "    The env's answer: the tool's result or why the call was refused.",
    ]
    call.__name__ = call.__qualname__ = tool
    call.__doc__ = "\n".join(lines if props else lines[:1] + lines[-3:])
    call.__annotations__ = hints
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    return call


def _hint(prop: Mapping[str, Any]) -> Any:
    if prop.get("enum"):
        return Literal[tuple(prop["enum"])]  # type: ignore[valid-type]
    kind = prop.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first non-null type
        kind = next((k for k in kind if k != "null"), "string")
    return _JSON_TYPES.get(kind or "string", str)


class BatToolEnvironments:
    """TRL's ``environment_factory``: a new :class:`BatToolEnvironment` per call.

    Args:
        base_url: a ``bat-gym serve openenv`` server (``http://127.0.0.1:PORT``): each
            environment is a session of OpenEnv's typed client. None: each plays an
            in-process :class:`~bat_gym.integrations.openenv.BatOpenEnv`.
        benchmark: the benchmark whose tools the methods are (default: ``benchmark`` in
            ``env_kwargs``, else the default benchmark). The server must play it.
        env: in-process only: the ``bat/...-v0`` id or env factory.
        env_kwargs: in-process only: ``gym.make`` keyword arguments.
        message_timeout_s: with a server: how long a call may take, seconds.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        benchmark: Any = None,
        env: EnvSpec = "bat/E2E-v0",
        env_kwargs: Mapping[str, Any] | None = None,
        message_timeout_s: float = 600.0,
    ) -> None:
        from bat_gym.env import StageEnv

        self.base_url = base_url
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        if base_url is not None and self.env_kwargs:
            raise ConfigError("env_kwargs configure an in-process env; the server has its own")
        self.message_timeout_s = message_timeout_s
        schemas = StageEnv(benchmark=benchmark or self.env_kwargs.get("benchmark")).tool_schemas
        self.environment_class = tool_environment_class(schemas)
        self.made: list[BatToolEnvironment] = []

    def __call__(self) -> BatToolEnvironment:
        """A new environment (TRL calls this once per concurrent rollout and reuses them)."""
        if self.base_url is None:
            session: Any = BatOpenEnv(self.env, self.env_kwargs)
        else:
            from bat_gym.integrations.openenv_client import BatEnvClient

            client = BatEnvClient(base_url=self.base_url, message_timeout_s=self.message_timeout_s)
            session = client.sync()
        environment = self.environment_class(session)
        self.made.append(environment)
        return environment

    def close(self) -> None:
        """Close every environment made (their sessions, so their sandboxes)."""
        for environment in self.made:
            environment._close()
        self.made.clear()

    def __enter__(self) -> BatToolEnvironments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
