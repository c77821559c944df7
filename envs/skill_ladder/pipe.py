"""The skill_ladder task tool: one short command per stage.

Every task ships this file as ``tool/pipe.py``; ``setup`` installs a copy as
``pipeline/infer.py``, the pipeline the later stages run::

    python tool/pipe.py plan                          S1  plan/plan.md
    python tool/pipe.py setup                         S2  setup/environment.json, pipeline/infer.py
    python pipeline/infer.py check                    S3  what the data needs (writes nothing)
    python pipeline/infer.py validation/pilot.csv     S3  one-case pilot with checks, receipt,
        [--unit mm|cm] [--case ID] [--codes FIX]          and the settings later stages reuse
    python pipeline/infer.py outputs/predictions.csv  S4  every case, with the pilot's settings
    python pipeline/infer.py outputs/submission.csv   S5  the submission in task.json's schema

Each command that writes an artifact also writes its receipt (schema version, stage,
artifact path and the artifact's real sha256). The pilot's checks print ``CHECK OK`` or
``CHECK FAILED`` with what to change; the choice of flags stays with the caller.

Standard library only: it runs inside the task sandbox, where it must start fast.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]

PLAN = "plan/plan.md"
ENVIRONMENT = "setup/environment.json"
PIPELINE = "pipeline/infer.py"
PILOT = "validation/pilot.csv"
PREDICTIONS = "outputs/predictions.csv"
SUBMISSION = "outputs/submission.csv"
SETTINGS = "validation/settings.json"
# Each artifact the pipeline writes, with its stage and receipt.
RECEIPTS = {
    PILOT: ("S3", "validation/s3_validation.json"),
    PREDICTIONS: ("S4", "validation/s4_completion.json"),
    SUBMISSION: ("S5", "validation/s5_submission.json"),
}
TO_CM = {"mm": 0.1, "cm": 1.0}
FIXES = ("none", "lower", "legacy")
TARGETS = ("plan", "setup", "check", PILOT, PREDICTIONS, SUBMISSION)

_PLAN_STEPS = {
    "units": "Take the unit of the values from TASK.md and pass it as --unit.",
    "cases": "Take the calibration phantom's id from TASK.md and pass it as --case.",
    "codes": "Run the check and pass the fix it names as --codes.",
}


class ToolError(Exception):
    """A problem the caller can fix; printed as one line, exit status 2."""


# -- files ------------------------------------------------------------------------------


def _json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"{path} is missing") from None
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path} is not valid JSON: {exc.msg}") from None


def _rows(path: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except FileNotFoundError:
        raise ToolError(f"{path} is missing") from None


def _write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")


def _write_labels(path: str, labels: list[tuple[str, int]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "label"])
    writer.writerows(labels)
    _write(path, buf.getvalue())


def _receipt(artifact: str, **extra: Any) -> str:
    """Write ``artifact``'s receipt with its real sha256; return the receipt's path."""
    stage, path = RECEIPTS[artifact]
    digest = hashlib.sha256(Path(artifact).read_bytes()).hexdigest()
    body = {"schema_version": 1, "stage": stage, "artifact": artifact, "sha256": digest, **extra}
    _write(path, json.dumps(body, indent=2) + "\n")
    return path


# -- the model --------------------------------------------------------------------------


class Task:
    """The task's files, read once: task.json, the model and the data rows."""

    def __init__(self) -> None:
        self.meta = _json("task.json")
        self.model = _json(self.meta["model"])
        self.rows = {r["id"]: r for r in _rows(self.meta["data"])}
        self.case_ids: list[str] = list(self.meta["submission"]["case_ids"])
        self.track: str = self.meta["track"]

    @property
    def by_code(self) -> bool:
        """Whether cases are labelled by code lookup (else by a size threshold)."""
        return self.model["kind"] == "lookup"

    def row(self, case: str) -> dict[str, str]:
        """The data row of ``case``."""
        if case not in self.rows:
            raise ToolError(f"no case {case!r} in {self.meta['data']}")
        return self.rows[case]

    def size_cm(self, case: str, settings: dict[str, Any]) -> float:
        """The case's size in centimetres under ``settings`` (unit and calibration scale)."""
        return float(self.row(case)["value"]) * TO_CM[settings["unit"]] / settings["scale"]

    def code(self, case: str, fix: str) -> str | None:
        """The case's code in the model table's scheme, or None when it has none."""
        raw = self.row(case)["code"]
        if fix == "lower":
            raw = raw.lower()
        elif fix == "legacy":
            raw = self.model["legacy"].get(raw)
        return raw if raw in self.model["table"] else None

    def label(self, case: str, settings: dict[str, Any]) -> int:
        """The model's label for ``case``; a code the table lacks is labelled 0."""
        if self.by_code:
            code = self.code(case, settings["codes"])
            return 0 if code is None else int(self.model["table"][code])
        return int(self.size_cm(case, settings) >= self.model["threshold_cm"])

    def settings(self, case: str | None, unit: str | None, codes: str | None) -> dict[str, Any]:
        """The pilot's settings; a calibrated task takes its scale from the pilot case."""
        case = case or self.case_ids[0]
        settings = {"case": case, "unit": unit or "cm", "codes": codes or "none", "scale": 1.0}
        calibration = self.meta.get("calibration")
        if calibration and not self.by_code:
            reading_cm = self.size_cm(case, settings)
            settings["scale"] = reading_cm / float(calibration["phantom_cm"])
        return settings


