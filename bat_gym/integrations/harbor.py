"""Harbor task folders of a benchmark's states and held-out cells (``bat-gym export harbor``).

One folder per state, in Harbor's task layout (read from Harbor 0.25's
``harbor.models.task``: ``TaskPaths``, ``TaskConfig``, the separate verifier mode)::

    <benchmark>-<key>/
        task.toml            the state's metadata; the agent runs as the unprivileged
                             user ``agent`` with no network; the verifier in separate mode;
                             the MCP server of the env's tools
        instruction.md       the state's prompt (its system and user messages)
        environment/
            Dockerfile       the agent's image: the project's sandbox image (the one the
                             docker backend runs; python3, numpy and the benchmark's
                             packages) with the state's public workspace at /workspace;
                             no bat-gym, no task generator, no answers
            workspace/       the state's files, as the env's reset restores them
            docker-compose.yaml  the sidecar ``bat-gym-mcp``: ``bat-gym harbor serve``
                             in the bat-gym image, sharing the agent's network namespace
                             so the agent reaches it at http://127.0.0.1:8000/mcp while
                             its files stay out of the agent's reach
            mcp/Dockerfile, mcp/task.json   the sidecar's image and the state it plays
        tests/               bundled into the verifier's own image (separate mode)
            Dockerfile       the bat-gym image, with these files at /tests
            task.json        the state: benchmark, version, contracts, how to rebuild it
            test.sh          ``bat-gym harbor verify``: rebuilds the state, replays the
                             calls the sidecar recorded into a fresh sandbox, scores the
                             final workspace with the state's contract and writes
                             /logs/verifier/reward.json (reward and stage credits) and
                             verdict.json

Why a sidecar: the rubric's checks read the execution record (which call wrote a file,
whether the pipeline ran), which only exists for calls made through the env's tools; and
the agent's image must hold neither the answers nor the code that regenerates them, so
the tools run in a container of their own. Both bat-gym images are built from
``OUT/bat-gym-image`` (see ``docs/harbor.md``).

The state a task plays is named by :class:`HarborTask` and rebuilt, never shipped: a
default state from the benchmark's default states (the teacher's trajectory is played
again), a held-out cell from its track and seed (:func:`bat_gym.bank.task_states`), as
``bat-gym eval`` does.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.benchmark import Benchmark
from bat_gym.core.errors import BatGymError, ConfigError
from bat_gym.core.files import write_atomic

__all__ = [
    "HARBOR_IMAGE",
    "MCP_PORT",
    "MCP_SERVICE",
    "TRACE_DIR",
    "HarborExportError",
    "HarborTask",
    "export_harbor",
    "load_state",
    "select_tasks",
    "write_task",
]

MCP_SERVICE = "bat-gym-mcp"
MCP_PORT = 8000
TRACE_DIR = "/bat-gym/out"
"""Where the sidecar keeps the ended episode (``bat-gym serve mcp --out``'s layout)."""
HARBOR_IMAGE = "bat-gym/harbor:{version}"
"""The sidecar's and the verifier's base: the sandbox image with bat-gym installed."""
TASK_FILE = "task.json"


class HarborExportError(BatGymError):
    """A request ``bat-gym export harbor`` cannot meet, with what to ask instead."""


class HarborTask(BaseModel):
    """The state one Harbor task plays, as the sidecar and the verifier rebuild it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark: str = Field(description="The benchmark's registered name.")
    benchmark_version: str = Field(description="Its spec version; the verifier checks it.")
    contracts: dict[str, str] = Field(description="Contract id -> sha256, checked on rebuild.")
    source: Literal["default", "heldout"] = Field(
        description="default: the benchmark's default states; heldout: a held-out cell."
    )
    state_id: str = Field(description="The state's id (a held-out cell's is rebuilt too).")
    focus: str
    track: str
    seed: int | None = Field(None, description="The held-out task's seed (heldout only).")
    repeat: int | None = Field(None, ge=0, description="The cell's repeat (heldout only).")
    protocol: str = "hermes"

    @property
    def name(self) -> str:
        """The task folder's name: ``<benchmark>-<cell key or state id>``, file-name safe."""
        key = (
            f"{self.track}-{self.seed}-r{self.repeat}"
            if self.source == "heldout"
            else self.state_id
        )
        return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{self.benchmark}-{key}")


def _contracts(bench: Benchmark) -> dict[str, str]:
    return {c.id: c.sha256 for c in sorted(bench.contract_library(), key=lambda c: c.id)}


def select_tasks(
    bench: Benchmark,
    *,
    state_ids: Sequence[str] = (),
    focus: str | None = None,
    heldout: bool = False,
    repeats: int | None = None,
    tracks: Sequence[str] = (),
) -> list[HarborTask]:
    """The tasks to export: default states (by id, or all of a focus) or held-out cells.

    Raises:
        HarborExportError: neither states nor ``heldout`` were asked for, or both.
    """
    common = {
        "benchmark": bench.name,
        "benchmark_version": bench.spec.version,
        "contracts": _contracts(bench),
    }
    if heldout:
        if state_ids or focus:
            raise HarborExportError(
                "--held-out exports the held-out cells (E2E); give it without --state/--focus"
            )
        from bat_gym.evaluation.harness import EvalConfig, held_out_cells

        cells = held_out_cells(bench, EvalConfig(repeats=repeats, tracks=tuple(tracks)))
        return [
            HarborTask(
                **common,
                source="heldout",
                state_id="",
                focus="E2E",
                track=c.track,
                seed=c.seed,
                repeat=c.repeat,
            )
            for c in cells
        ]
    from bat_gym.catalog import state_source

    states = state_source(None, bench)
    ids = list(state_ids) or (states.select(focus=focus) if focus else [])
    if not ids:
        raise HarborExportError(
            "say which states to export: --state ID (repeatable), --focus NAME (every default "
            "state of that focus), or --held-out (the held-out cells)"
        )
    out = []
    for state_id in ids:
        state = states.get(state_id)
        out.append(
            HarborTask(
                **common,
                source="default",
                state_id=state_id,
                focus=state.focus,
                track=state.track,
            )
        )
    return out


def load_state(bench: Benchmark, task: HarborTask, store_dir: str | Path) -> tuple[Any, Any]:
    """Rebuild the task's state: ``(state source, StageState)``; held-out ones under ``store_dir``.

    Raises:
        HarborExportError: the installed benchmark is not the one the task was exported from.
    """
    if bench.spec.version != task.benchmark_version or _contracts(bench) != task.contracts:
        raise HarborExportError(
            f"{task.name} was exported from {task.benchmark} {task.benchmark_version} with "
            f"other contracts than the installed {bench.name} {bench.spec.version}: rebuild "
            "the bat-gym image from the bat-gym that exported the task, or export again"
        )
    if task.source == "default":
        from bat_gym.catalog import state_source

        states = state_source(None, bench)
        return states, states.get(task.state_id)
    from bat_gym.bank import task_states
    from bat_gym.core.sandbox.snapshot import BlobStore

    if task.seed is None:
        raise HarborExportError(f"{task.name}: a held-out task names its seed; export it again")
    states = task_states(
        bench, [(task.track, task.seed)], "heldout", BlobStore(store_dir), protocol=task.protocol
    )
    return states, states.get(states.select()[0])


def _write_workspace(states: Any, state: Any, dest: Path) -> int:
    """The state's files under ``dest``, as a reset restores them; returns how many."""
    snapshot = states.store.get_snapshot(state.snapshot)
    n = 0
    for entry in snapshot.entries:
        path = dest / entry.path
        if entry.kind == "d":
            path.mkdir(parents=True, exist_ok=True)
        elif entry.kind == "f":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(states.store.read_blob(entry.digest))
            path.chmod(0o755 if entry.mode & 0o111 else 0o644)
            n += 1
    return n


def _instruction(task: HarborTask, state: Any) -> str:
    """instruction.md: how to act over MCP, then the state's system and user messages."""
    lines = [
        f"# {task.benchmark}: {task.focus} of a {task.track} task",
        "",
        "Work through the MCP server `bat-gym` (http://127.0.0.1:8000/mcp): its tools "
        "(`execute_code`, `finish` and the benchmark's own) run in the task's sandbox, "
        "whose workspace is /workspace there. Each call is one turn of the episode. Call "
        "`finish` when the work is done. Only work done through these tools counts: the "
        "verifier replays your calls and scores the result with the stage's rubric "
        "contract. /workspace in your own shell is a read-only copy of the start files.",
        "",
        "The prompt below shows how a text policy writes a call; call the tools directly.",
        "",
    ]
    earlier = 0
    for m in state.messages:  # OpenAI-format dicts (StageState.messages)
        role, content = m.get("role"), m.get("content")
        if role in ("system", "user") and content and not earlier:
            lines += [f"## {role}", "", str(content), ""]
        elif role == "assistant":
            earlier += 1
    if earlier:
        lines += [
            f"Earlier stages were played already ({earlier} turns): their work is in the "
            "workspace.",
            "",
        ]
    return "\n".join(lines)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string for these values


def _task_toml(task: HarborTask, bench: Benchmark) -> str:
    meta = {
        "benchmark": task.benchmark,
        "benchmark_version": task.benchmark_version,
        "state_id": task.state_id,
        "focus": task.focus,
        "track": task.track,
        "source": task.source,
    }
    meta_lines = [f"{k} = {_toml_str(str(v))}" for k, v in meta.items()]
    if task.seed is not None:
        meta_lines += [f"seed = {task.seed}", f"repeat = {task.repeat}"]
    keywords = ", ".join(_toml_str(k) for k in ("bat-gym", task.benchmark, task.focus, task.track))
    return "\n".join(
        [
            'schema_version = "1.4"',
            "# The ended episode the sidecar kept, handed to the separate verifier.",
            f'artifacts = [{{ source = "{TRACE_DIR}", service = "{MCP_SERVICE}" }}]',
            "",
            "[task]",
            f'name = "bat-gym/{task.name}"',
            f"description = {_toml_str(f'{task.benchmark} {task.focus}, track {task.track}')}",
            f"keywords = [{keywords}]",
            "",
            "[metadata]",
            *meta_lines,
            "",
            "# The sidecar and the verifier (never the agent) run the project's bubblewrap",
            "# sandbox, which needs SYS_ADMIN and NET_ADMIN in its container.",
            "[metadata.harbor.lint]",
            'ignore = ["compose-additional-capabilities"]',
            "",
            "[verifier]",
            "timeout_sec = 1800.0",
            'environment_mode = "separate"',
            "",
            "[agent]",
            "timeout_sec = 3600.0",
            'user = "agent"',
            "",
            "[environment]",
            'network_mode = "no-network"',
            "build_timeout_sec = 1800.0",
            "",
            "[[environment.mcp_servers]]",
            'name = "bat-gym"',
            'transport = "streamable-http"',
            f'url = "http://127.0.0.1:{MCP_PORT}/mcp"',
            "",
        ]
    )


def _sandbox_image(bench: Benchmark) -> str:
    from bat_gym.core.sandbox.docker_image import image_contents

    return image_contents(bench.sandbox_requirements()).tag


def _bat_gym_image() -> str:
    from importlib.metadata import version

    return HARBOR_IMAGE.format(version=version("bat-gym"))


def _agent_dockerfile(bench: Benchmark) -> str:
    return "\n".join(
        [
            "# The project's sandbox image (what the docker backend runs agent code in), with",
            "# the state's public files. No bat-gym and no task generator: nothing here can",
            "# regenerate the task's answers.",
            f"FROM {_sandbox_image(bench)}",
            # The image is debootstrap's minbase: no useradd. The account by hand.
            "RUN echo 'agent:x:1000:1000::/home/agent:/bin/bash' >> /etc/passwd"
            " && echo 'agent:x:1000:' >> /etc/group"
            " && mkdir -p /home/agent && chown 1000:1000 /home/agent",
            "COPY --chown=agent:agent workspace/ /workspace/",
            "RUN chmod -R a-w /workspace",
            "WORKDIR /workspace",
            "",
        ]
    )


# What the project's sandbox (bubblewrap, in the sidecar and in the verifier) needs of
# its container: namespaces, which Docker's default seccomp and capabilities refuse; and
# the container's own limits in place of the cgroup it cannot create under a read-only
# /sys/fs/cgroup. The agent's container gets none of this.
_SANDBOX_HOST = (
    "    security_opt: [seccomp=unconfined, apparmor=unconfined]",
    "    cap_add: [SYS_ADMIN, NET_ADMIN]",
    "    mem_limit: 8g",
    "    pids_limit: 2048",
    "    environment:",
    '      BAT_GYM_ALLOW_UNCAPPED: "1"',
)


def _compose() -> str:
    return "\n".join(
        [
            "# The env's tools: bat-gym's MCP server in a container of its own, sharing the",
            "# agent's network namespace (it listens on 127.0.0.1 only).",
            "services:",
            f"  {MCP_SERVICE}:",
            "    build:",
            "      context: ./mcp",
            '    network_mode: "service:main"',
            "    depends_on: [main]",
            *_SANDBOX_HOST,
            "",
        ]
    )


def _verifier_compose() -> str:
    return "\n".join(
        [
            "# The verifier replays the recorded calls in the project's sandbox: its container",
            "# needs what the sidecar's does.",
            "services:",
            "  main:",
            *_SANDBOX_HOST,
            "",
        ]
    )


def _mcp_dockerfile() -> str:
    return "\n".join(
        [
            f"FROM {_bat_gym_image()}",
            f"COPY {TASK_FILE} /bat-gym/{TASK_FILE}",
            f'CMD ["bat-gym", "harbor", "serve", "/bat-gym/{TASK_FILE}", '
            f'"--port", "{MCP_PORT}", "--out", "{TRACE_DIR}"]',
            "",
        ]
    )


def _tests_dockerfile() -> str:
    return "\n".join(
        [
            "# The verifier's own image: bat-gym, which rebuilds the state and its answers.",
            f"FROM {_bat_gym_image()}",
            "COPY . /tests/",
            "",
        ]
    )


def _test_sh() -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "# Rebuild the state, replay the calls the sidecar recorded in a fresh sandbox,",
            "# score the final workspace with the state's contract: /logs/verifier/reward.json.",
            f"exec bat-gym harbor verify /tests/{TASK_FILE} --trace {TRACE_DIR} --logs /logs/verifier",
            "",
        ]
    )


