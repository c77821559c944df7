"""Build hook: ship ``bat_gym-autoregister.pth`` next to the package.

Gymnasium 1.x loads no plugins, so ``gym.make("bat/Validate-v0")`` can only find the
ids if something registers them before the call. The ``.pth`` file runs one tiny
import at interpreter start-up that waits for Gymnasium to be imported and registers
the ``bat/*`` ids then (see ``bat_gym/_autoregister.py``); processes that never import
Gymnasium pay nothing else. Regular wheels get the file through ``build_py``; editable
installs through ``editable_wheel``, whose strategy hook is private setuptools API, so
a setuptools that changes it only loses the convenience (``import bat_gym`` still works).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "bat_gym-autoregister.pth"
PTH_TEXT = (Path(__file__).parent / "bat_gym" / "autoregister.pth.txt").read_text()


class BuildPyWithPth(build_py):
    """``build_py`` that also writes the ``.pth`` file into the build tree."""

    def run(self):  # noqa: D102
        super().run()
        Path(self.build_lib, PTH_NAME).write_text(PTH_TEXT)

    def get_outputs(self, include_bytecode=True):  # noqa: D102
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH_NAME))]


cmdclass = {"build_py": BuildPyWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheelWithPth(editable_wheel):
        """``editable_wheel`` whose install strategy also adds the ``.pth`` file."""

        def _select_strategy(self, *args, **kwargs):
            strategy = super()._select_strategy(*args, **kwargs)

            class WithPth:
                def __enter__(self):
                    strategy.__enter__()
                    return self

                def __exit__(self, *exc):
                    return strategy.__exit__(*exc)

                def __call__(self, wheel, files, mapping):
                    strategy(wheel, files, mapping)
                    wheel.writestr(PTH_NAME, PTH_TEXT)

            return WithPth()

    if hasattr(editable_wheel, "_select_strategy"):
        cmdclass["editable_wheel"] = EditableWheelWithPth
except ImportError:
    pass

setup(cmdclass=cmdclass)
