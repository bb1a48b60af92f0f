#include "reward_server/code_verifier.h"

#include <signal.h>
#include <sys/random.h>

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sluice::reward_server {
namespace {

using sandbox::SandboxResult;
using sandbox::Termination;

constexpr char kHarnessPath[] = "/sandbox/harness.py";
constexpr char kProgramPath[] = "/sandbox/program.py";
// Bytes of the end of stderr quoted in a detail.
constexpr size_t kDetailTailBytes = 1500;

// The harness's exit statuses; any other status comes from the program
// itself (os._exit).
constexpr int kExitPassed = 0;
constexpr int kExitFailed = 1;
constexpr int kExitSyntaxError = 2;
constexpr int kExitMemoryError = 3;
constexpr int kExitDiskFull = 4;  // EFBIG (RLIMIT_FSIZE) or ENOSPC (tmpfs).
constexpr int kExitHarnessError = 5;

// Runs as __main__: everything it needs is bound before the program runs,
// so that a program rebinding os.write or sys.exit cannot change what it
// reports. See CodeVerifier's class comment for the protocol.
constexpr char kHarness[] = R"py(
import builtins, errno, linecache, os, sys, traceback, types

def _sluice_main():
    write, exit_now, print_exception = os.write, os._exit, traceback.print_exception
    stderr = sys.stderr

    def finish(status, message=None, exception=None):
        try:
            if exception is not None:
                print_exception(type(exception), exception, exception.__traceback__, file=stderr)
            if message:
                stderr.write(message + "\n")
            sys.stdout.flush()
            stderr.flush()
        except BaseException:
            pass
        exit_now(status)

    try:
        nonce = b""
        while True:
            chunk = os.read(3, 256)
            if not chunk:
                break
            nonce += chunk
        os.close(3)
        program_path, entry_point = sys.argv[1], sys.argv[2]
        with open(program_path, "rb") as f:
            source = f.read()
    except BaseException as e:
        finish(5, "harness: cannot start", e)

    text = source.decode("utf-8", "replace")
    # Tracebacks quote the program's lines.
    linecache.cache["<program>"] = (len(text), None, text.splitlines(True), "<program>")
    try:
        code = compile(source, "<program>", "exec")
    except (SyntaxError, ValueError) as e:
        finish(2, None, e)

    # A fresh module, registered so that pickle, dataclasses and typing can
    # find it; not named __main__, so `if __name__ == "__main__":` blocks in
    # the response do not run (as in the HumanEval reference harness).
    module = types.ModuleType("__sluice_program__")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    try:
        exec(code, namespace)
        check = namespace.get("check")
        if check is not None:
            if entry_point not in namespace:
                raise NameError(f"entry point {entry_point!r} is not defined by the program")
            check(namespace[entry_point])
    except SystemExit as e:
        finish(1, f"the program exited (SystemExit({e.code!r})) before the tests finished")
    except MemoryError as e:
        finish(3, "out of memory", e)
    except OSError as e:
        if e.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT):
            finish(4, None, e)
        finish(1, None, e)
    except BaseException as e:
        finish(1, None, e)
    try:
        write(4, nonce)
    except BaseException as e:
        finish(1, "the program closed the harness's result descriptor", e)
    finish(0)

_sluice_main()
)py";

bool IsPythonIdentifier(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

absl::StatusOr<std::string> MakeNonce() {
  unsigned char bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", strerror(errno)));
    }
    filled += n;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string nonce;
  for (unsigned char b : bytes) {
    nonce.push_back(kHex[b >> 4]);
    nonce.push_back(kHex[b & 15]);
  }
  return nonce;
}