# -- checks -----------------------------------------------------------------------------


def _code_fix(task: Task) -> str | None:
    """The --codes fix under which every code is in the model table, if one exists."""
    for fix in FIXES:
        if all(task.code(c, fix) is not None for c in task.case_ids):
            return fix
    return None


def _checks(task: Task, settings: dict[str, Any]) -> list[tuple[bool, str]]:
    """The pilot's checks over every case: ``(passed, message)`` each."""
    if task.by_code:
        unknown = [c for c in task.case_ids if task.code(c, settings["codes"]) is None]
        if not unknown:
            return [(True, f"all {len(task.case_ids)} codes are in the model table")]
        fix = _code_fix(task)
        hint = f"rerun with --codes {fix}" if fix else "no --codes fix maps them"
        example = task.row(unknown[0])["code"]
        return [
            (
                False,
                f"{len(unknown)} of {len(task.case_ids)} codes are not in the model table "
                f"(e.g. {example!r}): {hint}",
            )
        ]
    checks = []
    calibrated = "calibration" in task.meta
    if calibrated and settings["case"] in task.case_ids:
        checks.append(
            (
                False,
                f"{settings['case']} is a submission case, not the phantom TASK.md names: "
                "rerun with --case <phantom id>",
            )
        )
    low, high = task.model["range_cm"]
    out = [c for c in task.case_ids if not low <= task.size_cm(c, settings) <= high]
    if out:
        hint = "calibrate on the phantom TASK.md names" if calibrated else "check --unit in TASK.md"
        checks.append(
            (
                False,
                f"{len(out)} of {len(task.case_ids)} sizes are outside the model range "
                f"{low:g}-{high:g} cm: {hint}",
            )
        )
    else:
        checks.append(
            (True, f"all {len(task.case_ids)} sizes are in the model range {low:g}-{high:g} cm")
        )
    return checks


def _figure(task: Task, settings: dict[str, Any], passed: bool) -> dict[str, Any]:
    """The check the receipt states: the pilot case, what the check saw there, whether it passed.

    Sizes: the case's size in cm as the pipeline reads it (``size_cm``); a calibrated
    task: the scale read off the pilot case (``scale``); codes: the case's code in the
    model table's scheme (``model_code``, empty when the table lacks it).
    """
    case = settings["case"]
    if task.by_code:
        code = task.code(case, settings["codes"])
        return {"case": case, "name": "model_code", "value": code or "", "passed": code is not None}
    if "calibration" in task.meta:
        return {
            "case": case,
            "name": "scale",
            "value": round(settings["scale"], 6),
            "passed": passed,
        }
    low, high = task.model["range_cm"]
    size = task.size_cm(case, settings)
    return {"case": case, "name": "size_cm", "value": round(size, 4), "passed": low <= size <= high}


# -- commands ---------------------------------------------------------------------------


def _needed_flag(task: Task) -> str:
    """The pilot flag this task needs, read from TASK.md (unit, phantom) or the data (codes)."""
    if task.by_code:
        fix = _code_fix(task)
        return f"--codes {fix}" if fix else "no --codes fix maps every code"
    card = Path("TASK.md").read_text(encoding="utf-8") if Path("TASK.md").exists() else ""
    if "calibration" in task.meta:
        found = re.search(r"calibrate on phantom (\S+?)\.?(\s|$)", card)
        return f"--case {found.group(1)}" if found else "--case <the phantom TASK.md names>"
    found = re.search(r"sizes are in (mm|cm)\b", card)
    return f"--unit {found.group(1)}" if found else "--unit <the unit TASK.md names>"


def plan(task: Task) -> None:
    """S1: the plan, with the three sections the contract asks for and the flag it needs."""
    text = (
        "# Plan\n\n## Preprocess\nRead task.json, TASK.md and data/cases.csv "
        f"({len(task.case_ids)} cases). {_PLAN_STEPS.get(task.track, '')} "
        f"This task needs {_needed_flag(task)}.\n\n"
        "## Inference\nInstall pipeline/infer.py, pilot one case into validation/pilot.csv "
        "and fix the flag until every check passes; then label every case into "
        "outputs/predictions.csv.\n\n"
        "## Postprocess\nWrite outputs/submission.csv in the schema of task.json; "
        "every artifact gets a receipt with its sha256.\n"
    )
    _write(PLAN, text)
    print(f"wrote {PLAN}")


def setup(task: Task) -> None:
    """S2: the environment record, and this tool installed as the pipeline."""
    env = {"python": platform.python_version(), "pipeline": PIPELINE, "track": task.track}
    _write(ENVIRONMENT, json.dumps(env, indent=2) + "\n")
    here = Path(__file__).resolve()
    if here != Path(PIPELINE).resolve():
        Path(PIPELINE).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(here, PIPELINE)
    print(f"wrote {ENVIRONMENT} and {PIPELINE}")