def teacher_calls(bench: Benchmark, state: Any) -> list[dict[str, Any]]:
    """The scripted teacher's tool calls from ``state`` to its ``finish``, in order.

    Raises:
        ConfigError: the teacher does not finish within the state's turn budget.
    """
    from bat_gym.core.protocol import get_protocol
    from bat_gym.policies import EpisodeContext, PolicyRequest, ScriptedPolicy

    hermes = get_protocol("hermes")
    teacher = ScriptedPolicy("teacher", protocol="hermes")
    calls: list[dict[str, Any]] = []
    for turn in range(bench.spec.budgets.max_turns):
        text = teacher.act(PolicyRequest([], [], EpisodeContext(bench, state, turn))).text
        calls += [{"name": c.name, "arguments": c.arguments} for c in hermes.parse(text).calls]
        if any(c["name"] == "finish" for c in calls):
            return calls
    raise ConfigError(f"the teacher does not finish from {state.state_id} within the turn budget")


def _solution(bench: Benchmark, state: Any, folder: Path) -> dict[Path, str]:
    """``solution/``: the teacher's calls, replayed over MCP by the oracle agent."""
    client = Path(__file__).with_name("harbor_solve.py").read_text(encoding="utf-8")
    return {
        folder / "solve.sh": "#!/bin/bash\n"
        "# Harbor's oracle: the scripted teacher's calls, through the task's MCP server.\n"
        'exec python3 "$(dirname "$0")/solve.py" "$(dirname "$0")/calls.json"\n',
        folder / "solve.py": client,
        folder / "calls.json": json.dumps(teacher_calls(bench, state), indent=1),
    }


