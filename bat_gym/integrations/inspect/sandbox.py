"""``bat_gym``: an Inspect sandbox provider that is the project's own sandbox, behind a StageEnv.

Inspect asks a sandbox provider for one environment per sample
(:meth:`SandboxEnvironment.sample_init`). This provider builds that sample's
rubric-wrapped :class:`~bat_gym.env.StageEnv` (which makes its sandbox with
:func:`bat_gym.core.sandbox.make_sandbox`: the benchmark's caps and requirements, the
execution record's provenance, private answers reachable only by tools that declare
them) and resets it to the sample's state. Nothing reaches the workspace except
through the env:

* ``exec`` runs the command as one ``execute_code`` call (bash), one env step: it
  counts against the episode's budgets and lands in its execution record, like any
  tool call the agent makes;
* ``read_file`` reads the workspace between calls (reading changes nothing the
  rubric scores);
* ``write_file`` is refused: a file written from outside a tool call would be
  nobody's recorded work (the rubric drops unattributed changes), so an agent writes
  through ``execute_code``.

The stage env's verifier does not run inside the sandbox: it freezes the workspace
and verifies it from the host (:class:`~bat_gym.rubrics.verifier.reward.RubricReward`), so
the Inspect scorer reads the verdict from the sample's episode
(:attr:`StageSandbox.episode`).
"""

from __future__ import annotations

import shlex
import threading
import uuid
from pathlib import PurePosixPath
from typing import Any, Literal, overload

from inspect_ai.util import ExecResult, SandboxEnvironment, sandboxenv
from pydantic import BaseModel, ConfigDict, Field

from bat_gym.core.errors import ConfigError
from bat_gym.core.spec import Budgets
from bat_gym.integrations.inspect.episode import StageEpisode

__all__ = ["SANDBOX_NAME", "StageSandbox", "StageSandboxConfig", "register_states"]

SANDBOX_NAME = "bat_gym"
"""The provider's name in a task's ``sandbox=`` (``("bat_gym", StageSandboxConfig(...))``)."""

# State sources a task built in memory (held-out start states never enter a bank),
# by the token its sandbox config names: a config must serialize into the log.
_SOURCES: dict[str, Any] = {}
_SOURCES_LOCK = threading.Lock()


def register_states(source: Any, *, keep: Any = None) -> str:
    """Keep an in-memory state source for this process's samples; returns its token.

    Args:
        source: the state source (``select``, ``get``, ``store``).
        keep: an object to keep alive with it (the temporary directory of its store).
    """
    token = uuid.uuid4().hex
    with _SOURCES_LOCK:
        _SOURCES[token] = (source, keep)
    return token