// Replaces bytes that are not valid UTF-8 with '?': details travel in
// protos, whose strings must be UTF-8, and a program may print anything.
std::string SanitizeUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    const size_t length = c < 0x80            ? 1
                          : (c >> 5) == 0x6   ? 2
                          : (c >> 4) == 0xE   ? 3
                          : (c >> 3) == 0x1E  ? 4
                                              : 0;
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    }
    if (valid) {
      out.append(text.substr(i, length).data(), length);
      i += length;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

// The end of `stderr_text` (where the traceback's verdict is), for a detail.
std::string StderrTail(const std::string& stderr_text) {
  absl::string_view tail = absl::StripTrailingAsciiWhitespace(stderr_text);
  if (tail.size() > kDetailTailBytes) {
    tail.remove_prefix(tail.size() - kDetailTailBytes);
    // Start on a line when one begins near the cut.
    const size_t newline = tail.find('\n');
    if (newline != absl::string_view::npos && newline < 200) tail.remove_prefix(newline + 1);
    return absl::StrCat("...", SanitizeUtf8(tail));
  }
  return SanitizeUtf8(tail);
}

// "SIGSEGV"; strsignal is not thread-safe for every signal.
std::string SignalName(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation == nullptr ? absl::StrCat(signal) : absl::StrCat("SIG", abbreviation);
}

std::string WithStderr(absl::string_view what, const SandboxResult& run) {
  const std::string tail = StderrTail(run.stderr_text);
  return tail.empty() ? std::string(what) : absl::StrCat(what, "\n", tail);
}

VerifyOutcome Classify(const SandboxResult& run, const std::string& nonce, absl::Duration budget,
                       const sandbox::SandboxOptions& options) {
  switch (run.termination) {
    case Termination::kDeadline:
      return VerifyOutcome::Error(
          VerifierErrorKind::kTimeout,
          WithStderr(absl::StrCat("killed at the deadline (", absl::FormatDuration(budget), ")"),
                     run));
    case Termination::kOutputLimit:
      return VerifyOutcome::Error(
          VerifierErrorKind::kResourceExhausted,
          absl::StrCat("killed: wrote more than ", options.max_output_bytes,
                       " bytes to stdout/stderr"));
    case Termination::kSignaled:
      if (run.signal == SIGXCPU) {
        return VerifyOutcome::Error(VerifierErrorKind::kTimeout,
                                    WithStderr("killed by SIGXCPU: CPU time limit", run));
      }
      if (run.signal == SIGKILL || run.signal == SIGXFSZ) {
        return VerifyOutcome::Error(
            VerifierErrorKind::kResourceExhausted,
            WithStderr(absl::StrCat("killed by ", SignalName(run.signal),
                                    " (CPU hard limit, out of memory, or file size limit)"),
                       run));
      }
      return VerifyOutcome::Error(
          VerifierErrorKind::kCrash,
          WithStderr(
              absl::StrCat("killed by signal ", run.signal, " (", SignalName(run.signal), ")"),
              run));
    case Termination::kExited:
      break;
  }
  if (!run.started) {
    // The harness reads the nonce first thing: Python never got that far.
    return VerifyOutcome::Error(
        VerifierErrorKind::kSandbox,
        WithStderr(absl::StrCat("the interpreter failed before running the harness (status ",
                                run.exit_code, ")"),
                   run));
  }
  VerifyOutcome outcome;
  outcome.tests_total = 1;
  switch (run.exit_code) {
    case kExitPassed:
      if (run.result == nonce) {
        outcome.reward = 1.0;
        outcome.tests_passed = 1;
        outcome.detail = "passed";
        return outcome;
      }
      outcome.detail = "the program exited with status 0 before the tests finished";
      return outcome;
    case kExitFailed:
      outcome.detail = WithStderr("tests failed", run);
      return outcome;
    case kExitSyntaxError:
      return VerifyOutcome::Error(VerifierErrorKind::kParse, WithStderr("syntax error", run));
    case kExitMemoryError:
      return VerifyOutcome::Error(
          VerifierErrorKind::kResourceExhausted,
          WithStderr(absl::StrCat("out of memory (limit ", options.address_space_bytes >> 20,
                                  " MiB of address space)"),
                     run));
    case kExitDiskFull:
      return VerifyOutcome::Error(VerifierErrorKind::kResourceExhausted,
                                  WithStderr("file size or temporary space limit", run));
    case kExitHarnessError:
      return VerifyOutcome::Error(VerifierErrorKind::kInternal, WithStderr("harness failed", run));
    default:
      outcome.detail = WithStderr(
          absl::StrCat("the program exited with status ", run.exit_code,
                       " before the tests finished"),
          run);
      return outcome;
  }
}

absl::StatusOr<std::shared_ptr<const sandbox::SandboxPool>> MakePool(
    const CodeVerifierOptions& options) {
  sandbox::SandboxPoolOptions pool_options;
  pool_options.slots = options.sandbox_slots;
  pool_options.python_path = options.python_path;
  pool_options.preload_modules = options.sandbox_preload_modules;
  absl::StatusOr<std::unique_ptr<sandbox::SandboxPool>> pool =
      sandbox::SandboxPool::Create(options.sandbox, pool_options);
  if (!pool.ok()) return pool.status();
  return std::shared_ptr<const sandbox::SandboxPool>(*std::move(pool));
}

absl::StatusOr<std::shared_ptr<const sandbox::SandboxRunner>> MakeRunner(
    const CodeVerifierOptions& options, std::shared_ptr<const sandbox::SandboxPool>* pool) {
  if (options.sandbox_slots > 0) {
    absl::StatusOr<std::shared_ptr<const sandbox::SandboxPool>> made = MakePool(options);
    if (!made.ok()) return made.status();
    *pool = *made;
    return std::shared_ptr<const sandbox::SandboxRunner>(*made);
  }
  absl::StatusOr<std::unique_ptr<sandbox::Sandbox>> sandbox =
      sandbox::Sandbox::Create(options.sandbox);
  if (!sandbox.ok()) return sandbox.status();
  return std::shared_ptr<const sandbox::SandboxRunner>(*std::move(sandbox));
}

sandbox::SandboxRequest MakeRequest(const CodeVerifierOptions& options, std::string program,
                                    const std::string& entry_point, std::string nonce,
                                    absl::Time deadline) {
  sandbox::SandboxRequest request;
  request.argv = {options.python_path, "-I", "-B", kHarnessPath, kProgramPath, entry_point};
  request.files = {{kHarnessPath, kHarness}, {kProgramPath, std::move(program)}};
  request.secret = std::move(nonce);
  request.deadline = deadline;
  return request;
}

}  // namespace