def write_task(
    bench: Benchmark,
    task: HarborTask,
    out: str | Path,
    store_dir: Path,
    *,
    solution: bool = False,
) -> Path:
    """Write one task folder under ``out`` (replacing one of the same name); returns it.

    With ``solution``, also ``solution/`` (see :func:`_solution`).
    """
    folder = Path(out) / task.name
    if folder.exists():
        shutil.rmtree(folder)
    states, state = load_state(bench, task, store_dir)
    if task.source == "heldout":
        task = task.model_copy(update={"state_id": state.state_id})
    env_dir, tests = folder / "environment", folder / "tests"
    _write_workspace(states, state, env_dir / "workspace")
    spec = task.model_dump_json(indent=2)
    files = {
        folder / "task.toml": _task_toml(task, bench),
        folder / "instruction.md": _instruction(task, state),
        env_dir / "Dockerfile": _agent_dockerfile(bench),
        env_dir / "docker-compose.yaml": _compose(),
        env_dir / "mcp" / "Dockerfile": _mcp_dockerfile(),
        env_dir / "mcp" / TASK_FILE: spec,
        tests / "Dockerfile": _tests_dockerfile(),
        tests / TASK_FILE: spec,
        tests / "test.sh": _test_sh(),
        tests / "docker-compose.yaml": _verifier_compose(),
    }
    if solution:
        files.update(_solution(bench, state, folder / "solution"))
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    (tests / "test.sh").chmod(0o755)
    if solution:
        (folder / "solution" / "solve.sh").chmod(0o755)
    return folder


