#ifndef SLUICE_REWARD_SERVER_CODE_VERIFIER_H_
#define SLUICE_REWARD_SERVER_CODE_VERIFIER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "reward_server/sandbox/sandbox.h"
#include "reward_server/sandbox/sandbox_pool.h"
#include "reward_server/verifier.h"

namespace sluice::reward_server {

struct CodeVerifierOptions {
  // The interpreter, run inside the sandbox: it must lie under one of
  // sandbox.read_only_paths.
  std::string python_path = "/usr/bin/python3";
  // bwrap path, rlimits (address space 1 GiB, CPU, processes, file size,
  // open files), tmpfs size, output kept, uid range when root: see
  // sandbox::SandboxOptions.
  sandbox::SandboxOptions sandbox;
  // Programs run at once in prepared sandboxes with a warm interpreter
  // (sandbox/sandbox_pool.h): the reward server sets it to its --workers.
  // 0 = a fresh sandbox (bwrap and python3 from scratch) per program.
  int sandbox_slots = 2;
  // Modules each slot's warm interpreter imports once (a program that
  // imports them finds them loaded): see SandboxPoolOptions::preload_modules
  // for the default. Add what the tasks import and the interpreter has
  // (numpy costs a fresh python3 ~100 ms).
  std::vector<std::string> sandbox_preload_modules = sandbox::SandboxPoolOptions().preload_modules;
  absl::Duration default_timeout = absl::Seconds(10);
  absl::Duration max_timeout = absl::Seconds(60);

  // INVALID_ARGUMENT naming the field ("sandbox.max_processes must be ...",
  // "python_path must be an absolute path ..."): timeouts > 0 and
  // default <= max, and the sandbox's own checks.
  absl::Status Validate() const;
};

// The "code" verifier: runs a Python program in the HumanEval layout
//
//   prompt + response + "\n" + test + "\n"      then   check(<entry_point>)
//
// in the sandbox (sandbox/sandbox.h) and rewards 1 iff the tests ran to
// their end and passed. Required fields: test, entry_point (a Python
// identifier); the prompt may be empty (the response then holds the whole
// function). When the test defines no check(), the test's top-level asserts
// are the tests (MBPP style) and running to the end is passing.
//
// Running to the end is proven, not assumed from the exit status: a small
// harness (the program's __main__) reads a random per-run nonce from an
// inherited pipe, closes it, exec()s the program in a fresh module, calls
// check(candidate), and only then writes the nonce to a result pipe and
// exits with os._exit(0). A program that exits before or during the tests
// (sys.exit(0), quit(), os._exit(0), an exception swallowed by exiting)
// never writes the nonce and gets 0.
//
// Outcomes:
//   pass                            kNone, reward 1, tests 1/1
//   assertion or exception          kNone, reward 0, tests 0/1; detail = the
//                                   end of the traceback
//   early exit (any status)         kNone, reward 0; detail says so
//   SyntaxError/IndentationError    kParse, reward 0: no program could be
//                                   parsed from the response (as math's
//                                   kParse when no answer is found), so the
//                                   syntax-error rate has its own metric
//   wall deadline, SIGXCPU          kTimeout
//   MemoryError, file size or tmpfs full, output beyond
//   sandbox.max_output_bytes, SIGKILL not ours (CPU hard limit, OOM)
//                                   kResourceExhausted
//   other signals (SIGSEGV, ...)    kCrash
//   sandbox cannot be set up        kSandbox (retryable: the operator's
//                                   fault); detail says what to change
//
// Threat model (besides the sandbox's, see sandbox.h): the nonce lives in
// the harness's memory in the same interpreter as the program, so a program
// that goes looking for it (frame or gc introspection, reading
// /proc/self/mem) can forge a pass; so can one that monkeypatches builtins
// the tests rely on. That is reward hacking by a deliberately adversarial
// program, not an escape; it is not defended. Exiting early, the common
// accident (and the cheap hack), is.
//
// Thread-safe; each Verify runs one program and blocks until it and every
// process it started are gone (at most until shortly after
// request.deadline). With a pool, Verify waits for a free slot until the
// deadline; when none comes free the item fails with kUnavailable
// (retryable: the server was too busy, not the model's fault).
class CodeVerifier final : public Verifier {
 public:
  // `options` must be valid (Validate()). A sandbox that cannot be built
  // (seccomp failure) makes every Verify answer kSandbox.
  explicit CodeVerifier(CodeVerifierOptions options = {});

  VerifyOutcome Verify(const VerifyRequest& request) const override;

  const CodeVerifierOptions& options() const { return options_; }

  // The pool of prepared sandboxes (for its metrics and admission), or null
  // when sandbox_slots is 0 or the sandbox could not be built.
  std::shared_ptr<const sandbox::SandboxPool> pool() const { return pool_; }

 private:
  const CodeVerifierOptions options_;
  std::shared_ptr<const sandbox::SandboxPool> pool_;
  absl::StatusOr<std::shared_ptr<const sandbox::SandboxRunner>> sandbox_;
};

// The sandbox pool of `registry`'s "code" verifier, or null (no code
// verifier, or one without a pool).
std::shared_ptr<const sandbox::SandboxPool> FindSandboxPool(const VerifierRegistry& registry);

// Runs a trivial passing program through the code verifier's whole path
// (bwrap, namespaces, seccomp, python, harness). OK, or FAILED_PRECONDITION
// with what bwrap said and what the operator should change (e.g. "...
// setting up uid map: Permission denied -- unprivileged user namespaces
// seem to be disabled ... sysctl -w kernel.unprivileged_userns_clone=1").
// For the server's start-up; takes tens of milliseconds.
absl::Status CheckSandboxAvailable(const CodeVerifierOptions& options);

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_CODE_VERIFIER_H_
