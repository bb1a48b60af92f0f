#!/usr/bin/env python3
"""Reads the JUnit file that `ctest --output-junit` writes (test.sh does).

    scripts/ctest_report.py --slowest 15 build/ctest-junit.xml
        the slowest tests, with their seconds and status
    scripts/ctest_report.py --require-all-run build/ctest-junit.xml
        exit 1 when a test was not run: skipped (SKIP_RETURN_CODE 77, a
        GTEST_SKIP), disabled, or not run (its executable missing), naming
        each with the reason ctest or the test gave

ctest counts a skipped test as passed, so a suite can go green while the
tests that matter most here (docker-compose, network namespaces) did not run
at all. The one exception --require-all-run makes: a test that skipped because
no CUDA device is visible, on a machine where none is (no nvidia-smi, or it
lists no GPU); those are counted and named as such.
"""

import argparse
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

# What a test prints when it skips for want of a GPU (common/model,
# common/cuda): "[  SKIPPED ] no CUDA device ...", "no CUDA device here".
GPU_SKIP_REASON = "no CUDA device"


def read_tests(path):
    """[(name, seconds, status, reason, output)], status one of run, fail, notrun, disabled."""
    root = ElementTree.parse(path).getroot()
    tests = []
    for case in root.iter("testcase"):
        status = case.get("status", "run")
        skipped = case.find("skipped")
        if skipped is not None and status == "run":
            status = "notrun"
        output = case.findtext("system-out") or ""
        reason = skipped.get("message", "") if skipped is not None else ""
        if status == "disabled" and not reason:
            reason = "DISABLED"
        tests.append((case.get("name", "?"), float(case.get("time") or 0), status, reason, output))
    return tests


def machine_has_gpu():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def skip_line(output):
    """The test's own words on why it skipped: its last line naming a skip."""
    for line in reversed(output.splitlines()):
        if "SKIP" in line or "skip" in line:
            return line.strip()[:300]
    return ""


def print_slowest(tests, count):
    ranked = sorted(tests, key=lambda t: t[1], reverse=True)[:count]
    total = sum(t[1] for t in tests)
    print("test.sh: the %d slowest of %d tests (%.0f s of test time in all):"
          % (len(ranked), len(tests), total))
    for name, seconds, status, _, _ in ranked:
        print("  %8.1f s  %-8s %s" % (seconds, status, name))


def require_all_run(tests):
    not_run = [t for t in tests if t[2] in ("notrun", "disabled")]
    has_gpu = machine_has_gpu()
    gpu_only = [t for t in not_run if not has_gpu and GPU_SKIP_REASON in t[4]]
    refused = [t for t in not_run if t not in gpu_only]
    if gpu_only:
        print("test.sh: %d test(s) need a GPU and this machine has none (not run): %s"
              % (len(gpu_only), ", ".join(t[0] for t in gpu_only)))
    if not refused:
        print("test.sh: every test ran (%d)" % (len(tests) - len(gpu_only)))
        return 0
    print("test.sh: FAIL: %d test(s) did not run; in CI a test that cannot run fails:"
          % len(refused), file=sys.stderr)
    for name, _, status, reason, output in refused:
        said = skip_line(output)
        print("  %s (%s: %s)%s" % (name, status, reason, (" -- " + said) if said else ""),
              file=sys.stderr)
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", help="the file of ctest --output-junit")
    parser.add_argument("--slowest", type=int, default=0, help="print the N slowest tests")
    parser.add_argument("--require-all-run", action="store_true",
                        help="exit 1 when any test was not run (see above)")
    args = parser.parse_args()
    try:
        tests = read_tests(args.junit)
    except (OSError, ElementTree.ParseError) as error:
        print("test.sh: cannot read %s: %s" % (args.junit, error), file=sys.stderr)
        return 1
    if args.slowest:
        print_slowest(tests, args.slowest)
    if args.require_all_run:
        return require_all_run(tests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
