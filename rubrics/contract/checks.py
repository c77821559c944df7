"""The registry of rubric checks: the names contracts use, and how a check is run.

A check is a small pure function ``(ctx: CheckContext, *, **args) -> CheckResult``: it
reads the frozen workspaces, the execution record and the task oracle in ``ctx`` and
nothing else. Its keyword-only parameters and their type hints become the schema of
``args`` in contracts, validated when a contract is loaded, so a typo fails at load time
rather than mid-training.

Checks are plugins (:data:`CHECKS`, entry point group ``bat_gym.checks``): a package
ships one by declaring it in its ``pyproject.toml``, with nothing imported until a
contract names it::

    [project.entry-points."bat_gym.checks"]
    has_license = "my_package.checks:has_license"

or registers one in this process with :func:`register_check`.

A check that decides only from what the verifier computes itself, outside every
sandbox (the task metric on the final workspace, say), has no file or tool call to
point at: register it with ``evidence="none"`` (or, shipped through an entry point,
set the function's ``evidence`` attribute to ``"none"``). Items that use it then require no
evidence kind by default (so a pass counts fully towards the evidence completeness
η), and a contract that requires one of it is refused when loaded.

Inside a check, raise :class:`~bat_gym.rubrics.contract.context.CheckFailed` to fail with a
reason, or :class:`~bat_gym.rubrics.contract.context.CheckUnscorable` when infrastructure (not
the agent) keeps it from deciding; :func:`run_check` turns both, and blob-store faults,
into results. A check must never raise on what the agent wrote: garbled files fail
(the readers in :mod:`bat_gym.rubrics.verifier.reading` do this).

The built-in checks live in :mod:`~bat_gym.rubrics.verifier.checks.artifact` (``file_exists``,
``file_nonempty``, ``json_valid``, ``csv_schema``, ``markdown_sections``,
``receipt_valid``, ``non_degenerate``) and :mod:`~bat_gym.rubrics.verifier.checks.episode`
(``command_ran``, ``pipeline_ran``, ``written_by_tool``, ``stage_artifacts_written``,
``unchanged``, ``task_metric_at_least``, ``pilot_quality``, ``matches_answers``),
:mod:`~bat_gym.rubrics.verifier.checks.repair` (``unchanged_unless_repaired``,
``upstream_repaired``, ``stages_linked``) and :mod:`~bat_gym.rubrics.verifier.checks.tool`
(``tool_called``, on a benchmark's own tools); bat_gym declares them as entry points,
as a package declares its own.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from bat_gym.core.errors import CheckNotFound, PluginError, SandboxError
from bat_gym.core.plugins import Expect, Registry
from bat_gym.rubrics.contract.context import CheckContext, CheckFailed, CheckResult, CheckUnscorable

log = logging.getLogger(__name__)


def error_line(exc: BaseException) -> str:
    """``Type: message`` in one line of at most 300 characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


__all__ = [
    "CHECKS",
    "CheckFn",
    "RubricCheck",
    "error_line",
    "register_check",
    "get_check",
    "check_names",
    "check_evidence",
    "validate_args",
    "run_check",
]

# The modules of bat_gym's own checks (declared as entry points in its pyproject.toml;
# the reference docs list the checks of each).
BUILTIN_MODULES = (
    "bat_gym.rubrics.verifier.checks.artifact",
    "bat_gym.rubrics.verifier.checks.episode",
    "bat_gym.rubrics.verifier.checks.reference",
    "bat_gym.rubrics.verifier.checks.repair",
    "bat_gym.rubrics.verifier.judge",
    "bat_gym.rubrics.verifier.checks.tool",
)

