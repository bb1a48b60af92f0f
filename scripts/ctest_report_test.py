#!/usr/bin/env python3
"""Tests of scripts/ctest_report.py on JUnit files as ctest 3.25 writes them:
CI fails when a test was skipped, disabled or not run, and only a GPU test on
a machine without a GPU is let off."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "ctest_report.py")

PASSED = '''<testcase name="UnitTest.Passes" classname="UnitTest.Passes" time="1.5" status="run">
<system-out>[       OK ] UnitTest.Passes</system-out></testcase>'''
SLOW = '''<testcase name="loop_process_test.Slow" classname="x" time="95.25" status="run">
<system-out></system-out></testcase>'''
SKIPPED_77 = '''<testcase name="compose_stack_test" classname="compose_stack_test" time="0.4" status="notrun">
<skipped message="SKIP_RETURN_CODE=77"/>
<system-out>compose_test: SKIPPED: no Docker engine answers and only root can start dockerd
</system-out></testcase>'''
GTEST_SKIPPED = '''<testcase name="MultiHost.Partition" classname="x" time="0.1" status="notrun">
<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
<system-out>[  SKIPPED ] network namespaces cannot be made here</system-out></testcase>'''
GPU_SKIPPED = '''<testcase name="CudaPlacementTest.Float32LogitsOnTheGpuMatchTheCpu" classname="x" time="0.2" status="notrun">
<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
<system-out>[  SKIPPED ] no CUDA device (LibTorch 1.13.1, CPU)</system-out></testcase>'''
DISABLED = '''<testcase name="Off" classname="Off" time="0" status="disabled">
<system-out>Disabled</system-out></testcase>'''


def junit(*cases):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="sluice" tests="%d">\n%s\n'
            '</testsuite>\n' % (len(cases), "\n".join(cases)))


class CtestReportTest(unittest.TestCase):
    def run_report(self, xml, *args, path=None):
        with tempfile.TemporaryDirectory() as tmp:
            name = os.path.join(tmp, "junit.xml")
            with open(name, "w", encoding="utf-8") as handle:
                handle.write(xml)
            env = dict(os.environ)
            # No nvidia-smi on PATH: this "machine" has no GPU.
            env["PATH"] = path if path is not None else tmp
            return subprocess.run([sys.executable, REPORT, *args, name], capture_output=True,
                                  text=True, env=env, timeout=60)

    def test_all_run_passes(self):
        done = self.run_report(junit(PASSED, SLOW), "--require-all-run")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("every test ran (2)", done.stdout)

    def test_a_skipped_compose_test_fails_naming_it_and_why(self):
        done = self.run_report(junit(PASSED, SKIPPED_77), "--require-all-run")
        self.assertEqual(done.returncode, 1)
        self.assertIn("1 test(s) did not run", done.stderr)
        self.assertIn("compose_stack_test (notrun: SKIP_RETURN_CODE=77) -- compose_test: SKIPPED: "
                      "no Docker engine answers", done.stderr)

    def test_gtest_skip_and_disabled_fail(self):
        done = self.run_report(junit(GTEST_SKIPPED, DISABLED), "--require-all-run")
        self.assertEqual(done.returncode, 1)
        self.assertIn("MultiHost.Partition", done.stderr)
        self.assertIn("Off (disabled: DISABLED)", done.stderr)

    def test_a_gpu_test_may_skip_only_where_there_is_no_gpu(self):
        done = self.run_report(junit(PASSED, GPU_SKIPPED), "--require-all-run")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("1 test(s) need a GPU and this machine has none", done.stdout)
        with tempfile.TemporaryDirectory() as fake_bin:
            smi = os.path.join(fake_bin, "nvidia-smi")
            with open(smi, "w", encoding="utf-8") as handle:
                handle.write("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
            os.chmod(smi, 0o755)
            done = self.run_report(junit(PASSED, GPU_SKIPPED), "--require-all-run",
                                   path=fake_bin + os.pathsep + "/usr/bin:/bin")
        self.assertEqual(done.returncode, 1, done.stdout)
        self.assertIn("CudaPlacementTest.Float32LogitsOnTheGpuMatchTheCpu", done.stderr)

    def test_the_slowest_are_listed_slowest_first(self):
        done = self.run_report(junit(PASSED, SLOW, SKIPPED_77), "--slowest", "2")
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertIn("the 2 slowest of 3 tests", lines[0])
        self.assertIn("95.2 s  run      loop_process_test.Slow", lines[1])
        self.assertIn("1.5 s  run      UnitTest.Passes", lines[2])


if __name__ == "__main__":
    unittest.main()
