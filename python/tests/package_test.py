"""The client as a package a user installs: the wheel the build made, and
`pip install ./python` from a checkout, each into a fresh virtual environment;
then a run submitted and watched from that environment against a real local
stack, and `sluice-report` drawing it.

This machine reaches no package index, so each venv is made with
--system-site-packages over Debian's grpcio, protobuf, PyYAML and matplotlib,
and the package is installed with --no-deps (and, from the checkout,
--no-build-isolation: setuptools, wheel and protoc are Debian's). Everything
else is what a user does. The test's own process never imports the package:
it runs the venv's interpreter, with no PYTHONPATH, from a directory outside
the source tree.

Needs SLUICE_BIN_DIR, SLUICE_SOURCE_DIR and SLUICE_PYTHON_WHEEL (ctest sets
them). Every process it starts is stopped at the end.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stack  # noqa: E402

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SOURCE = stack.source_dir()
WHEEL = os.environ.get("SLUICE_PYTHON_WHEEL", "")
REQUIRES = {"grpcio", "protobuf", "PyYAML"}
DEBIAN_PACKAGES = "python3-venv python3-pip python3-setuptools python3-wheel"


def run(command, timeout=300, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(kwargs.pop("env", {}))
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    env.setdefault("PIP_NO_CACHE_DIR", "1")
    env.setdefault("PIP_ROOT_USER_ACTION", "ignore")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, **kwargs)


class Venv:
    def __init__(self, root, name):
        self.path = os.path.join(root, name)
        result = run([PYTHON, "-m", "venv", "--system-site-packages", self.path])
        if result.returncode != 0:
            raise AssertionError("python3 -m venv failed (Debian: %s):\n%s"
                                 % (DEBIAN_PACKAGES, result.stderr))
        self.python = os.path.join(self.path, "bin", "python")
        self.cwd = root  # not the source tree: nothing importable by accident

    def pip_install(self, *args):
        result = run([self.python, "-m", "pip", "install", "--no-deps", "--no-index", *args],
                     cwd=self.cwd)
        if result.returncode != 0:
            raise AssertionError("pip install %s failed:\n%s%s"
                                 % (" ".join(args), result.stdout, result.stderr))
        return result

    def python_code(self, code, **kwargs):
        return run([self.python, "-c", code], cwd=self.cwd, **kwargs)


INSPECT = r"""
import importlib.metadata as md, json, os, sys
import grpc, sluice
from sluice.v1 import controller_pb2_grpc, trainer_pb2_grpc
from sluice._health import health_pb2_grpc
dist = md.distribution("sluice-client")
print(json.dumps({
    "sluice": sluice.__file__, "version": sluice.__version__, "dist_version": dist.version,
    "prefix": sys.prefix, "grpc_channel": grpc.insecure_channel.__module__,
    "stubs": [controller_pb2_grpc.ControllerServiceStub.__name__, health_pb2_grpc.HealthStub.__name__],
    "requires": dist.requires or [],
    "scripts": [e.name for e in dist.entry_points if e.group == "console_scripts"],
    "top_level_grpc": os.path.exists(os.path.join(os.path.dirname(os.path.dirname(sluice.__file__)), "grpc", "health")),
}))
"""


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="sluice-py-package-")
        cls.stack = None

    @classmethod
    def tearDownClass(cls):
        if cls.stack is not None:
            left = cls.stack.stop()
            if left:
                raise AssertionError("services still running after the stack stopped: %s" % left)
        shutil.rmtree(cls.root, ignore_errors=True)

    def inspect(self, venv):
        result = venv.python_code(INSPECT)
        self.assertEqual(result.returncode, 0, result.stderr)
        info = json.loads(result.stdout)
        # The installed copy, not the source tree's or build/python's.
        self.assertTrue(info["sluice"].startswith(os.path.realpath(venv.path)) or
                        info["sluice"].startswith(venv.path), info["sluice"])
        self.assertEqual(info["version"], info["dist_version"])
        self.assertEqual(info["grpc_channel"], "grpc")
        self.assertFalse(info["top_level_grpc"], "a top-level grpc/health would shadow grpcio")
        self.assertEqual(info["stubs"], ["ControllerServiceStub", "HealthStub"])
        names = {r.split(";")[0].split("(")[0].split(">")[0].split("=")[0].strip() for r in info["requires"]}
        self.assertTrue(REQUIRES <= names, info["requires"])
        extras = [r for r in info["requires"] if "extra ==" in r]
        self.assertTrue(any(r.startswith("matplotlib") and "report" in r for r in extras), info["requires"])
        self.assertIn("sluice-report", info["scripts"])
        return info

    def test_1_wheel_from_the_build(self):
        self.assertTrue(WHEEL and os.path.isfile(WHEEL),
                        "no wheel at %r: the build makes it (target sluice_python_wheel; Debian: %s)"
                        % (WHEEL, DEBIAN_PACKAGES))
        with zipfile.ZipFile(WHEEL) as wheel:
            names = set(wheel.namelist())
        for generated in ("sluice/v1/controller_pb2.py", "sluice/v1/controller_pb2_grpc.py",
                          "sluice/_health/health_pb2_grpc.py", "sluice/client.py", "sluice/report.py"):
            self.assertIn(generated, names)
        self.assertFalse(any(n.startswith("grpc/") for n in names), sorted(names))
        venv = Venv(self.root, "wheel-venv")
        venv.pip_install(WHEEL)
        self.inspect(venv)
        type(self).wheel_venv = venv

    def test_2_pip_install_from_a_checkout(self):
        # A copy of what `pip install ./python` reads (python/ and ../proto),
        # so that setuptools' build/ and egg-info stay out of the sources.
        checkout = os.path.join(self.root, "checkout")
        shutil.copytree(os.path.join(SOURCE, "python"), os.path.join(checkout, "python"),
                        ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
        shutil.copytree(os.path.join(SOURCE, "proto"), os.path.join(checkout, "proto"))
        venv = Venv(self.root, "checkout-venv")
        venv.pip_install("--no-build-isolation", os.path.join(checkout, "python"))
        self.inspect(venv)

    def test_3_submit_and_watch_from_the_venv(self):
        venv = getattr(type(self), "wheel_venv", None)
        if venv is None:
            self.fail("the wheel's venv was not made (test_1 failed)")
        type(self).stack = stack.LocalStack()
        endpoints = self.stack.start()
        self.assertIn("controller", endpoints["services"])
        # The example a user copies: submits configs/smoke.yaml and prints
        # progress until the run ends; exit 0 only if it SUCCEEDED.
        example = os.path.join(SOURCE, "docs", "examples", "submit_and_watch.py")
        result = run([venv.python, example, os.path.join(SOURCE, "configs", "smoke.yaml"),
                      "--state-dir", self.stack.state_dir, "--name", "smoke-from-a-venv"],
                     cwd=venv.cwd, timeout=400)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn("SUCCEEDED", result.stdout)
        run_id = result.stdout.split("submitted ", 1)[1].split()[0]
        # And the report extra's console script on the run it made.
        run_dir = os.path.join(self.stack.runs_dir, run_id)
        out = os.path.join(self.root, "report")
        report = run([os.path.join(venv.path, "bin", "sluice-report"), run_dir, "--out", out,
                      "--format", "svg"], cwd=venv.cwd, env={"MPLBACKEND": "Agg"}, timeout=300)
        self.assertEqual(report.returncode, 0, report.stdout + report.stderr)
        self.assertTrue(os.path.isfile(os.path.join(out, "index.html")), os.listdir(out))


if __name__ == "__main__":
    unittest.main(verbosity=2)
