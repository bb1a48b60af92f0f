"""The Python client against a real local stack (`sluice up`), as a user's code
would use it: submit specs (a YAML path, a dict, YAML text), watch runs to
their end, list, get, cancel, bad specs, a controller restart mid-watch, the
example script, and `sluice report` on the runs it made.

Needs SLUICE_BIN_DIR (the binaries) and PYTHONPATH=<build>/python; ctest sets
both. Every process it starts is stopped in tearDownClass.
"""

import copy
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_checks  # noqa: E402
import stack  # noqa: E402

import sluice  # noqa: E402
from sluice.v1 import controller_pb2  # noqa: E402

SMOKE = os.path.join(stack.source_dir(), "configs", "smoke.yaml")
EXAMPLE = os.path.join(stack.source_dir(), "docs", "examples", "submit_and_watch.py")
ACTIVE = ("pending", "warm_start", "training", "evaluating", "queued")
WATCH_LIMIT_S = 180


def smoke_dict():
    with open(SMOKE) as handle:
        return yaml.safe_load(handle)


def long_spec(name):
    """The smoke run made long enough to be cancelled while it trains."""
    spec = smoke_dict()
    spec["name"] = name
    spec["algorithm"]["total_steps"] = 1000000
    spec["eval"] = {"every_n_steps": 0}
    return spec


class ClientProcessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = stack.LocalStack()
        try:
            cls.stack.start()
        except Exception:
            cls.stack.stop()
            raise
        # Resolved from the state directory, as a user next to `sluice up` would.
        cls.client = sluice.Client(endpoints=cls.stack.state_dir, timeout=20)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        left = cls.stack.stop()
        if left:
            raise AssertionError("services still running after the stack stopped: %s" % left)

    def setUp(self):
        # One run trains at a time: nothing a failed test left active may
        # queue the next test's runs.
        for run in self.client.list(states=ACTIVE):
            self.client.cancel(run.run_id, "cleaning up after an earlier test")
            self.wait(run.run_id)

    def wait(self, run_id, until=None):
        """Watches a run until `until(run)` or it is terminal, within a limit;
        returns every run seen."""
        seen = []
        deadline = time.monotonic() + WATCH_LIMIT_S
        for run in self.client.watch(run_id, interval=0.2):
            seen.append(run)
            if until is not None and until(run):
                return seen
            self.assertLess(time.monotonic(), deadline,
                            "run %s not done after %d s: %s"
                            % (run_id, WATCH_LIMIT_S, sluice.format_progress(run)))
        return seen

    def cancel_quietly(self, run_id):
        """Cleanup that never hides the test's own failure (the next setUp
        cancels what is left)."""
        try:
            if self.client.get(run_id).state not in sluice.TERMINAL_STATES:
                self.client.cancel(run_id, "test cleanup")
        except sluice.SluiceError:
            pass

    def run_files(self, run_id):
        return os.path.join(self.stack.runs_dir, run_id)

    # -----------------------------------------------------------------------

    def test_health_and_target_resolution(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("sluice.v1.ControllerService"), "SERVING")
        self.assertEqual(self.client.target, self.stack.controller_address())
        self.assertEqual(sluice.controller_target(
            endpoints=os.path.join(self.stack.state_dir, "endpoints.json")),
            self.stack.controller_address())
        self.assertEqual(sluice.controller_target("example.invalid:1"), "example.invalid:1")
        # $SLUICE_STATE_DIR, as the CLI's --state-dir.
        previous = os.environ.get("SLUICE_STATE_DIR")
        os.environ["SLUICE_STATE_DIR"] = self.stack.state_dir
        try:
            self.assertEqual(sluice.controller_target(), self.stack.controller_address())
        finally:
            if previous is None:
                del os.environ["SLUICE_STATE_DIR"]
            else:
                os.environ["SLUICE_STATE_DIR"] = previous
        # grpcio is grpcio: the package's health stubs did not shadow it.
        self.assertTrue(grpc.insecure_channel.__module__.startswith("grpc"))
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if entry:
                self.assertFalse(os.path.abspath(grpc.__file__).startswith(
                    os.path.abspath(entry) + os.sep), grpc.__file__)

    def test_submit_yaml_path_watch_to_succeeded_then_report(self):
        submitted = self.client.submit(SMOKE)
        self.assertTrue(submitted.run_id.startswith("run-"), submitted.run_id)
        self.assertEqual(submitted.spec.name, "smoke")
        self.assertEqual(submitted.spec.algorithm.objective, sluice_objective("grpo"))
        self.assertIn(sluice.state_name(submitted.state), ("PENDING", "WARM_START", "TRAINING"))

        seen = self.wait(submitted.run_id)
        final = seen[-1]
        self.assertEqual(sluice.state_name(final.state), "SUCCEEDED",
                         "%s: %s" % (final.error_message, sluice.format_progress(final)))
        # Snapshots in order: steps never go back, the last one is terminal and
        # nothing before it was.
        steps = [run.progress.step for run in seen]
        self.assertEqual(steps, sorted(steps))
        self.assertTrue(all(run.state not in sluice.TERMINAL_STATES for run in seen[:-1]))
        self.assertEqual(final.progress.step, 40)

        got = self.client.get(submitted.run_id)
        self.assertEqual(got.run_id, submitted.run_id)
        self.assertEqual(got.state, controller_pb2.RUN_STATE_SUCCEEDED)
        self.assertEqual(got.summary.steps, 40)
        self.assertEqual(got.summary.state, "RUN_STATE_SUCCEEDED")
        self.assertIn("succeeded", sluice.format_progress(got))

        # `sluice report` (python3 -m sluice.report) on the run just made.
        run_dir = self.run_files(submitted.run_id)
        out_dir = os.path.join(self.stack.root, "report")
        status, _, err = report_checks.run_report(run_dir, "--out", out_dir)
        self.assertEqual(status, 0, err)
        report = report_checks.check_report(self, run_dir, out_dir, ("png", "svg"))
        self.assertEqual(report["steps"], 40)
        self.assertEqual(report["run_id"], submitted.run_id)

    def test_submit_dict_and_yaml_text(self):
        spec = smoke_dict()
        spec["name"] = "smoke-from-a-dict"
        spec["algorithm"]["objective"] = "OBJECTIVE_GRPO"  # full names work too
        spec["algorithm"]["total_steps"] = 12
        spec["labels"] = {"client": "python", "attempt": 1}
        submitted = self.client.submit(spec)
        final = self.wait(submitted.run_id)[-1]
        self.assertEqual(final.state, controller_pb2.RUN_STATE_SUCCEEDED, final.error_message)
        self.assertEqual(final.spec.name, "smoke-from-a-dict")
        self.assertEqual(dict(final.spec.labels), {"client": "python", "attempt": "1"})
        self.assertEqual(final.progress.step, 12)
        self.assertEqual(self.client.wait(submitted.run_id).state,
                         controller_pb2.RUN_STATE_SUCCEEDED)

        # YAML text, checked by the controller only (validate_only): defaults
        # come back resolved and no run is created.
        before = {run.run_id for run in self.client.list()}
        with open(SMOKE) as handle:
            text = handle.read().replace("name: smoke", "name: smoke-as-text")
        validated = self.client.submit(text, validate_only=True)
        self.assertEqual(validated.run_id, "")
        self.assertEqual(validated.spec.name, "smoke-as-text")
        self.assertEqual(validated.spec.algorithm.clip_eps_low, 0.2)  # a resolved default
        self.assertEqual({run.run_id for run in self.client.list()}, before)

    def test_bad_specs_and_calls_give_clear_errors(self):
        # Found locally, before anything is sent: the field and a suggestion.
        spec = smoke_dict()
        spec["algoritm"] = spec.pop("algorithm")
        with self.assertRaises(sluice.SpecError) as caught:
            self.client.submit(spec)
        self.assertIn('unknown field "algoritm" in the run spec; did you mean "algorithm"?',
                      str(caught.exception))
        with self.assertRaises(sluice.SpecError) as caught:
            self.client.submit("algorithm: {objective: grpoo}\n")
        self.assertIn("spec:1: algorithm.objective: unknown value \"grpoo\"",
                      str(caught.exception))
        with self.assertRaises(sluice.SpecError) as caught:
            self.client.submit("/nonexistent/spec.yaml")
        self.assertIn("/nonexistent/spec.yaml: cannot read", str(caught.exception))

        # Found by the controller: INVALID_ARGUMENT with its own message,
        # naming the field, one line per problem.
        spec = smoke_dict()
        spec["algorithm"]["group_size"] = 1
        del spec["task"]
        with self.assertRaises(sluice.SluiceError) as caught:
            self.client.submit(spec)
        error = caught.exception
        self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(error.method, "SubmitRun")
        self.assertIn("algorithm.group_size: must be >= 2", str(error))
        self.assertTrue(any(line.startswith("task:") for line in error.errors), error.errors)
        self.assertTrue(any(line.startswith("algorithm.group_size:") for line in error.errors),
                        error.errors)

        with self.assertRaises(sluice.SluiceError) as caught:
            self.client.get("run-does-not-exist")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(sluice.SluiceError) as caught:
            list(self.client.watch("run-does-not-exist"))
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

        # Nobody listening: a clear UNAVAILABLE, not a hang.
        with sluice.Client("127.0.0.1:1", timeout=2) as nowhere:
            with self.assertRaises(sluice.SluiceError) as caught:
                nowhere.list()
        self.assertIn(caught.exception.code,
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))
        self.assertIn("cannot reach the controller at 127.0.0.1:1", str(caught.exception))

    def test_cancel_a_training_run_and_a_queued_one(self):
        running = self.client.submit(long_spec("long-to-cancel"))
        try:
            seen = self.wait(running.run_id, until=lambda run: run.progress.step >= 2)
            self.assertEqual(seen[-1].state, controller_pb2.RUN_STATE_TRAINING)
            # A second run waits for the first.
            queued = self.client.submit(long_spec("queued-behind"))
            self.assertEqual(queued.state, controller_pb2.RUN_STATE_QUEUED)
            self.assertEqual(queued.queue_position, 1)
            cancelled = self.client.cancel(queued.run_id, "not needed")
            self.assertEqual(cancelled.state, controller_pb2.RUN_STATE_CANCELLED)

            result = self.client.cancel(running.run_id, "enough of that")
            self.assertIn(result.state, (controller_pb2.RUN_STATE_CANCELLED,))
            final = self.wait(running.run_id)[-1]
            self.assertEqual(final.state, controller_pb2.RUN_STATE_CANCELLED)
            self.assertIn("enough of that", final.error_message)
            self.assertLess(final.progress.step, 1000000)
        finally:
            self.cancel_quietly(running.run_id)

        # list: newest first, filtered by state names.
        runs = self.client.list()
        ids = [run.run_id for run in runs]
        self.assertLess(ids.index(queued.run_id), ids.index(running.run_id))
        created = [run.created_at.ToNanoseconds() for run in runs]
        self.assertEqual(created, sorted(created, reverse=True))
        cancelled_ids = {run.run_id for run in self.client.list(states=["cancelled"])}
        self.assertTrue({running.run_id, queued.run_id} <= cancelled_ids)
        self.assertFalse({run.run_id for run in self.client.list(states=["RUN_STATE_SUCCEEDED"])}
                         & {running.run_id, queued.run_id})
        self.assertEqual(len(self.client.list(limit=1)), 1)
        with self.assertRaises(ValueError):
            self.client.list(states=["finished"])

    def test_watch_rides_out_a_controller_restart(self):
        run = self.client.submit(long_spec("long-through-a-restart"))
        try:
            watch = self.client.watch(run.run_id, interval=0.2)
            killed_at_step = None
            old_pid = self.stack.service("controller")["pid"]
            after_kill = []
            deadline = time.monotonic() + WATCH_LIMIT_S
            for snapshot in watch:
                self.assertLess(time.monotonic(), deadline)
                if killed_at_step is None:
                    if snapshot.progress.step >= 2:
                        killed_at_step = snapshot.progress.step
                        os.kill(old_pid, signal.SIGKILL)  # sluice up restarts it
                    continue
                after_kill.append(snapshot)
                # Once the restarted controller has re-adopted the run and it
                # trained on, cancel it; the same watch must see CANCELLED.
                if (snapshot.progress.step > killed_at_step + 2
                        and snapshot.state == controller_pb2.RUN_STATE_TRAINING):
                    self.client.cancel(run.run_id, "restart test done")
            self.assertIsNotNone(killed_at_step)
            self.assertEqual(after_kill[-1].state, controller_pb2.RUN_STATE_CANCELLED,
                             after_kill[-1].error_message)
            self.assertGreater(max(s.progress.step for s in after_kill), killed_at_step + 2)
            new_pid = self.stack.service("controller")["pid"]
            self.assertNotEqual(new_pid, old_pid)
            self.assertGreaterEqual(
                self.stack.endpoints()["services"]["controller"]["restarts"], 1)
        finally:
            self.cancel_quietly(run.run_id)

    def test_example_script(self):
        process = subprocess.run(
            [report_checks.PYTHON, EXAMPLE, SMOKE, "--state-dir", self.stack.state_dir,
             "--name", "smoke-from-the-example"],
            capture_output=True, text=True, timeout=WATCH_LIMIT_S, env=os.environ.copy())
        self.assertEqual(process.returncode, 0, process.stdout + process.stderr)
        self.assertIn("SUCCEEDED", process.stdout)
        runs = [r for r in self.client.list() if r.spec.name == "smoke-from-the-example"]
        self.assertEqual(len(runs), 1)
        self.assertIn(runs[0].run_id, process.stdout)
        # A bad spec: exit 2 and the controller's message.
        bad = copy.deepcopy(smoke_dict())
        bad["algorithm"]["group_size"] = 1
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
            yaml.safe_dump(bad, handle)
        process = subprocess.run(
            [report_checks.PYTHON, EXAMPLE, handle.name, "--state-dir", self.stack.state_dir],
            capture_output=True, text=True, timeout=60, env=os.environ.copy())
        os.unlink(handle.name)
        self.assertEqual(process.returncode, 2, process.stdout + process.stderr)
        self.assertIn("algorithm.group_size: must be >= 2", process.stderr)


def sluice_objective(name):
    from sluice.v1 import common_pb2

    return common_pb2.Objective.Value("OBJECTIVE_" + name.upper())


if __name__ == "__main__":
    unittest.main(verbosity=2)
