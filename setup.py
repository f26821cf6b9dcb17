"""Build step the pyproject cannot say: the scheduler hook script ships inside the package.

``scheduler_hooks/ms_recover_hook.sh`` stays where the docs and samples source it in a checkout;
the wheel carries a copy as ``ms_recover/scheduler/ms_recover_hook.sh``, which
``ms-recover hook-path`` prints.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = os.path.join("scheduler_hooks", "ms_recover_hook.sh")


class BuildPyWithHook(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout: hook-path finds HOOK there
        target = os.path.join(self.build_lib, "ms_recover", "scheduler")
        self.mkpath(target)
        self.copy_file(HOOK, os.path.join(target, "ms_recover_hook.sh"))


setup(cmdclass={"build_py": BuildPyWithHook})
