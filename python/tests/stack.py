"""A real local stack (`sluice up`) for the Python tests, stopped whatever happens."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time


def bin_dir():
    path = os.environ.get("SLUICE_BIN_DIR")
    if not path:
        raise RuntimeError("SLUICE_BIN_DIR is not set: the directory of the sluice binaries "
                           "(build/bin); ctest sets it")
    return path


def source_dir():
    return os.environ.get("SLUICE_SOURCE_DIR") or os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", ".."))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class LocalStack:
    """`sluice up --state-dir D --runs-dir R` in its own process group.

    start() waits for D/endpoints.json; stop() sends SIGTERM (sluice up stops
    its services), then SIGKILLs the group after a grace period, and checks
    that every service pid it saw is gone. Its directory (state, runs, logs)
    is removed then, unless SLUICE_KEEP_TEST_DIRS is set.
    """

    def __init__(self, rollout_workers=1, extra_flags=()):
        self.root = tempfile.mkdtemp(prefix="sluice-py-stack-")
        self.state_dir = os.path.join(self.root, "state")
        self.runs_dir = os.path.join(self.root, "runs")
        self.log_path = os.path.join(self.root, "sluice-up.log")
        self.rollout_workers = rollout_workers
        self.extra_flags = list(extra_flags)
        self.process = None
        self.service_pids = set()

    def start(self, timeout=120):
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [os.path.join(bin_dir(), "sluice"), "up", "--state-dir", self.state_dir,
                 "--runs-dir", self.runs_dir, "--rollout-workers", str(self.rollout_workers)]
                + self.extra_flags,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("sluice up exited with %s:\n%s"
                                   % (self.process.returncode, self.log()))
            endpoints = self.endpoints()
            if endpoints and "controller" in endpoints.get("services", {}):
                self.service_pids.update(
                    s["pid"] for s in endpoints["services"].values() if s.get("pid"))
                return endpoints
            time.sleep(0.2)
        raise RuntimeError("sluice up did not write endpoints.json within %d s:\n%s"
                           % (timeout, self.log()))

    def endpoints(self):
        try:
            with open(os.path.join(self.state_dir, "endpoints.json")) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def controller_address(self):
        return self.endpoints()["services"]["controller"]["grpc"]

    def service(self, name):
        service = self.endpoints()["services"][name]
        self.service_pids.add(service["pid"])
        return service

    def log(self):
        try:
            with open(self.log_path, errors="replace") as handle:
                return handle.read()[-4000:]
        except OSError:
            return ""

    def stop(self, grace=30):
        """Stops the stack; returns the pids still alive afterwards (none, normally)."""
        if self.process is None:
            return []
        endpoints = self.endpoints()
        if endpoints:
            self.service_pids.update(
                s["pid"] for s in endpoints.get("services", {}).values() if s.get("pid"))
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        left = [pid for pid in self.service_pids if _alive(pid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if _alive(pid)]
        for pid in left:  # only the services this stack started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None
        if not os.environ.get("SLUICE_KEEP_TEST_DIRS"):
            shutil.rmtree(self.root, ignore_errors=True)
        return left
