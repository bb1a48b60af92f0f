"""sluice.report on the files of a real run kept in testdata/report/smoke-eta3,
and on bad input made from them (missing, empty, torn, malformed).

Run by ctest with PYTHONPATH=<build>/python and SLUICE_SOURCE_DIR.
"""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_checks  # noqa: E402

SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(SOURCE_DIR, "testdata", "report", "smoke-eta3")


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sluice-report-test-")
        self.run_dir = os.path.join(self.tmp, "run")
        shutil.copytree(FIXTURE, self.run_dir)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_writes_every_figure_in_both_formats_by_default(self):
        status, out, err = report_checks.run_report(self.run_dir)
        self.assertEqual(status, 0, err)
        out_dir = os.path.join(self.run_dir, "report")
        self.assertIn(os.path.join(out_dir, "index.html"), out)
        report = report_checks.check_report(self, self.run_dir, out_dir, ("png", "svg"))
        # The fixture saw staleness 0, 1 and 2 under eta 3.
        self.assertIn("series-staleness-histogram_2", report["figures"]["staleness"]["series"])
        self.assertNotIn("series-staleness-histogram_3", report["figures"]["staleness"]["series"])
        self.assertEqual(report["figures"]["staleness"]["series"]["series-staleness-eta"]["y"],
                         [3, 3])
        self.assertEqual(report["summary"]["state"], "RUN_STATE_SUCCEEDED")

    def test_png_only_and_svg_only_to_another_directory(self):
        for fmt in ("png", "svg"):
            out_dir = os.path.join(self.tmp, "out-" + fmt)
            status, _, err = report_checks.run_report(self.run_dir, "--out", out_dir,
                                                      "--format", fmt)
            self.assertEqual(status, 0, err)
            report_checks.check_report(self, self.run_dir, out_dir, (fmt,))
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "report")))

    def test_svg_is_reproducible(self):
        first = os.path.join(self.tmp, "a")
        second = os.path.join(self.tmp, "b")
        for out_dir in (first, second):
            status, _, err = report_checks.run_report(self.run_dir, "--out", out_dir,
                                                      "--format", "svg")
            self.assertEqual(status, 0, err)
        for name in report_checks.FIGURES:
            with open(os.path.join(first, name + ".svg"), "rb") as a, \
                    open(os.path.join(second, name + ".svg"), "rb") as b:
                self.assertEqual(a.read(), b.read(), name)

    def test_torn_last_line_is_skipped_with_a_warning(self):
        metrics = os.path.join(self.run_dir, "metrics.jsonl")
        with open(metrics, "rb") as handle:
            lines = handle.read().splitlines(keepends=True)
        with open(metrics, "wb") as handle:
            handle.writelines(lines)
            handle.write(lines[-1][: len(lines[-1]) // 2])  # a line being written
        status, _, err = report_checks.run_report(self.run_dir, "--format", "svg")
        self.assertEqual(status, 0, err)
        self.assertIn("torn last line", err)
        self.assertIn("metrics.jsonl:%d" % (len(lines) + 1), err)
        report_checks.check_report(self, self.run_dir, os.path.join(self.run_dir, "report"),
                                   ("svg",))

    def test_running_run_without_summary_still_reports(self):
        os.remove(os.path.join(self.run_dir, "summary.json"))
        status, _, err = report_checks.run_report(self.run_dir, "--format", "png")
        self.assertEqual(status, 0, err)
        self.assertIn("no summary.json", err)
        with open(os.path.join(self.run_dir, "report", "index.html")) as handle:
            self.assertIn("summary.json not found", handle.read())

    def assertBadInput(self, args, *expected):
        status, out, err = report_checks.run_report(*args)
        self.assertEqual(status, 2, "exit %d\nstdout: %s\nstderr: %s" % (status, out, err))
        self.assertIn("sluice report: error: ", err)
        for text in expected:
            self.assertIn(text, err)
        self.assertNotIn("Traceback", err)

    def test_missing_directory(self):
        missing = os.path.join(self.tmp, "no-such-run")
        self.assertBadInput([missing], missing, "no such directory")

    def test_a_file_instead_of_a_directory(self):
        path = os.path.join(self.run_dir, "summary.json")
        self.assertBadInput([path], "not a directory")

    def test_no_metrics_file(self):
        os.remove(os.path.join(self.run_dir, "metrics.jsonl"))
        self.assertBadInput([self.run_dir], "metrics.jsonl: not found")

    def test_empty_run(self):
        open(os.path.join(self.run_dir, "metrics.jsonl"), "w").close()
        self.assertBadInput([self.run_dir], "no training steps")

    def test_only_a_torn_line(self):
        with open(os.path.join(self.run_dir, "metrics.jsonl"), "w") as handle:
            handle.write('{"step": 1, "loss"')
        self.assertBadInput([self.run_dir], "no training steps")

    def test_malformed_line_in_the_middle(self):
        metrics = os.path.join(self.run_dir, "metrics.jsonl")
        with open(metrics) as handle:
            lines = handle.readlines()
        lines[4] = "not json\n"
        with open(metrics, "w") as handle:
            handle.writelines(lines)
        self.assertBadInput([self.run_dir], "metrics.jsonl:5: not a JSON object")

    def test_bad_format_flag(self):
        status, _, err = report_checks.run_report(self.run_dir, "--format", "gif")
        self.assertEqual(status, 2)
        self.assertIn("invalid choice", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
