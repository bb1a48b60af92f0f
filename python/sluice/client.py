"""A small client for the Sluice controller (sluice.v1.ControllerService).

    from sluice import Client
    with Client("127.0.0.1:50051") as client:
        run = client.submit("configs/smoke.yaml")      # or YAML text, or a dict
        for run in client.watch(run.run_id):            # ends at a terminal state
            print(format_progress(run))
        print(state_name(run.state), run.summary.eval_after)

A stack secured with `sluice up --tls` (or any TLS / token setup) is reached
the way the CLI reaches it: Client(tls_ca=..., token_file=...), else
$SLUICE_TLS_CA / $SLUICE_TOKEN_FILE, else the CA and operator token that the
stack's endpoints.json names.

Every method returns the generated protobuf messages (sluice.v1.controller_pb2.Run,
...) and raises SluiceError with the controller's own message when a call fails.
The behaviour follows `sluice submit` / `sluice runs ...` (cli/run_client.cc):
the same spec reading, the same target resolution, the same watch that rides
out a controller restart.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Iterable, Iterator, List, Optional, Union

import grpc

from sluice._health import health_pb2, health_pb2_grpc
from sluice.errors import SluiceError, SpecError
from sluice.spec import SpecLike, load_run_spec
from sluice.v1 import controller_pb2, controller_pb2_grpc

__all__ = [
    "Client",
    "Security",
    "SluiceError",
    "SpecError",
    "TERMINAL_STATES",
    "controller_target",
    "format_progress",
    "resolve_security",
    "state_name",
]

RunState = controller_pb2.RunState
TERMINAL_STATES = frozenset(
    {controller_pb2.RUN_STATE_SUCCEEDED, controller_pb2.RUN_STATE_FAILED,
     controller_pb2.RUN_STATE_CANCELLED})

DEFAULT_TARGET = "127.0.0.1:50051"

# Pauses between attempts to resume a broken watch: quick at first (a
# controller restarted by its supervisor is back within seconds), then no
# more than this. As the CLI.
_FIRST_RESUME_DELAY_S = 0.25
_MAX_RESUME_DELAY_S = 2.0

# gRPC backs off up to 2 minutes between reconnects by default; a watch
# riding out a controller restart wants to see it back within a second.
_CHANNEL_OPTIONS = [
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def controller_target(target: Optional[str] = None,
                      endpoints: Optional[Union[str, "os.PathLike[str]"]] = None) -> str:
    """The controller's gRPC address, resolved as the CLI does.

    A non-empty `target` wins. Else the controller of an endpoints.json as
    `sluice up` writes it: `endpoints` if given (a file, or the state
    directory holding it), else $SLUICE_STATE_DIR's, otherwise
    .sluice/stack/endpoints.json then .sluice/endpoints.json under the
    working directory. Else 127.0.0.1:50051. An `endpoints` (or
    $SLUICE_STATE_DIR) that cannot be read raises SluiceError. The CLI's
    --target and --state-dir resolve the same way.
    """
    if target:
        return target
    endpoints = _state_dir_default(endpoints)
    if endpoints is not None:
        path = os.fspath(endpoints)
        if os.path.isdir(path):
            path = os.path.join(path, "endpoints.json")
        found = _endpoints_controller(path)
        if found is None:
            raise SluiceError("%s: no controller address in it (services.controller.grpc); "
                              "is `sluice up` running with this state directory?" % path)
        return found
    for path in (".sluice/stack/endpoints.json", ".sluice/endpoints.json"):
        found = _endpoints_controller(path)
        if found is not None:
            return found
    return DEFAULT_TARGET


def _state_dir_default(endpoints):
    """`endpoints`, else $SLUICE_STATE_DIR (as the CLI's --state-dir)."""
    if endpoints is None and os.environ.get("SLUICE_STATE_DIR"):
        return os.environ["SLUICE_STATE_DIR"]
    return endpoints


class Security:
    """How a client dials: TLS (a CA that verifies the server, optionally a
    client certificate) and/or a bearer token sent as `authorization: Bearer`.
    The same settings as the CLI's --tls-ca, --tls-cert, --tls-key,
    --token-file and --tls-server-name."""

    def __init__(self, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token_file: Optional[str] = None,
                 token: Optional[str] = None, server_name: Optional[str] = None):
        if bool(tls_cert) != bool(tls_key):
            raise SluiceError("tls_cert and tls_key go together: give both or neither")
        if tls_cert and not tls_ca:
            raise SluiceError("a client certificate (tls_cert) needs tls_ca")
        if token and token_file:
            raise SluiceError("give token or token_file, not both")
        self.tls_ca, self.tls_cert, self.tls_key = tls_ca, tls_cert, tls_key
        self.token_file, self.token, self.server_name = token_file, token, server_name

    def is_set(self) -> bool:
        return bool(self.tls_ca or self.tls_cert or self.token_file or self.token)

    def channel(self, target: str, options) -> grpc.Channel:
        options = list(options)
        if not self.tls_ca:
            return grpc.insecure_channel(target, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_bytes(self.tls_ca, "tls_ca"),
            private_key=_read_bytes(self.tls_key, "tls_key") if self.tls_key else None,
            certificate_chain=_read_bytes(self.tls_cert, "tls_cert") if self.tls_cert else None)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(target, credentials, options=options)

    def metadata(self):
        """The call metadata: the bearer token, read again on every call so
        that a rotated token file takes effect."""
        token = self.token
        if self.token_file:
            token = _read_bytes(self.token_file, "token_file").decode("utf-8").strip()
            if not token:
                raise SluiceError("token_file %s is empty" % self.token_file)
        return (("authorization", "Bearer " + token),) if token else ()


def _read_bytes(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise SluiceError("%s: cannot read %s: %s" % (what, path, error.strerror)) from None


def resolve_security(security: Optional[Security] = None,
                     endpoints: Optional[Union[str, "os.PathLike[str]"]] = None) -> Security:
    """The client's security, resolved as the CLI does: `security` when any of
    it is set; else $SLUICE_TLS_CA, $SLUICE_TLS_CERT, $SLUICE_TLS_KEY and
    $SLUICE_TOKEN_FILE; else the CA and operator token a `sluice up --tls`
    stack wrote into its endpoints.json (`endpoints`, or the default places);
    else plaintext without a token."""
    if security is not None and security.is_set():
        return security
    server_name = security.server_name if security is not None else None
    env = Security(tls_ca=os.environ.get("SLUICE_TLS_CA") or None,
                   tls_cert=os.environ.get("SLUICE_TLS_CERT") or None,
                   tls_key=os.environ.get("SLUICE_TLS_KEY") or None,
                   token_file=os.environ.get("SLUICE_TOKEN_FILE") or None,
                   server_name=server_name)
    if env.is_set():
        return env
    paths = [".sluice/stack/endpoints.json", ".sluice/endpoints.json"]
    endpoints = _state_dir_default(endpoints)
    if endpoints is not None:
        path = os.fspath(endpoints)
        paths = [os.path.join(path, "endpoints.json") if os.path.isdir(path) else path]
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError):
            continue
        found = document.get("security") if isinstance(document, dict) else None
        if isinstance(found, dict):
            return Security(tls_ca=found.get("tls_ca") or None,
                            token_file=found.get("token_file") or None, server_name=server_name)
        return Security(server_name=server_name)
    return Security(server_name=server_name)


def _endpoints_controller(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        address = document["services"]["controller"]["grpc"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return address if isinstance(address, str) and address else None


def state_name(state: int) -> str:
    """"SUCCEEDED" for RUN_STATE_SUCCEEDED."""
    name = RunState.Name(state)
    return name[len("RUN_STATE_"):] if name.startswith("RUN_STATE_") else name


def _count(value: float) -> str:
    if value >= 1e6:
        return "%.1fM" % (value / 1e6)
    if value >= 1e3:
        return "%.1fk" % (value / 1e3)
    return "%.0f" % value


def _clock(seconds: float) -> str:
    total = int(seconds)
    if total >= 3600:
        return "%d:%02d:%02d" % (total // 3600, total // 60 % 60, total % 60)
    return "%02d:%02d" % (total // 60, total % 60)


def _eta(done: int, total: int, seconds: float, prefix: str = "") -> Optional[str]:
    if done <= 0 or seconds <= 0 or total <= done:
        return None
    return "ETA " + prefix + _clock(seconds / done * (total - done))


def format_progress(run: controller_pb2.Run) -> str:
    """One line of live progress, as `sluice submit --watch` prints it: in the
    warm start its SFT steps, dev accuracy against its target and at most how
    long is left; in RL the step, version, reward, pass rate, staleness,
    tokens/s, latest eval and the time left at the rate so far."""
    p, s = run.progress, run.summary
    parts = ["%-10s" % state_name(run.state).lower().replace("_", " "),
             _clock(p.elapsed_seconds)]
    phase = p.phase
    if run.state == controller_pb2.RUN_STATE_WARM_START:
        w = run.spec.warm_start
        early = w.target_accuracy > 0
        parts.append("sft step %d/%s%d" % (p.warm_start_step, "<=" if early else "", w.sft_steps))
        dev = next((e for e in reversed(s.evals) if e.phase == "warm_start"), None)
        if dev is not None:
            parts.append("dev %.1f%% (target %.0f%%)" % (100 * dev.accuracy, 100 * w.target_accuracy)
                         if early else "dev %.1f%%" % (100 * dev.accuracy))
        elif early:
            parts.append("target dev %.0f%%" % (100 * w.target_accuracy))
        eta = _eta(p.warm_start_step, w.sft_steps, s.warm_start_seconds, "<= " if early else "")
        if eta:
            parts.append(eta)
        if phase.startswith("warm start ") and not phase.startswith("warm start eval"):
            phase = ""
    elif run.state in (controller_pb2.RUN_STATE_TRAINING,
                       controller_pb2.RUN_STATE_EVALUATING) or p.step > 0:
        parts += [
            "step %d/%d" % (p.step, p.total_steps),
            "v%d" % p.policy_version,
            "reward %.3f" % p.reward_mean,
            "pass %.1f%%" % (100 * p.pass_rate),
            "stale %.1f/%d" % (p.staleness_mean, p.staleness_max),
            "gen %s tok/s" % _count(p.generated_tokens_per_second),
            "train %s tok/s" % _count(p.trained_tokens_per_second),
        ]
        if p.HasField("latest_eval_accuracy"):
            parts.append("eval %.1f%% @%d" % (100 * p.latest_eval_accuracy, p.latest_eval_step))
        if run.state == controller_pb2.RUN_STATE_TRAINING:
            eta = _eta(p.step, p.total_steps, s.rl_seconds)
            if eta:
                parts.append(eta)
    line = "  ".join(parts)
    if phase:
        line += "  | " + phase
    return line


def _run_state(value: Union[int, str]) -> int:
    if isinstance(value, int):
        return value
    upper = value.upper().replace("-", "_").replace(" ", "_")
    for candidate in (upper, "RUN_STATE_" + upper):
        if candidate in RunState.keys():
            return RunState.Value(candidate)
    raise ValueError("unknown run state %r; expected one of %s" % (
        value, ", ".join(state_name(v).lower() for v in RunState.values() if v)))


class Client:
    """A connection to one controller. Thread-safe (gRPC channels are);
    close() it, or use it as a context manager.

    Args:
      target: the controller's "host:port" (any gRPC target). None resolves
        it as the CLI does (see controller_target()).
      timeout: deadline in seconds of each unary call (submit, get, cancel,
        list, health). watch() has none: a run takes as long as it takes.
      endpoints: an endpoints.json (or the `sluice up --state-dir`) to read
        the controller's address from when no target is given.
      resume_for: how long watch() keeps reconnecting when the controller
        does not answer (a restart, the network) before it gives up.
      tls_ca, tls_cert, tls_key, token_file, token, server_name: how to
        dial a secured controller (see Security); when none is given they
        are resolved as the CLI resolves them (see resolve_security()).
    """

    def __init__(self, target: Optional[str] = None, timeout: float = 30.0,
                 endpoints: Optional[Union[str, "os.PathLike[str]"]] = None,
                 resume_for: float = 60.0, *, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 token_file: Optional[str] = None, token: Optional[str] = None,
                 server_name: Optional[str] = None):
        self.target = controller_target(target, endpoints)
        self.timeout = timeout
        self.resume_for = resume_for
        self.security = resolve_security(
            Security(tls_ca, tls_cert, tls_key, token_file, token, server_name), endpoints)
        self._channel = self.security.channel(self.target, _CHANNEL_OPTIONS)
        self._stub = controller_pb2_grpc.ControllerServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; open watch() iterators end with an error."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return "sluice.Client(%r)" % self.target

    # -- calls -------------------------------------------------------------

    def _error(self, method: str, error: grpc.RpcError) -> SluiceError:
        code = error.code() if hasattr(error, "code") else None
        details = (error.details() if hasattr(error, "details") else None) or str(error)
        if code == grpc.StatusCode.UNAVAILABLE and "certificate verify failed" in details:
            message = ("%s: cannot reach the controller at %s: %s (the server's certificate "
                       "is not signed by tls_ca %s: wrong CA?)"
                       % (method, self.target, details, self.security.tls_ca))
        elif code == grpc.StatusCode.UNAVAILABLE and not self.security.tls_ca and (
                "Socket closed" in details or "handshake" in details.lower()):
            message = ("%s: cannot reach the controller at %s: %s (this client dials in "
                       "plaintext; if the controller uses TLS pass tls_ca and a token)"
                       % (method, self.target, details))
        elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            message = ("%s: cannot reach the controller at %s: %s (is `sluice up` running? "
                       "pass the target HOST:PORT, or endpoints= / $SLUICE_STATE_DIR its "
                       "--state-dir)" % (method, self.target, details))
        else:
            message = "%s: %s: %s" % (method, code.name if code else "ERROR", details)
        return SluiceError(message, code=code, details=details, method=method)

    def _call(self, method: str, request, timeout: Optional[float] = None):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self.security.metadata())
        except grpc.RpcError as error:
            raise self._error(method, error) from None

    def submit(self, spec: SpecLike, *, request_id: Optional[str] = None,
               validate_only: bool = False) -> controller_pb2.Run:
        """Submits a run; returns it as created (PENDING, or QUEUED behind another).

        `spec` is a path to a YAML file, YAML text, a dict with RunSpec's field
        names (enums by proto name or short lower-case name: objective: grpo),
        or a RunSpec. A spec that cannot be read raises SpecError before
        anything is sent; one the controller refuses raises SluiceError with
        code INVALID_ARGUMENT and one "field: problem" line per problem.

        request_id makes the submit idempotent: the same id again returns
        the run it created (a fresh random one when not given, so retry with
        an explicit id). validate_only resolves defaults and checks the spec
        without creating a run (the returned run has an empty run_id).
        """
        request = controller_pb2.SubmitRunRequest(
            spec=load_run_spec(spec),
            request_id=request_id or "py-%s" % uuid.uuid4().hex,
            validate_only=validate_only)
        return self._call("SubmitRun", request).run

    def get(self, run_id: str) -> controller_pb2.Run:
        """The run's current snapshot. NOT_FOUND (SluiceError) for an unknown id."""
        return self._call("GetRun", controller_pb2.GetRunRequest(run_id=run_id)).run

    def cancel(self, run_id: str, reason: str = "") -> controller_pb2.Run:
        """Cancels a run (a queued one is removed without starting). Returns it
        CANCELLED, or in the terminal state it already had."""
        return self._call("CancelRun",
                          controller_pb2.CancelRunRequest(run_id=run_id, reason=reason)).run

    def list(self, states: Optional[Iterable[Union[int, str]]] = None,
             limit: Optional[int] = None) -> List[controller_pb2.Run]:
        """Runs, newest first, following every page (at most `limit` runs).

        states filters by state: RunState values or names ("succeeded",
        "RUN_STATE_FAILED").
        """
        request = controller_pb2.ListRunsRequest(
            states=[_run_state(s) for s in states or ()],
            page_size=min(limit, 1000) if limit else 0)
        runs: List[controller_pb2.Run] = []
        while True:
            response = self._call("ListRuns", request)
            runs.extend(response.runs)
            if not response.next_page_token or (limit and len(runs) >= limit):
                return runs[:limit] if limit else runs
            request.page_token = response.next_page_token

    def health(self, service: str = "") -> str:
        """The controller's gRPC health: "SERVING", "NOT_SERVING", ...
        ("" = the server as a whole)."""
        try:
            response = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                          timeout=self.timeout)
        except grpc.RpcError as error:
            raise self._error("Health.Check", error) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def watch(self, run_id: str, interval: float = 1.0) -> Iterator[controller_pb2.Run]:
        """Yields the run as it changes (full snapshots, the first at once)
        until it reaches SUCCEEDED, FAILED or CANCELLED; the last one yielded
        is terminal.

        `interval` (seconds) is the least time between progress updates;
        state changes come at once. When the stream breaks (the controller
        restarting under its supervisor re-adopts the run; the network), the
        watch reconnects, quickly at first then every 2 s, until the
        controller has not answered for `resume_for` seconds: then, or when
        the controller no longer knows the run (NOT_FOUND), it raises
        SluiceError. Breaking out of the loop cancels the stream.
        """
        request = controller_pb2.WatchRunRequest(run_id=run_id,
                                                 min_interval_ms=max(1, int(interval * 1000)))
        unanswered_since: Optional[float] = None
        delay = _FIRST_RESUME_DELAY_S
        while True:
            stream = self._stub.WatchRun(request, metadata=self.security.metadata())
            failure: Optional[grpc.RpcError] = None
            try:
                for update in stream:
                    unanswered_since = None
                    delay = _FIRST_RESUME_DELAY_S
                    yield update.run
                    if update.run.state in TERMINAL_STATES:
                        return
            except grpc.RpcError as error:
                failure = error
            finally:
                stream.cancel()
            if failure is not None and failure.code() in (grpc.StatusCode.NOT_FOUND,
                                                          grpc.StatusCode.INVALID_ARGUMENT):
                raise self._error("WatchRun", failure)
            # The stream broke, or ended without a terminal state (the
            # controller shutting down): resume while it comes back.
            now = time.monotonic()
            if unanswered_since is None:
                unanswered_since = now
            if now - unanswered_since >= self.resume_for:
                cause = (self._error("WatchRun", failure) if failure is not None
                         else SluiceError("the stream ended early"))
                raise SluiceError("lost track of run %s: no answer for %.0f s: %s"
                                  % (run_id, now - unanswered_since, cause),
                                  code=cause.code, details=cause.details, method="WatchRun")
            time.sleep(delay)
            delay = min(2 * delay, _MAX_RESUME_DELAY_S)
            try:
                run = self.get(run_id)
            except SluiceError as error:
                if error.code == grpc.StatusCode.NOT_FOUND:
                    raise
                continue
            unanswered_since = None
            yield run
            if run.state in TERMINAL_STATES:
                return

    def wait(self, run_id: str, interval: float = 1.0) -> controller_pb2.Run:
        """Blocks until the run is terminal (as watch()) and returns it."""
        run = None
        for run in self.watch(run_id, interval):
            pass
        return run