class StageSandboxConfig(BaseModel):
    """How the sample's env is made (recorded in the Inspect log's task spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str = Field(description="The registered benchmark name.")
    stage: str = Field("E2E", description="The env's focus: E2E, a stage id or a stage name.")
    backend: str = Field("local", description="The project's sandbox backend: local or docker.")
    protocol: str = Field("hermes", description="How the state's prompt writes tool calls.")
    bank: str | None = Field(
        None, description="A Stage Bank directory; None: the benchmark's default states."
    )
    states_token: str | None = Field(
        None, description="An in-memory state source of this process (register_states)."
    )
    budgets: dict[str, Any] | None = Field(
        None, description="Episode budgets (bat_gym.core.spec.Budgets); None: the benchmark's."
    )


def _states_of(config: StageSandboxConfig) -> Any:
    if config.states_token is not None:
        with _SOURCES_LOCK:
            source, _ = _SOURCES.get(config.states_token, (None, None))
        if source is None:
            raise ConfigError(
                "the sample's held-out states were built by another process; run the task "
                "with `inspect eval` in one process (they are built in memory, never stored)"
            )
        return source
    return config.bank


@sandboxenv(name=SANDBOX_NAME)
class StageSandbox(SandboxEnvironment):
    """One sample's StageEnv and the project's sandbox it runs tool calls in.

    Attributes:
        episode: the sample's episode; the Inspect tools step it, the scorer reads it.
    """

    def __init__(self, episode: StageEpisode) -> None:
        super().__init__()
        self.episode = episode

    @classmethod
    def default_concurrency(cls) -> int | None:
        """Two at once: each sample holds a live sandbox with its own memory cap."""
        return 2

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:  # noqa: D102
        return StageSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: Any, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        """Make the sample's env and reset it to ``metadata["state_id"]``."""
        from bat_gym.rubrics.verifier.reward import RubricReward, make_env

        if not isinstance(config, StageSandboxConfig):
            raise ConfigError(
                f"the {SANDBOX_NAME} sandbox takes a StageSandboxConfig, got {config!r}; "
                "use the bat_gym tasks (inspect eval bat_gym/stage) or build one"
            )
        state_id = metadata.get("state_id")
        if not state_id:
            raise ConfigError("a bat_gym sample names its state in metadata['state_id']")
        env = make_env(
            config.stage,
            benchmark=config.benchmark,
            backend=config.backend,
            protocol=config.protocol,
            states=_states_of(config),
            budgets=None if config.budgets is None else Budgets(**config.budgets),
        )
        assert isinstance(env, RubricReward)
        episode = StageEpisode(env, str(state_id))
        try:
            await episode.reset()
        except BaseException:
            await episode.close()
            raise
        return {"default": cls(episode)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: Any,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Close each sample env's StageEnv (its sandbox and service)."""
        for env in environments.values():
            if isinstance(env, StageSandbox):
                await env.episode.close()

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` as one ``execute_code`` (bash) call: one env step, recorded.

        ``timeout`` is the env's own (the benchmark's ``tool_timeout_s``); ``user`` is
        the sandbox's agent user. Output comes back as the record holds it, stdout and
        stderr together.
        """
        if user is not None or timeout is not None:
            raise PermissionError(
                "the bat_gym sandbox runs every call as its agent user under the benchmark's "
                "tool timeout; call exec without user= and timeout="
            )
        script = shlex.join(cmd)
        if env:
            script = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + script
        if cwd:
            script = f"cd {shlex.quote(cwd)} && {script}"
        if input is not None:
            text = input.decode() if isinstance(input, bytes) else input
            script = f"{script} <<'BAT_GYM_INPUT'\n{text}\nBAT_GYM_INPUT"
        before = self._calls()
        reply = await self.episode.call("execute_code", {"language": "bash", "code": script})
        calls = self._calls()
        if reply.refused or len(calls) == before:
            return ExecResult(False, 1, "", reply.text)
        last = calls[-1]
        code = 1 if last.exit_code is None else last.exit_code
        return ExecResult(code == 0, code, last.output, "")

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Refused: see the module docstring (write through ``execute_code``)."""
        raise PermissionError(
            f"the bat_gym sandbox does not write {file!r} from outside the episode: a file "
            "no tool call wrote is nobody's work to the rubric; write it with execute_code"
        )

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """Read a workspace file (a path relative to it, or under its agent-side root)."""
        sandbox = self.episode.env.unwrapped.sandbox  # type: ignore[attr-defined]
        path = PurePosixPath(file)
        root = PurePosixPath(sandbox.agent_workspace)
        if path.is_absolute():
            if not path.is_relative_to(root):
                raise PermissionError(f"{file!r} is outside the workspace {root}")
            path = path.relative_to(root)
        host = (sandbox.workspace / path).resolve()
        if not host.is_relative_to(sandbox.workspace.resolve()):
            raise PermissionError(f"{file!r} leaves the workspace")
        if not host.is_file():
            raise FileNotFoundError(file)
        data = await self.episode.run(host.read_bytes)
        return data.decode("utf-8") if text else data

    def _calls(self) -> list[Any]:
        record = self.episode.info.get("record")
        return [] if record is None else list(record.calls)
