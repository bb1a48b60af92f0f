#!/usr/bin/python3
"""End-to-end test of Sluice's Prometheus rules and Grafana dashboards.

1. promtool: check the scrape configs and rule files, run the rule unit tests.
2. Check every dashboard's JSON structure (ids, gridPos, datasource, targets).
3. Start a real local stack (`sluice up`), a real Prometheus (Debian's package)
   scraping it every second through file_sd targets made from endpoints.json
   and loading the project's rules, and train a run of about 20 s on it,
   killing the reward server mid-run (`sluice up` restarts it; the targets
   are rewritten) so that the restart panels have data; then score code items
   the sandbox kills and ask for a run that does not exist, so that the
   failure panels have data too.
4. Through Prometheus's HTTP API, evaluate every PromQL expression of every
   dashboard panel and variable and of every rule: a syntax or evaluation
   error fails, and so does a panel returning no series unless it is listed
   (with why) in deploy/grafana/no-data-allowlist.json. Every job must be up,
   the rules healthy, and no critical alert condition true on the healthy stack.

Everything it starts is stopped on exit (and dies with it if it is killed).

Usage: observability_test.py --source-dir DIR [--static-only] [--dashboards DIR]
                             [--rules DIR] [--allowlist FILE] [--steps N]
SLUICE_BIN_DIR must name the directory of the sluice binaries (not needed
with --static-only, which does steps 1 and 2 only).
"""

import argparse
import ctypes
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

JOBS = {
    "controller": "sluice-controller",
    "rollout_worker": "sluice-rollout-worker",
    "reward_server": "sluice-reward-server",
    "replay_buffer": "sluice-replay-buffer",
    "trainer": "sluice-trainer",
}

# A run of the smoke configuration made long enough for a dozen or more
# one-second scrapes while it trains (about 20 s on a 2-core CPU machine).
RUN_SPEC = """\
name: observability
seed: 3
model: {builtin: micro}
task:
  arithmetic: {max_operand: 9, operators: ["+"], num_prompts: 200}
  eval_split_size: 20
warm_start: {sft_steps: 20, learning_rate: 3.0e-3, batch_size: 32}
algorithm: {objective: grpo, group_size: 4, batch_size_groups: 4, max_staleness: 1,
            learning_rate: 1.0e-3, total_steps: %d}
rollout: {sampling: {max_new_tokens: 3}}
reward:
  verifiers:
    - name: math
eval: {every_n_steps: %d}
"""

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message, flush=True)


def note(message):
    print(message, flush=True)


# --------------------------------------------------------------------------
# Processes: each child gets SIGTERM if this test dies, and is stopped on exit.
# --------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
children = []


