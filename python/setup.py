"""Builds the `sluice` package with its generated messages and stubs.

pyproject.toml declares the package; this file only adds the generation step
to setuptools' build_py: the modules generated from the repository's proto/
(python/generate_stubs.py) are written into the build directory, so they end
up in the wheel and never in the source tree. The protos are found at
$SLUICE_PROTO_ROOT, else at ../proto beside this directory (a checkout).
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate_stubs  # noqa: E402


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        proto_root = os.environ.get("SLUICE_PROTO_ROOT") or os.path.join(HERE, "..", "proto")
        if not os.path.isdir(proto_root):
            raise SystemExit(
                "sluice: cannot find the protos at %s: build from a checkout of the repository "
                "(pip install ./python) or set SLUICE_PROTO_ROOT to its proto/ directory"
                % os.path.abspath(proto_root))
        try:
            generate_stubs.generate(proto_root, self.build_lib)
        except generate_stubs.GenerateError as error:
            raise SystemExit("sluice: %s" % error)


setup(cmdclass={"build_py": BuildPyWithStubs})
