"""Commands are plugins: ``bat-gym plugins`` lists every kind, and a missing extra is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from typer.testing import CliRunner

from bat_gym.cli import COMMANDS, app
from bat_gym.core.plugins import KINDS

runner = CliRunner()


def test_plugins_lists_every_kind_with_the_distribution_declaring_each():
    shown = runner.invoke(app, ["plugins"])
    assert shown.exit_code == 0, shown.output
    for kind in KINDS:
        assert f"{kind} (bat_gym.{kind}):" in shown.output
    lines = shown.output.splitlines()
    assert any(line.split()[:2] == ["file_exists", "bat-gym"] for line in lines)
    assert any(line.split()[:2] == ["toy_pipeline", "bat-gym"] for line in lines)
    assert any(
        line.split()[:3] == ["train", "bat-gym", "bat_gym.trainers.cli:train_app"] for line in lines
    )


def test_plugins_of_one_kind_and_an_unknown_kind():
    shown = runner.invoke(app, ["plugins", "exploits"])
    assert shown.exit_code == 0 and "prose_claims" in shown.output
    assert "file_exists" not in shown.output
    wrong = runner.invoke(app, ["plugins", "chekcs"])
    assert wrong.exit_code == 2 and "the kinds are benchmarks" in wrong.output


def test_plugins_lists_without_importing_a_plugin_of_another_kind():
    code = textwrap.dedent(
        """
        import sys
        sys.argv = ["bat-gym", "plugins"]
        from bat_gym.cli import main
        try:
            main()
        except SystemExit:
            pass
        kinds = ("bat_gym.rubrics.verifier.checks.artifact", "bat_gym.audits.exploits", "bat_gym.envs.")
        print([m for m in sys.modules if m.startswith(kinds)], file=sys.stderr)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "file_exists" in done.stdout and "prose_claims" in done.stdout
    assert done.stderr.strip() == "[]"


def test_every_command_is_a_declared_plugin():
    assert {"demo", "eval", "bank", "plugins", "train", "loop", "tiny-model"} <= set(COMMANDS)


# A process in which the train extra is missing: importing torch or transformers fails
# as it does on an install without the extra. BLOCKED decides how far that reaches.
WITHOUT_TRAIN = textwrap.dedent(
    """
    import sys

    BLOCKED = {blocked!r}

    class WithoutTrainExtra:
        def find_spec(self, name, path=None, target=None):
            if name in BLOCKED or name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, WithoutTrainExtra())
    sys.argv = ["bat-gym", *{args!r}]
    from bat_gym.cli import main

    main()
    """
)


def _without_train(args: list[str], blocked: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    code = WITHOUT_TRAIN.format(args=args, blocked=blocked)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def _one_line_naming_the_extra(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{sys.executable} -m pip install" in lines[0] and "[train]" in lines[0]
    assert "No module named" in lines[0]


def test_a_trainer_command_without_its_extra_says_what_to_install():
    # The trainers' CLI imports; the command's body needs transformers and torch.
    done = _without_train(
        ["train", "sft", "--model", "tiny", "--steps", "1"], ("torch", "transformers")
    )
    _one_line_naming_the_extra(done)
    assert "bat-gym train needs an extra" in done.stderr


def test_a_command_whose_module_cannot_import_stays_listed_and_says_what_to_install():
    blocked = ("torch", "transformers", "bat_gym.trainers.cli")
    listed = _without_train(["--help"], blocked)
    assert listed.returncode == 0, listed.stderr
    assert "train" in listed.stdout and "tiny-model" in listed.stdout
    _one_line_naming_the_extra(_without_train(["tiny-model", "out"], blocked))
    _one_line_naming_the_extra(_without_train(["train", "grpo", "--help"], blocked))
