"""Ships ``src/embnum_fbgemm_compat.pth`` at the root of site-packages, in wheels and editable installs,
and a wheel built from the source tree carries the kernels compiled ahead in ``src/embnum/_prebuilt``.

The file is the start-up hook of ``embnum.fbgemm_compat``: it does nothing unless
``EMBNUM_FBGEMM_COMPAT`` is set (docs/torchrec-without-fbgemm.md). ``_prebuilt`` exists only after
``python -m embnum warmup --prebuilt`` (machine code, never in git or the sdist; ``embnum._prebuilt``
says who loads it). Everything else is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).parent / "src" / "embnum_fbgemm_compat.pth"
PREBUILT = Path(__file__).parent / "src" / "embnum" / "_prebuilt"


class BuildPyWithPth(build_py):
    """build_py, plus the hook at the root of the build directory (a wheel's purelib root) and the
    prebuilt kernels, where the tree has them."""

    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))
            if PREBUILT.is_dir():
                self.copy_tree(str(PREBUILT), str(Path(self.build_lib) / "embnum" / "_prebuilt"))


class EditableWheelWithPth(editable_wheel):
    """editable_wheel, plus the hook at the root of the editable wheel."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        found = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copyfile(PTH, Path(unpacked_wheel) / PTH.name)
        return found


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
