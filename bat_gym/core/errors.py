"""The exceptions bat_gym raises: one root, one class per thing that can go wrong.

Every error carries the fields a caller needs to act on it, and its message names
the fix. Catch :class:`BatGymError` to handle all of them.
"""

from __future__ import annotations

__all__ = [
    "BatGymError",
    "SpecError",
    "ConfigError",
    "PluginError",
    "SandboxError",
    "SandboxUnavailable",
    "SandboxCrashed",
    "UnsafeSnapshot",
    "SnapshotNotFound",
    "WorkspaceRejected",
    "UnsafeWorkspace",
    "WorkspaceQuotaExceeded",
    "StageNotFound",
    "BenchmarkNotFound",
    "PluginNotFound",
    "PolicyNotFound",
    "SandboxBackendNotFound",
    "ProtocolNotFound",
    "SelectorNotFound",
    "EnvNotFound",
    "StateNotFound",
    "StateNotAdmitted",
    "TrackNotFound",
    "ResetNeeded",
    "NotAnAction",
    "NotAStageEnv",
    "EnvNotCopyable",
    "CurriculumError",
    "EvaluationFailed",
    "EnvLost",
    "BankError",
    "ModelNotFound",
    "StateVersionMismatch",
    "TrajectoryRejected",
    "UnsupportedPolicy",
    "RubricContractError",
    "ContractNotFound",
    "CheckNotFound",
]


class BatGymError(Exception):
    """Root of every error bat_gym raises on purpose.

    Every subclass pickles with the arguments it was made with, so an error raised in
    a worker process (a vector env, a Ray actor) reaches the parent as itself.
    """

    def __new__(cls, *args: object, **kwargs: object) -> BatGymError:
        """Keep the constructor's arguments, for :meth:`__reduce__`."""
        self = super().__new__(cls, *args)
        self._made_with = (args, kwargs)
        return self

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle as ``type(self)(*args, **kwargs)`` with the instance's attributes."""
        args, kwargs = getattr(self, "_made_with", (self.args, {}))
        return (_remake, (type(self), args, kwargs, self.__dict__))


def _remake(
    cls: type[BatGymError], args: tuple[object, ...], kwargs: dict[str, object], state: dict
) -> BatGymError:
    error = cls(*args, **kwargs)
    error.__dict__.update(state)
    return error


class SpecError(BatGymError, ValueError):
    """A spec file (YAML/JSON) or spec object failed validation.

    Attributes:
        source: the file (or other origin) the spec came from.
        problems: one ``(field path, message)`` pair per problem.
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {path or '<root>'}: {msg}" for path, msg in problems)
        super().__init__(f"{source}: {len(problems)} problem(s) in the spec\n{lines}")


class ConfigError(BatGymError, ValueError):
    """A setting (a config field, a command-line option) has a value that cannot work.

    The message names the setting, what is wrong with its value, and the fix.
    """


class PluginError(BatGymError, TypeError, ValueError):
    """A plugin (a benchmark, a rubric check, a command) that bat_gym cannot use.

    A check whose signature is wrong, a name registered twice, an entry point that
    resolves to something else. The message names the plugin and the fix.
    """


class SandboxError(BatGymError):
    """A sandbox could not do what was asked."""


class SandboxUnavailable(SandboxError):
    """The requested isolation cannot be provided on this machine.

    Attributes:
        backend: the backend that was asked for.
        reason: what is missing.
    """

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"sandbox backend {backend!r} is unavailable: {reason}")


class SandboxCrashed(SandboxError):
    """The process inside the sandbox died or stopped answering; it was restarted."""


class UnsafeSnapshot(SandboxError, ValueError):
    """A snapshot or archive holds a path that would escape or overflow the workspace.

    Attributes:
        path: the offending member.
        reason: why it was refused.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"refusing snapshot member {path!r}: {reason}")


class WorkspaceRejected(BatGymError):
    """The workspace, as agent code left it, cannot be taken as it is.

    Agent code caused this, not the host: an env ends the episode with a zero-credit
    verdict whose failure category is :attr:`category`, and never counts it as an
    infrastructure failure. Subclasses name the category.

    Attributes:
        path: the workspace-relative path at fault, or ``""`` for the whole workspace.
        reason: what was wrong, in one line.
    """

    category: str = "unsafe_workspace"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        where = f" at {path!r}" if path else ""
        super().__init__(f"workspace refused{where}: {reason}")