CheckFn = Callable[..., CheckResult]
F = TypeVar("F", bound=CheckFn)
EvidenceDeclaration = Literal["required", "none"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class RubricCheck:
    """A loaded check: its function, the model of its ``args``, and its evidence declaration."""

    fn: CheckFn
    args: type[BaseModel]
    evidence: EvidenceDeclaration


def _as_check(name: str, fn: CheckFn) -> RubricCheck:
    """The :class:`RubricCheck` of ``fn``: its ``args`` model from its keyword-only parameters.

    Raises:
        PluginError: ``fn`` does not take ``(ctx, *, **args)``, or its ``evidence``
            attribute is neither ``"required"`` nor ``"none"``.
    """
    evidence = getattr(fn, "evidence", "required")
    if evidence not in ("required", "none"):
        raise PluginError(
            f"check {name!r}: evidence must be 'required' or 'none', got {evidence!r}"
        )
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        raise PluginError(f"check {name!r} must take the CheckContext as its first parameter")
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind is not p.KEYWORD_ONLY:
            raise PluginError(
                f"check {name!r}: parameter {p.name!r} must be keyword-only (after *)"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints.get(p.name, Any), default)
    args = create_model(
        f"{name}_args", __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )
    return RubricCheck(fn=fn, args=args, evidence=evidence)


CHECKS: Registry[RubricCheck] = Registry(
    "bat_gym.checks", expect=Expect("rubric check"), adapt=_as_check, not_found=CheckNotFound
)
"""The rubric checks, by name: those bat_gym and installed packages declare, and those
registered in this process."""


def register_check(name: str, *, evidence: EvidenceDeclaration = "required") -> Callable[[F], F]:
    """Register a check under ``name`` in this process (a decorator).

    Args:
        name: the name contracts use, lowercase with underscores.
        evidence: ``"required"`` (default): the check's results point at what they rest
            on (files, tool calls), and an item using it requires ``artifact`` evidence
            unless its contract says otherwise. ``"none"``: the check decides from
            what the verifier computes itself and returns no evidence; its items
            require none by default, and requiring some is refused at load.

    Raises:
        ValueError: the name is malformed or already taken by another function, or
            ``evidence`` is neither ``"required"`` nor ``"none"``.
        TypeError: the function does not take ``(ctx, *, **args)``.
    """
    if not _NAME.match(name):
        raise PluginError(f"check names are lowercase with underscores, got {name!r}")
    if evidence not in ("required", "none"):
        raise PluginError(f"evidence must be 'required' or 'none', got {evidence!r}")

    def decorate(fn: F) -> F:
        fn.evidence = evidence  # type: ignore[attr-defined]  # what an entry point reads too
        _as_check(name, fn)  # a wrong signature fails here, not when a contract loads
        CHECKS.register(name, fn, unique=True)
        return fn

    return decorate


def get_check(name: str) -> CheckFn:
    """The check registered under ``name``.

    Raises:
        CheckNotFound: listing the known names and close matches.
    """
    return CHECKS[name].fn


def check_names() -> tuple[str, ...]:
    """Every registered check name, sorted."""
    return tuple(sorted(CHECKS))


def check_evidence(name: str) -> EvidenceDeclaration:
    """What check ``name`` declared about its evidence: ``"required"`` or ``"none"``.

    Raises:
        CheckNotFound: unknown check.
    """
    return CHECKS[name].evidence


def validate_args(name: str, args: dict[str, Any]) -> BaseModel:
    """Validate ``args`` against the parameters of check ``name``.

    Raises:
        CheckNotFound: unknown check.
        ValidationError: an argument is missing, unknown or of the wrong type.
    """
    return CHECKS[name].args.model_validate(args)


def run_check(name: str, ctx: CheckContext, args: dict[str, Any]) -> CheckResult:
    """Run check ``name`` on ``ctx``, turning failures and infrastructure faults into results.

    ``CheckFailed`` becomes a failure; ``CheckUnscorable`` and sandbox or blob-store
    errors (a missing or corrupted blob) become null. Any other exception also becomes
    a failure: a check reads files the agent made, and agent files can make any parser
    raise (JSON nested past the recursion limit, a truncated NIfTI header), which must
    end as a verdict, never as an exception out of ``step``. It is logged with its
    traceback, since a bug in the check looks the same from here.
    """
    fn = get_check(name)
    model = validate_args(name, args)
    try:
        return fn(ctx, **{k: getattr(model, k) for k in type(model).model_fields})
    except CheckFailed as exc:
        return CheckResult.fail(exc.detail, exc.evidence)
    except CheckUnscorable as exc:
        return CheckResult.null(str(exc))
    except SandboxError as exc:
        return CheckResult.null(f"infrastructure fault while reading the workspace: {exc}")
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("check %s raised on this workspace", name, exc_info=True)
        return CheckResult.fail(f"the check could not read what the agent left: {error_line(exc)}")