def _image_folder(bench: Benchmark, out: Path) -> Path:
    """``OUT/bat-gym-image``: the Dockerfile of the sidecar's and verifier's base image."""
    folder = out / "bat-gym-image"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dist").mkdir(exist_ok=True)
    write_atomic(
        folder / "Dockerfile",
        "\n".join(
            [
                f"# {_bat_gym_image()}: the sandbox image with bat-gym installed offline from",
                "# the wheels in dist/: pip wheel -w dist '<bat-gym source>[mcp]' pip",
                f"FROM {_sandbox_image(bench)}",
                "COPY dist/ /opt/bat-gym-dist/",
                # Debian's python3 has venv but no ensurepip: pip runs from its own wheel.
                # The sidecar serves MCP: bat-gym with its mcp extra.
                "RUN python3 -m venv --without-pip /opt/bat-gym"
                " && set -- /opt/bat-gym-dist/pip-*.whl"
                ' && /opt/bat-gym/bin/python "$1/pip" install --no-cache-dir --no-index'
                " --find-links /opt/bat-gym-dist pip 'bat-gym[mcp]'",
                "ENV PATH=/opt/bat-gym/bin:$PATH",
                "",
            ]
        ),
    )
    return folder


def export_harbor(
    bench: Benchmark, tasks: Sequence[HarborTask], out: str | Path, *, solution: bool = False
) -> list[Path]:
    """Write a task folder per task under ``out``, and ``out/bat-gym-image``; returns the tasks.

    With ``solution``, each task also gets ``solution/``: the scripted teacher's calls and
    a standard-library MCP client that makes them, so Harbor's ``oracle`` agent plays the
    teacher (:mod:`bat_gym.integrations.harbor_solve`).
    """
    import tempfile

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _image_folder(bench, out)
    with tempfile.TemporaryDirectory(prefix="bat-harbor-") as store:
        return [write_task(bench, t, out, Path(store), solution=solution) for t in tasks]