class UnsafeWorkspace(WorkspaceRejected):
    """A file the host must not follow or store: an escaping link, an unreadable name."""

    category = "unsafe_workspace"


class WorkspaceQuotaExceeded(WorkspaceRejected):
    """The workspace holds more bytes (apparent size) or files than the sandbox allows."""

    category = "quota_exceeded"


class SnapshotNotFound(SandboxError, KeyError):
    """A snapshot or blob digest is not in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "snapshot not found"


class _NotFound(BatGymError, KeyError):
    """A name that was looked up is unknown; the message lists close matches.

    ``shown`` replaces the names in the message's listing where a kind is better shown
    otherwise (a policy kind by its spec forms); close matches are always names.
    """

    kind = "name"

    def __init__(self, name: str, known: list[str], *, shown: list[str] | None = None) -> None:
        import difflib

        self.name = name
        self.known = sorted(known)
        close = difflib.get_close_matches(name, self.known, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        listing = ", ".join(sorted(shown) if shown is not None else self.known) or "none"
        super().__init__(f"unknown {self.kind} {name!r}.{hint} Known: {listing}.{self._fix()}")

    def _fix(self) -> str:
        """A sentence that follows the listing, where a kind has more to say."""
        return ""

    def __str__(self) -> str:
        return str(self.args[0])


class PluginNotFound(_NotFound, ValueError):
    """A name that no installed plugin of its kind answers to (see :mod:`bat_gym.core.plugins`).

    A ``ValueError`` too: the name was a bad argument. Subclasses name the kind.

    Attributes:
        group: the entry point group where a package declares plugins of this kind.
    """

    kind = "plugin"

    def __init__(
        self, name: str, known: list[str], *, shown: list[str] | None = None, group: str = ""
    ) -> None:
        self.group = group
        super().__init__(name, known, shown=shown)

    def _fix(self) -> str:
        if not self.group:
            return ""
        return f" A package adds one by declaring it in the entry point group {self.group!r}."


class StageNotFound(_NotFound):
    """A stage id or name that the benchmark does not define."""

    kind = "stage"


class BenchmarkNotFound(PluginNotFound):
    """A benchmark name that no installed package registers."""

    kind = "benchmark"


class PolicyNotFound(PluginNotFound):
    """A policy spec whose kind (the part before the first ``:``) no one registers."""

    kind = "policy"


class SandboxBackendNotFound(PluginNotFound):
    """A sandbox backend name that no one registers."""

    kind = "sandbox backend"


class ProtocolNotFound(PluginNotFound):
    """A tool protocol name that no one registers."""

    kind = "tool protocol"


class SelectorNotFound(PluginNotFound):
    """A target selector name that no one registers."""

    kind = "selector"


class EnvNotFound(_NotFound):
    """An env id that Gymnasium's registry does not hold (``bat-gym envs`` lists ours)."""

    kind = "env id"


class TrackNotFound(_NotFound):
    """A track name that the benchmark does not define."""

    kind = "track"


class ContractNotFound(_NotFound):
    """A rubric contract id that the contract library does not hold."""

    kind = "rubric contract"


class CheckNotFound(PluginNotFound):
    """A rubric check name that no one registers (see ``bat_gym.rubrics.register_check``)."""

    kind = "check"


class StateNotFound(_NotFound):
    """A ``state_id`` that the state source does not hold."""

    kind = "state_id"