def check(task: Task) -> None:
    """S3's look before writing: what the data needs, without writing anything."""
    if task.by_code:
        fix = _code_fix(task)
        if fix == "none":
            print("check: every code is in the model table: pilot without --codes")
        elif fix:
            print(f"check: codes need a fix: pilot with --codes {fix}")
        else:
            print("check: no --codes fix maps every code to the model table")
    elif "calibration" in task.meta:
        print("check: sizes need calibration: pilot with --case <phantom id from TASK.md>")
    else:
        print("check: the data does not record its unit: pilot with --unit <unit from TASK.md>")


def pilot(task: Task, args: argparse.Namespace) -> None:
    """S3: one case through the pipeline, the checks, the receipt and the settings."""
    settings = task.settings(args.case, args.unit, args.codes)
    case = settings["case"]
    label = task.label(case, settings)
    checks = _checks(task, settings)
    _write_labels(PILOT, [(case, label)])
    _write(SETTINGS, json.dumps(settings, indent=2) + "\n")
    passed = all(ok for ok, _ in checks)
    receipt = _receipt(
        PILOT,
        case=case,
        passed=passed,
        checks=[m for _, m in checks],
        check=_figure(task, settings, passed),
        settings=SETTINGS,
    )
    print(f"pilot {case}: label {label}")
    for ok, message in checks:
        print(f"CHECK {'OK' if ok else 'FAILED'}: {message}")
    print(f"wrote {PILOT}, {SETTINGS} and {receipt}")


def infer(task: Task) -> None:
    """S4: every case, with the settings the pilot recorded."""
    if Path(SETTINGS).is_file():
        settings = _json(SETTINGS)
        shown = ", ".join(f"{k}={settings[k]}" for k in ("unit", "case", "codes"))
        print(f"settings from {SETTINGS}: {shown}")
    else:
        settings = task.settings(None, None, None)
        settings["scale"] = 1.0  # nothing was validated, so nothing is calibrated
        print(f"WARNING: no {SETTINGS} (no pilot ran); using the defaults")
    labels = [(c, task.label(c, settings)) for c in task.case_ids]
    if task.by_code:
        unknown = [c for c in task.case_ids if task.code(c, settings["codes"]) is None]
        if unknown:
            print(f"WARNING: {len(unknown)} codes are not in the model table; labelled 0")
    _write_labels(PREDICTIONS, labels)
    receipt = _receipt(PREDICTIONS, cases=len(labels), missing=[])
    print(f"labelled {len(labels)} cases: wrote {PREDICTIONS} and {receipt}")


def submit(task: Task) -> None:
    """S5: the predictions in task.json's schema: its columns, one row per case, in order."""
    if not Path(PREDICTIONS).is_file():
        raise ToolError(f"no {PREDICTIONS}: run python {PIPELINE} {PREDICTIONS} first")
    predicted = {r.get("id", ""): r.get("label", "") for r in _rows(PREDICTIONS)}
    missing = [c for c in task.case_ids if c not in predicted]
    if missing:
        raise ToolError(f"{PREDICTIONS} lacks cases {', '.join(missing)}: run S4 again")
    columns = task.meta["submission"]["columns"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([c, predicted[c]] for c in task.case_ids)
    _write(SUBMISSION, buf.getvalue())
    receipt = _receipt(SUBMISSION, cases=len(task.case_ids), columns=columns)
    print(f"wrote {SUBMISSION} ({len(task.case_ids)} rows, columns {columns}) and {receipt}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipe.py", description="One command per stage of a skill_ladder task."
    )
    parser.add_argument("target", help=f"one of: {', '.join(TARGETS)}")
    parser.add_argument("--unit", choices=sorted(TO_CM), help="unit of the values (default cm)")
    parser.add_argument("--case", help="the case to pilot (default: the first case)")
    parser.add_argument("--codes", choices=FIXES, help="how to read the codes (default none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit status."""
    args = _parser().parse_args(argv)
    try:
        task = Task()
        if args.target not in TARGETS:
            raise ToolError(f"unknown target {args.target!r}; choose one of {', '.join(TARGETS)}")
        if args.target in ("plan", "setup"):
            {"plan": plan, "setup": setup}[args.target](task)
            return 0
        # The pipeline's own commands run the installed pipeline, so the run is on record.
        if Path(__file__).resolve() != Path(PIPELINE).resolve():
            where = f"python {PIPELINE} {args.target}"
            if not Path(PIPELINE).is_file():
                raise ToolError(
                    f"install the pipeline first (python tool/pipe.py setup), then {where}"
                )
            raise ToolError(f"run the installed pipeline: {where}")
        if args.target == PILOT:
            pilot(task, args)
        else:
            {"check": check, PREDICTIONS: infer, SUBMISSION: submit}[args.target](task)
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Both tool/pipe.py and pipeline/infer.py sit one folder below the task's root, and
    # every path above is relative to it, wherever the command is started from.
    os.chdir(Path(__file__).resolve().parent.parent)
    sys.exit(main())