def _die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(args, log_path, **kwargs):
    log = open(log_path, "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent, **kwargs)
    log.close()
    children.append(proc)
    return proc


def stop_children():
    # Newest first: Prometheus, then the stack (whose supervisor stops its
    # services on SIGTERM).
    for proc in reversed(children):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in reversed(children):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    children.clear()


def _on_signal(signum, _frame):
    stop_children()
    sys.exit(128 + signum)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def wait_for(what, predicate, timeout, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: a process exited with {proc.returncode}")
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


# --------------------------------------------------------------------------
# Static checks
# --------------------------------------------------------------------------

def run_promtool(args):
    result = subprocess.run(["promtool"] + args, capture_output=True, text=True)
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        fail(f"promtool {' '.join(args)}:\n{output}")
    else:
        rules = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", output))
        shown = " ".join(os.path.basename(a) if os.sep in a else a for a in args)
        note(f"ok: promtool {shown}" + (f" ({rules} rules)" if rules else ""))


def static_checks(prom_dir, rules_dir):
    for config in ("prometheus.yml", "prometheus-host.yml"):
        # Checked as mounted: /etc/prometheus/rules/ is the rule directory.
        text = open(os.path.join(prom_dir, config)).read()
        if "/etc/prometheus/rules/*.yml" not in text:
            fail(f"{config}: does not load /etc/prometheus/rules/*.yml")
        with tempfile.TemporaryDirectory(prefix="sluice-obs-config-") as scratch:
            mounted = os.path.join(scratch, config)
            with open(mounted, "w") as f:
                f.write(text.replace("/etc/prometheus/rules/", os.path.abspath(rules_dir) + "/"))
            run_promtool(["check", "config", mounted])
        # Both configs name exactly the five jobs (plus Prometheus itself).
        jobs = set(re.findall(r"job_name:\s*(\S+)", text))
        if jobs != set(JOBS.values()) | {"prometheus"}:
            fail(f"{config}: job names {sorted(jobs)} are not the shared ones {sorted(JOBS.values())}")
    rule_files = sorted(glob.glob(os.path.join(rules_dir, "*.yml")))
    if not rule_files:
        fail(f"no rule files in {rules_dir}")
    run_promtool(["check", "rules"] + rule_files)
    tests = sorted(glob.glob(os.path.join(prom_dir, "tests", "*.yml")))
    if not tests:
        fail("no promtool rule tests")
    run_promtool(["test", "rules"] + tests)


def load_dashboards(dashboard_dir):
    dashboards = []
    for path in sorted(glob.glob(os.path.join(dashboard_dir, "*.json"))):
        try:
            with open(path) as f:
                dashboards.append((os.path.basename(path), json.load(f)))
        except ValueError as error:
            fail(f"{path}: not JSON: {error}")
    if not dashboards:
        fail(f"no dashboards in {dashboard_dir}")
    return dashboards


def all_panels(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        for inner in panel.get("panels", []):  # collapsed rows
            yield inner


def check_dashboard_structure(name, d):
    where = name
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if key not in d:
            fail(f"{where}: no {key}")
    if d.get("schemaVersion", 0) < 36:
        fail(f"{where}: schemaVersion {d.get('schemaVersion')} is older than Grafana 9")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds_var = variables.get("datasource")
    if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
        fail(f"{where}: no `datasource` variable of type datasource (prometheus)")
    for var in variables.values():
        if var.get("type") == "query":
            if var.get("datasource", {}).get("uid") != "${datasource}":
                fail(f"{where}: variable {var.get('name')} does not use ${{datasource}}")
            if not variable_query(var):
                fail(f"{where}: variable {var.get('name')} has no query")
    ids = set()
    occupied = {}
    for panel in all_panels(d):
        title = panel.get("title", "?")
        pid = panel.get("id")
        if not isinstance(pid, int):
            fail(f"{where}: panel {title!r} has no integer id")
        elif pid in ids:
            fail(f"{where}: panel id {pid} ({title!r}) is used twice")
        ids.add(pid)
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")):
            fail(f"{where}: panel {title!r} has no complete gridPos")
            continue
        if grid["x"] < 0 or grid["w"] <= 0 or grid["x"] + grid["w"] > 24 or grid["h"] <= 0:
            fail(f"{where}: panel {title!r} gridPos {grid} is outside the 24-column grid")
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                if (x, y) in occupied:
                    fail(f"{where}: panels {occupied[(x, y)]!r} and {title!r} overlap")
                    break
                occupied[(x, y)] = title
            else:
                continue
            break
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"{where}: panel {title!r} does not use the ${{datasource}} variable")
        targets = panel.get("targets", [])
        if not targets:
            fail(f"{where}: panel {title!r} has no targets")
        refs = set()
        for target in targets:
            if not str(target.get("expr", "")).strip():
                fail(f"{where}: panel {title!r} has a target with no expr")
            if target.get("refId") in refs or not target.get("refId"):
                fail(f"{where}: panel {title!r} has a missing or repeated refId")
            refs.add(target.get("refId"))
            if target.get("datasource", {}).get("uid") not in (None, "${datasource}"):
                fail(f"{where}: panel {title!r} target {target.get('refId')} names another datasource")
        if not panel.get("title"):
            fail(f"{where}: panel {pid} has no title")


def variable_query(var):
    query = var.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    return query or var.get("definition")


# --------------------------------------------------------------------------
# The live stack
# --------------------------------------------------------------------------

def start_stack(bin_dir, work):
    state = os.path.join(work, "stack")
    proc = spawn([os.path.join(bin_dir, "sluice"), "up", "--bin-dir", bin_dir, "--state-dir", state,
                  "--runs-dir", os.path.join(work, "runs"), "--rollout-workers", "1"],
                 os.path.join(work, "sluice-up.log"))
    endpoints_path = os.path.join(state, "endpoints.json")

    def ready():
        with open(endpoints_path) as f:
            endpoints = json.load(f)
        services = endpoints.get("services", {})
        kinds = {re.sub(r"-\d+$", "", name) for name in services}
        if kinds == set(JOBS) and all(s.get("state") == "running" for s in services.values()):
            return endpoints
        return None

    endpoints = wait_for("sluice up's endpoints.json", ready, 120, [proc])
    return proc, endpoints


def write_file_sd(sd_dir, endpoints):
    """One file_sd file per job from endpoints.json; Prometheus re-reads them on change."""
    groups = {job: [] for job in JOBS.values()}
    for name, service in endpoints["services"].items():
        job = JOBS[re.sub(r"-\d+$", "", name)]
        url = urllib.parse.urlparse(service["metrics"])
        if url.path != "/metrics":
            raise RuntimeError(f"{name}: metrics at {url.path}, not /metrics")
        groups[job].append(url.netloc)
    paths = {}
    for job, targets in sorted(groups.items()):
        path = paths[job] = os.path.join(sd_dir, job + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump([{"targets": targets, "labels": {}}], f)
        os.replace(path + ".tmp", path)
    return paths


def write_prometheus_config(work, endpoints, rules_dir):
    sd_dir = os.path.join(work, "file_sd")
    os.makedirs(sd_dir)
    scrape_configs = [{"job_name": job, "file_sd_configs": [{"files": [path]}]}
                      for job, path in sorted(write_file_sd(sd_dir, endpoints).items())]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [os.path.join(os.path.abspath(rules_dir), "*.yml")],
        "scrape_configs": scrape_configs,
    }
    path = os.path.join(work, "prometheus.yml")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)  # JSON is YAML
    result = subprocess.run(["promtool", "check", "config", path], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError("generated config is invalid:\n" + result.stdout + result.stderr)
    return path


def start_prometheus(work, config):
    port = free_port()
    proc = spawn(["prometheus", f"--config.file={config}",
                  f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
                  f"--web.listen-address=127.0.0.1:{port}",
                  "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                 os.path.join(work, "prometheus.log"))
    base = f"http://127.0.0.1:{port}"

    def ready():
        with urllib.request.urlopen(base + "/-/ready", timeout=2) as response:
            return response.status == 200

    wait_for("Prometheus to be ready", ready, 60, [proc])
    return proc, base


class Prom:
    def __init__(self, base):
        self.base = base

    def query(self, expr):
        """(result list, None) or (None, error text)."""
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            try:
                body = json.load(error)
            except ValueError:
                return None, f"HTTP {error.code}"
        if body.get("status") != "success":
            return None, f"{body.get('errorType')}: {body.get('error')}"
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [data["result"]], None
        return data["result"], None

    def label_values(self, label, match):
        params = {"start": str(time.time() - 3600), "end": str(time.time())}
        if match:
            params["match[]"] = match
        url = f"{self.base}/api/v1/label/{urllib.parse.quote(label)}/values?" + urllib.parse.urlencode(params)
        try:
            body = http_get_json(url)
        except urllib.error.HTTPError as error:
            return None, f"HTTP {error.code}: {error.read().decode(errors='replace')}"
        if body.get("status") != "success":
            return None, str(body.get("error"))
        return body["data"], None

    def get(self, path):
        return http_get_json(self.base + path)


def restart_reward_server(prom, work, endpoints, submit):
    """Kills the reward server hard once the run trains; `sluice up` starts it
    again (same gRPC port, new metrics port), and the file_sd targets are
    rewritten from endpoints.json as a user's would be. The run must survive,
    and the restart panels and alerts then have real data."""
    # The controller notes each service's incarnation while the run trains
    # (its periodic buffer-stats refresh); a restart before it noted the first
    # one would not count as a restart.
    def training():
        result, _ = prom.query('max(sluice_run_step) >= 100 and on() '
                               'sum(sluice_controller_runs{state="training"}) > 0')
        return bool(result)

    wait_for("the run to train 100 steps", training, 120, [submit])
    time.sleep(2)
    old = endpoints["services"]["reward_server"]
    os.kill(old["pid"], signal.SIGKILL)
    state = os.path.join(work, "stack", "endpoints.json")

    def restarted():
        with open(state) as f:
            now = json.load(f)
        service = now["services"].get("reward_server", {})
        if service.get("pid") not in (None, old["pid"]) and service.get("state") == "running":
            return now
        return None

    now = wait_for("sluice up to restart the reward server", restarted, 60)
    write_file_sd(os.path.join(work, "file_sd"), now)
    target = urllib.parse.urlparse(now["services"]["reward_server"]["metrics"]).netloc

    def scraped():
        result, _ = prom.query(f'up{{job="sluice-reward-server", instance="{target}"}} == 1')
        return bool(result)

    wait_for("Prometheus to scrape the restarted reward server", scraped, 30)
    note(f"killed the reward server (pid {old['pid']}) mid-run; restarted as pid "
         f"{now['services']['reward_server']['pid']} at {now['services']['reward_server']['metrics']}")
    endpoints.update(now)


# Code items for the reward server: one passes, one loops until the sandbox
# kills it at its deadline (timeout), one allocates past the sandbox's memory
# limit (resource_exhausted). The arithmetic run itself has no code verifier.
CODE_ITEMS = [
    {"verifier": "code", "prompt": "def add(a, b):\n", "response": "    return a + b\n",
     "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"},
    {"verifier": "code", "prompt": "def add(a, b):\n", "response": "    while True:\n        pass\n",
     "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add", "timeout_ms": 1500},
    {"verifier": "code", "prompt": "def add(a, b):\n", "response": "    x = bytearray(8 << 30)\n    return a + b\n",
     "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"},
]


def exercise_failure_paths(bin_dir, work, endpoints):
    """What a short arithmetic run never does, done on purpose so that the
    failure panels are checked against real series: code items the sandbox
    runs and kills (reward server), and a call for a run that does not
    exist (NotFound on the controller)."""
    items = os.path.join(work, "code.jsonl")
    with open(items, "w") as f:
        f.writelines(json.dumps(item) + "\n" for item in CODE_ITEMS)
    scored = subprocess.run([os.path.join(bin_dir, "sluice"), "score", "--input", items, "--output", "-",
                             "--target", endpoints["services"]["reward_server"]["grpc"], "--quiet"],
                            capture_output=True, text=True, timeout=120, preexec_fn=_die_with_parent)
    if scored.returncode != 0:
        raise RuntimeError(f"sluice score exited {scored.returncode}: {scored.stderr.strip()}")
    kinds = [json.loads(line)["error_kind"] for line in scored.stdout.splitlines() if line.strip()]
    if kinds != ["none", "timeout", "resource_exhausted"]:
        fail(f"code items scored {kinds}, expected none, timeout, resource_exhausted "
             "(is the sandbox working? docs/reward-server.md, Requirements)")
    missing = subprocess.run([os.path.join(bin_dir, "sluice"), "runs", "get", "run-no-such-run",
                              "--target", endpoints["services"]["controller"]["grpc"]],
                             capture_output=True, text=True, timeout=60, preexec_fn=_die_with_parent)
    if missing.returncode == 0:
        fail("sluice runs get of a run that does not exist succeeded")
    note(f"scored code items on the reward server ({', '.join(kinds)}); asked the controller for a "
         "run that does not exist")


# --------------------------------------------------------------------------
# Grafana variables
# --------------------------------------------------------------------------

def substitute(expr, values):
    """Grafana's variable interpolation, for the variables these dashboards use."""
    def replace(match):
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(name)
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", replace, expr)


# --------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--dashboards", help="dashboard JSON directory (default: deploy/grafana/dashboards)")
    parser.add_argument("--rules", help="rule file directory (default: deploy/prometheus/rules)")
    parser.add_argument("--allowlist", help="default: deploy/grafana/no-data-allowlist.json")
    parser.add_argument("--static-only", action="store_true",
                        help="only promtool and the dashboards' structure: no stack, no Prometheus server")
    parser.add_argument("--no-restart", action="store_true",
                        help="do not kill and restart the reward server during the run")
    parser.add_argument("--steps", type=int, default=int(os.environ.get("SLUICE_OBS_TEST_STEPS", "2500")),
                        help="training steps of the test run")
    args = parser.parse_args()

    src = os.path.abspath(args.source_dir)
    prom_dir = os.path.join(src, "deploy", "prometheus")
    rules_dir = os.path.abspath(args.rules or os.path.join(prom_dir, "rules"))
    dashboard_dir = os.path.abspath(args.dashboards or os.path.join(src, "deploy", "grafana", "dashboards"))
    allowlist_path = args.allowlist or os.path.join(src, "deploy", "grafana", "no-data-allowlist.json")
    bin_dir = os.environ.get("SLUICE_BIN_DIR")
    if not args.static_only and (not bin_dir or not os.path.exists(os.path.join(bin_dir, "sluice"))):
        print("SLUICE_BIN_DIR must name the directory holding the sluice binaries", file=sys.stderr)
        return 2
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            print(f"{tool} not found: install Debian's prometheus package (scripts/install-deps.sh)",
                  file=sys.stderr)
            return 2

    started = time.monotonic()
    static_checks(prom_dir, rules_dir)
    dashboards = load_dashboards(dashboard_dir)
    for name, d in dashboards:
        check_dashboard_structure(name, d)
    with open(allowlist_path) as f:
        allowlist = json.load(f)
    allowed = {}
    for entry in allowlist:
        if not entry.get("why"):
            fail(f"allow-list entry {entry} says no why")
        allowed[(entry["dashboard"], entry["panel"])] = entry.get("why")
    if args.no_restart:
        allowed[("sluice-fleet", "Service restarts seen by the run")] = "--no-restart: no service restarts"
    known = {(d.get("uid"), p.get("title")) for _, d in dashboards for p in all_panels(d)}
    for key in allowed:
        if key not in known:
            fail(f"allow-list entry {key} names no panel")
    note(f"static checks done in {time.monotonic() - started:.1f}s")
    if args.static_only:
        print(f"\n{len(failures)} failure(s)" if failures else "PASS")
        return 1 if failures else 0

    work = tempfile.mkdtemp(prefix="sluice-obs-test-")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        stack, endpoints = start_stack(bin_dir, work)
        note(f"stack up in {time.monotonic() - started:.1f}s: "
             + ", ".join(f"{n} {s['metrics']}" for n, s in sorted(endpoints["services"].items())))
        config = write_prometheus_config(work, endpoints, rules_dir)
        prometheus, base = start_prometheus(work, config)
        prom = Prom(base)

        def all_up():
            result, _ = prom.query('up{job=~"sluice-.*"} == 1')
            return result is not None and {r["metric"]["job"] for r in result} == set(JOBS.values())

        wait_for("Prometheus to scrape every service", all_up, 30, [stack, prometheus])
        note(f"Prometheus {base} scrapes all 5 jobs")

        spec = os.path.join(work, "run.yaml")
        with open(spec, "w") as f:
            f.write(RUN_SPEC % (args.steps, max(1, args.steps // 2)))
        controller = endpoints["services"]["controller"]["grpc"]
        run_started = time.monotonic()
        watch_log = os.path.join(work, "submit.log")
        submit = spawn([os.path.join(bin_dir, "sluice"), "submit", spec, "--target", controller, "--watch"],
                       watch_log)
        if not args.no_restart:
            restart_reward_server(prom, work, endpoints, submit)
        try:
            submit.wait(timeout=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the run did not finish in 600 s")
        run_seconds = time.monotonic() - run_started
        output = open(watch_log, errors="replace").read()
        tail = "\n".join(output.strip().splitlines()[-4:])
        if submit.returncode != 0:
            raise RuntimeError(f"sluice submit --watch exited {submit.returncode}:\n{tail}")
        run_id = re.search(r"run (run-\S+) SUCCEEDED", output)
        if not run_id:
            raise RuntimeError("the run did not succeed:\n" + tail)
        run_id = run_id.group(1)
        note(f"run {run_id} succeeded in {run_seconds:.1f}s")
        exercise_failure_paths(bin_dir, work, endpoints)
        time.sleep(3)  # the last values scraped, and rules evaluated once more

        # Grafana's built-in and dashboard variables, as a user looking at the
        # run just finished would have them. Multi-value/All variables become
        # Grafana's allValue (a regex); $__rate_interval becomes a window of
        # several 1 s scrapes within the run.
        window = f"{max(4, min(30, int(run_seconds)))}s"
        values = {"__rate_interval": window, "__interval": "1s", "__range": "1h", "__range_s": "3600",
                  "run_id": run_id, "job": ".*", "service": ".*", "method": ".*", "instance": ".*",
                  "verifier": ".*"}

        if not args.no_restart:
            counted, _ = prom.query(f'sluice_run_recovery_restarts_total{{run_id="{run_id}", '
                                    f'service="reward_server"}} >= 1')
            if not counted:
                fail("the controller did not count the reward server's restart "
                     "(sluice_run_recovery_restarts_total)")

        up, error = prom.query('up{job=~"sluice-.*"}')
        for job in sorted(JOBS.values()):
            states = [r["value"][1] for r in (up or []) if r["metric"].get("job") == job]
            if states != ["1"]:
                fail(f"job {job}: up = {states}, expected one target up")

        panels_checked = queries = 0
        for name, d in dashboards:
            uid = d.get("uid")
            for var in d.get("templating", {}).get("list", []):
                if var.get("type") != "query":
                    continue
                query = substitute(variable_query(var), values)
                m = re.fullmatch(r"label_values\((?:(.*),\s*)?(\w+)\)", query.strip())
                if not m:
                    fail(f"{uid}: variable {var['name']}: unsupported query {query!r}")
                    continue
                found, error = prom.label_values(m.group(2), m.group(1))
                queries += 1
                if error:
                    fail(f"{uid}: variable {var['name']} ({query}): {error}")
                elif not found:
                    fail(f"{uid}: variable {var['name']} ({query}) has no values")
            for panel in all_panels(d):
                if panel.get("type") == "row":
                    continue
                title = panel.get("title")
                panels_checked += 1
                empty = []
                for target in panel.get("targets", []):
                    try:
                        expr = substitute(target["expr"], values)
                    except KeyError as missing:
                        fail(f"{uid} / {title!r} {target.get('refId')}: unknown variable ${missing.args[0]}")
                        continue
                    result, error = prom.query(expr)
                    queries += 1
                    if error:
                        fail(f"{uid} / {title!r} {target.get('refId')}: {error}\n    {expr}")
                    elif not result:
                        empty.append(f"{target.get('refId')}: {expr}")
                if empty and (uid, title) not in allowed:
                    fail(f"{uid} / {title!r}: no series for\n    " + "\n    ".join(empty))
                elif not empty and (uid, title) in allowed:
                    note(f"note: allow-listed panel {uid} / {title!r} has data in this run")

        # Rules: Prometheus loaded and evaluated them every second; each
        # expression must evaluate, every group be healthy, and no critical
        # alert condition hold on this healthy stack.
        rules = prom.get("/api/v1/rules")["data"]["groups"]
        local_rule_count = 0
        for path in glob.glob(os.path.join(rules_dir, "*.yml")):
            local_rule_count += len(re.findall(r"^\s*- (?:alert|record):", open(path).read(), re.M))
        loaded = [(g["name"], r) for g in rules for r in g["rules"]]
        if len(loaded) != local_rule_count:
            fail(f"Prometheus loaded {len(loaded)} rules, the rule files hold {local_rule_count}")
        docs = open(os.path.join(src, "docs", "observability.md")).read()
        anchors = {"docs/observability.md#" + h.strip().lower()
                   for h in re.findall(r"^### (\S+)\s*$", docs, re.M)}
        for group, rule in loaded:
            label = f"rule {group}/{rule['name']}"
            if rule["type"] == "alerting":
                # What an on-call person needs: a for:, a severity, and what to do.
                if not rule.get("duration"):
                    fail(f"{label}: no for:")
                if rule["labels"].get("severity") not in ("critical", "warning", "info"):
                    fail(f"{label}: severity {rule['labels'].get('severity')!r}")
                for key in ("summary", "description", "runbook"):
                    if not rule["annotations"].get(key):
                        fail(f"{label}: no {key} annotation")
                if rule["annotations"].get("runbook") not in anchors:
                    fail(f"{label}: runbook {rule['annotations'].get('runbook')!r} is no section "
                         "of docs/observability.md")
            if rule.get("health") != "ok":
                fail(f"{label}: health {rule.get('health')}: {rule.get('lastError')}")
            result, error = prom.query(rule["query"])
            queries += 1
            if error:
                fail(f"{label}: {error}")
            elif rule["type"] == "alerting" and rule["labels"].get("severity") == "critical" and result:
                fail(f"{label}: its condition holds on a healthy stack: {result}")

        note(f"checked {len(dashboards)} dashboards, {panels_checked} panels, {len(loaded)} rules, "
             f"{queries} queries; {len(failures)} failures; {time.monotonic() - started:.1f}s in all")
    except Exception as error:  # a setup step failed: say which, with the logs
        fail(f"{type(error).__name__}: {error}")
        for log in ("sluice-up.log", "prometheus.log"):
            path = os.path.join(work, log)
            if os.path.exists(path):
                lines = open(path, errors="replace").read().splitlines()[-20:]
                print(f"--- {log} (last lines)\n" + "\n".join(lines))
    finally:
        stop_children()
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"\n{len(failures)} failure(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