class StateNotAdmitted(BatGymError, KeyError):
    """A planned bank row that was not admitted: no demonstration wins it.

    Attributes:
        state_id: the row's id.
        reason: why (the demonstration's reward against the admission bar).
    """

    def __init__(self, state_id: str, reason: str) -> None:
        self.state_id = state_id
        self.reason = reason
        super().__init__(
            f"state {state_id!r} is not admitted: {reason}. Rows no honest play wins are "
            "left out of the bank; choose another (select() lists the admitted ones), or "
            "see `bat-gym bank explain --default --all`"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ResetNeeded(BatGymError, RuntimeError):
    """``step`` (or what reads the episode) was called before ``reset`` or after it ended."""


class NotAStageEnv(BatGymError, TypeError):
    """A wrapper of StageEnv episodes (the rubric reward, the curriculum) got another env.

    A ``TypeError``, as for any argument of the wrong type.
    """


class NotAnAction(BatGymError, TypeError):
    """``step`` was given something other than the assistant's message as a ``str``.

    A ``TypeError``, as for any argument of the wrong type.
    """


class EnvNotCopyable(BatGymError, TypeError):
    """``pickle`` or ``copy.deepcopy`` of an env in the middle of an episode.

    The episode lives in a running sandbox (processes, sockets, a seccomp listener),
    which cannot be copied. A ``TypeError``, as ``pickle`` raises for what it cannot
    pickle.
    """

    def __init__(self, env_id: str) -> None:
        super().__init__(
            f"{env_id} is in an episode, which lives in a running sandbox and cannot be "
            "pickled or copied; copy the env before reset() or after close(), or make a new "
            "one (gym.make(env.spec)) and reset it to the same start state with "
            "reset(options={'state_id': env.unwrapped.state.state_id})"
        )


class CurriculumError(BatGymError, ValueError):
    """A curriculum round cannot be drawn from the states it is given.

    The message names what is short (a target stage no state has, a pool with fewer
    states than a batch takes) and the fix.
    """


class EvaluationFailed(BatGymError, RuntimeError):
    """An evaluation run in a child process (the firewall) did not finish.

    Only its exit status crosses the firewall; the message says where its own report is.
    """


class EnvLost(BatGymError, RuntimeError):
    """The env itself was lost mid-call: its process or its machine died.

    Nothing the policy did causes this, so the episode is infrastructure's failure:
    replay it on a fresh env or report it invalid, never score it.
    """


class BankError(BatGymError):
    """A Stage Bank directory is missing, incomplete or corrupted.

    Attributes:
        path: the file or directory at fault.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class StateVersionMismatch(BatGymError, ValueError):
    """A stage state of another benchmark, or of another version of it, was given to an env.

    A state's workspace, answers and scores belong to the generator version that made
    it: a new version draws other tasks from the same seeds, so an old state would be
    scored against tasks it never saw.

    Attributes:
        state_id: the state refused.
        found: ``benchmark version`` the state was made by.
        expected: ``benchmark version`` installed.
    """

    def __init__(self, state_id: str, found: str, expected: str) -> None:
        self.state_id = state_id
        self.found = found
        self.expected = expected
        super().__init__(
            f"state {state_id} is of {found}, but the installed benchmark is {expected}; "
            "states (and Stage Banks) are tied to the benchmark version that made them: "
            f"rebuild the bank for {expected} (`bat-gym bank build`) or install {found}"
        )


class ModelNotFound(BatGymError):
    """A local model path that is not a model directory.

    Attributes:
        path: the path given.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"no model directory at {path}: give a directory that save_pretrained wrote "
            "(config.json, weights, tokenizer); `bat-gym tiny-model DIR` builds a tiny one"
        )


class TrajectoryRejected(BankError):
    """A teacher trajectory a bank needs was rejected by the verifier or the admission gates.

    Raised for the default states, which promise every state of their grid: a broken
    teacher is reported here, with its verdict, not later as a missing focus.

    Attributes:
        task: the trajectory's job key (``track/seed/outcome``).
        reason: why it was rejected, with the verdict in brief (reward, evidence
            completeness, the items that fell short and their evidence).
    """

    def __init__(self, task: str, reason: str) -> None:
        self.task = task
        BankError.__init__(
            self,
            f"teacher trajectory {task}",
            f"rejected: {reason}. Fix the benchmark's teacher (or its contract); "
            "`bat-gym bank explain --default` shows every verdict",
        )
        self.reason = reason


class UnsupportedPolicy(BatGymError, ValueError):
    """A policy cannot play this benchmark (a naive baseline it does not define, say).

    Attributes:
        policy: the policy spec, e.g. ``naive``.
        reason: what the benchmark lacks, and what to use instead.
    """

    def __init__(self, policy: str, reason: str) -> None:
        self.policy = policy
        self.reason = reason
        super().__init__(f"policy {policy!r}: {reason}")


class RubricContractError(BatGymError):
    """A rubric contract cannot be used as asked.

    Raised when a state pins a contract whose digest (or version) differs from the one
    the library holds, and when a library is inconsistent (an id defined twice, an E2E
    contract naming a component the library lacks).

    Attributes:
        contract_id: the contract at fault.
        reason: what is wrong.
        expected: the sha256 the caller pinned, when a digest was compared.
        actual: the sha256 of the contract the library holds, when a digest was compared.
    """

    def __init__(
        self,
        contract_id: str,
        reason: str,
        *,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        self.contract_id = contract_id
        self.reason = reason
        self.expected = expected
        self.actual = actual
        super().__init__(f"rubric contract {contract_id!r}: {reason}")