absl::Status CodeVerifierOptions::Validate() const {
  if (python_path.empty() || python_path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("python_path must be an absolute path, got \"", python_path, "\""));
  }
  if (sandbox_slots < 0 || sandbox_slots > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("sandbox_slots must be in [0, 1024], got ", sandbox_slots));
  }
  sandbox::SandboxPoolOptions pool;
  pool.python_path = python_path;
  pool.preload_modules = sandbox_preload_modules;
  if (absl::Status status = pool.Validate(); sandbox_slots > 0 && !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sandbox_", status.message()));
  }
  if (absl::Status status = sandbox.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sandbox.", status.message()));
  }
  return ValidateVerifierTimeouts(default_timeout, max_timeout);
}

CodeVerifier::CodeVerifier(CodeVerifierOptions options)
    : Verifier({
          .name = "code",
          .description = "Runs prompt + response + test in a sandbox (bubblewrap: no network, "
                         "private /tmp, rlimits, seccomp) and calls check(entry_point); reward "
                         "1 iff the tests ran to the end and passed (HumanEval layout).",
          .default_timeout = options.default_timeout,
          .max_timeout = options.max_timeout,
          .required_fields = {"test", "entry_point"},
      }),
      options_(std::move(options)),
      sandbox_(MakeRunner(options_, &pool_)) {}

VerifyOutcome CodeVerifier::Verify(const VerifyRequest& request) const {
  if (!sandbox_.ok()) {
    return VerifyOutcome::Error(VerifierErrorKind::kSandbox,
                                absl::StrCat("sandbox unavailable: ", sandbox_.status().message()));
  }
  if (std::optional<VerifyOutcome> missing = CheckRequiredFields(*this, request)) {
    return *std::move(missing);
  }
  if (!IsPythonIdentifier(request.entry_point)) {
    std::string shown = request.entry_point;
    TruncateUtf8(&shown, 128);
    return VerifyOutcome::Error(
        VerifierErrorKind::kInvalidInput,
        absl::StrCat("entry_point must be a Python identifier, got \"", SanitizeUtf8(shown), "\""));
  }
  const absl::Time now = absl::Now();
  absl::Time deadline = request.deadline;
  if (deadline == absl::InfiniteFuture()) deadline = now + default_timeout();
  deadline = std::min(deadline, now + max_timeout());
  // Kill a little before the scorer's deadline: killing the sandbox and
  // classifying take milliseconds, and a result that lands after the deadline
  // is dropped and its worker thread abandoned (and replaced) for nothing.
  deadline -= std::min(absl::Milliseconds(100), (deadline - now) / 10);
  std::string program =
      absl::StrCat(request.prompt, request.response, "\n", request.test, "\n");
  if (program.size() > options_.sandbox.max_file_bytes) {
    return VerifyOutcome::Error(
        VerifierErrorKind::kInvalidInput,
        absl::StrCat("program of ", program.size(), " bytes exceeds sandbox.max_file_bytes (",
                     options_.sandbox.max_file_bytes, ")"));
  }
  absl::StatusOr<std::string> nonce = MakeNonce();
  if (!nonce.ok()) {
    return VerifyOutcome::Error(VerifierErrorKind::kInternal,
                                std::string(nonce.status().message()));
  }
  absl::StatusOr<SandboxResult> run = (*sandbox_)->Run(
      MakeRequest(options_, std::move(program), request.entry_point, *nonce, deadline));
  if (!run.ok()) {
    // Every slot busy until the deadline: the server's load, not the model's
    // program nor the operator's set-up.
    const VerifierErrorKind kind = run.status().code() == absl::StatusCode::kResourceExhausted
                                       ? VerifierErrorKind::kUnavailable
                                       : VerifierErrorKind::kSandbox;
    return VerifyOutcome::Error(kind, std::string(run.status().message()));
  }
  return Classify(*run, *nonce, deadline - now, options_.sandbox);
}

std::shared_ptr<const sandbox::SandboxPool> FindSandboxPool(const VerifierRegistry& registry) {
  auto code = std::dynamic_pointer_cast<const CodeVerifier>(registry.Find("code"));
  return code != nullptr ? code->pool() : nullptr;
}

absl::Status CheckSandboxAvailable(const CodeVerifierOptions& options) {
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  CodeVerifier verifier(options);
  VerifyRequest request;
  request.response = "def add(a, b):\n    return a + b\n";
  request.test = "def check(candidate):\n    assert candidate(2, 3) == 5\n";
  request.entry_point = "add";
  request.deadline = absl::Now() + absl::Seconds(30);
  const VerifyOutcome outcome = verifier.Verify(request);
  if (outcome.error_kind == VerifierErrorKind::kNone && outcome.reward == 1.0) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "code verifier self-check failed (", VerifierErrorKindName(outcome.error_kind),
      "): ", outcome.detail));
}

}  // namespace sluice::reward_server
