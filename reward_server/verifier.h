#ifndef SLUICE_REWARD_SERVER_VERIFIER_H_
#define SLUICE_REWARD_SERVER_VERIFIER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sluice::reward_server {

// The reward server's core vocabulary: what a verifier is asked, what it
// answers, and the registry that names verifiers. Plain C++ types: the
// conversion to and from sluice.v1 protos lives at the service edge
// (proto_convert.h), so verifiers and the scorer are tested without gRPC.
//
// The pieces:
//
//   VerifierRegistry ── name ──> Verifier (immutable, shared, thread-safe)
//          ^                         |
//          |                 Verify(VerifyRequest) -> VerifyOutcome
//       Scorer (scorer.h): runs Verify on a worker pool under a deadline,
//       composes weighted verifiers, fills verifier_name/duration/retryable.

// What went wrong while verifying one response (sluice.v1.VerifierError).
enum class VerifierErrorKind {
  kNone,               // Ran to completion; the reward may still be 0.
  kTimeout,            // The deadline passed while the verifier ran.
  kCrash,              // The verifier (or the code under test) crashed or threw.
  kParse,              // No answer could be extracted from the response.
  kSandbox,            // The sandbox could not be set up.
  kUnknownVerifier,    // No verifier of that name on this server.
  kInvalidInput,       // The item lacks fields the verifier needs.
  kResourceExhausted,  // Memory/CPU/output limit exceeded.
  kUnavailable,        // Not run: server overloaded or shutting down.
  kInternal,           // Any other failure of the reward server.
};

// "none", "timeout", "crash", "parse", "sandbox", "unknown_verifier",
// "invalid_input", "resource_exhausted", "unavailable", "internal": the
// error_kind metrics label.
absl::string_view VerifierErrorKindName(VerifierErrorKind kind);

// True when the failure is the infrastructure's rather than the model's
// (kUnavailable, kSandbox, kInternal): the caller should retry or drop the
// sample instead of training on reward 0.
bool IsRetryable(VerifierErrorKind kind);

// One response to verify. Fields mirror sluice.v1.ScoreItem.
struct VerifyRequest {
  std::string response;                         // The model's completion text.
  std::string reference_answer;                 // For answer-checking verifiers.
  // Whether reference_answer is a full worked solution (the final answer is
  // extracted from it) rather than the bare answer (compared as a whole).
  bool reference_is_solution = false;
  std::string prompt;                           // For code: the stub the response completes.
  std::string test;                             // For code: the test source.
  std::string entry_point;                      // For code: the function under test.
  std::map<std::string, std::string> metadata;  // Verifier-specific extras.
  // When the scorer stops waiting for this item (set by the scorer). The
  // scorer enforces it whatever the verifier does; a verifier that can stop
  // early (a sandbox killing its child process) should honour it so that its
  // thread is not abandoned.
  absl::Time deadline = absl::InfiniteFuture();
};

// The value of the field `field` of `request` ("response",
// "reference_answer", "prompt", "test", "entry_point"; any other name is
// looked up in metadata). Empty when absent.
absl::string_view RequestField(const VerifyRequest& request, absl::string_view field);

// Outcome of verifying one response (sluice.v1.VerifierResult). A verifier
// fills reward, extracted_answer, error_kind, detail (and the tests_* counts
// for code); the scorer fills verifier_name, duration, retryable, and for a
// composition components and weight.
struct VerifyOutcome {
  double reward = 0.0;  // In [0, 1]; 0 whenever error_kind != kNone.
  std::string extracted_answer;
  VerifierErrorKind error_kind = VerifierErrorKind::kNone;
  std::string detail;
  std::string verifier_name;
  absl::Duration duration = absl::ZeroDuration();
  bool retryable = false;
  std::vector<VerifyOutcome> components;  // For a composition, in its order.
  double weight = 0.0;                    // Weight in the parent composition.
  int tests_passed = 0;
  int tests_total = 0;

  // An outcome with error `kind`, reward 0, `detail`, and retryable set from
  // the kind.
  static VerifyOutcome Error(VerifierErrorKind kind, std::string detail);
};

// Cuts `text` to at most `max_bytes` bytes on a UTF-8 character boundary,
// appending "..." (within the limit) when it cut. Results travel in protos
// whose strings must stay valid UTF-8, and details are capped at a few KiB.
void TruncateUtf8(std::string* text, size_t max_bytes);

// What a verifier is, for ListVerifiers and for the scorer's deadlines.
struct VerifierInfo {
  std::string name;         // "math": the name items use.
  std::string description;  // One line for humans.
  // Deadline when the item gives none; the largest deadline accepted (longer
  // ones are clamped to it).
  absl::Duration default_timeout = absl::Seconds(5);
  absl::Duration max_timeout = absl::Seconds(60);
  // RequestField names that must be non-empty; the scorer answers
  // kInvalidInput without calling Verify when one is empty.
  std::vector<std::string> required_fields;
};

// INVALID_ARGUMENT naming the field unless default_timeout > 0 and
// max_timeout >= default_timeout: the check every verifier's options share.
absl::Status ValidateVerifierTimeouts(absl::Duration default_timeout,
                                      absl::Duration max_timeout);

// A way of turning a response into a reward. Implementations are immutable
// after construction and Verify is called concurrently from several threads,
// so it must be thread-safe. Verify should not block for long: the scorer
// abandons a call that overruns its deadline (its thread keeps running until
// Verify returns, holding a reference to the verifier and the request).
class Verifier {
 public:
  explicit Verifier(VerifierInfo info) : info_(std::move(info)) {}
  virtual ~Verifier() = default;
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  const VerifierInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }
  const std::string& description() const { return info_.description; }
  absl::Duration default_timeout() const { return info_.default_timeout; }
  absl::Duration max_timeout() const { return info_.max_timeout; }
  const std::vector<std::string>& required_fields() const { return info_.required_fields; }

  // Verifies one response. Never throws on bad input (a throw is reported
  // as kCrash by the scorer); a malformed response is an outcome (kParse),
  // not an exception.
  virtual VerifyOutcome Verify(const VerifyRequest& request) const = 0;

 private:
  const VerifierInfo info_;
};

// Verifiers by name. Filled once at start-up, then only read: the const
// methods are thread-safe; Register is not (call it before sharing).
class VerifierRegistry {
 public:
  VerifierRegistry() = default;
  VerifierRegistry(VerifierRegistry&&) = default;
  VerifierRegistry& operator=(VerifierRegistry&&) = default;

  // Errors: INVALID_ARGUMENT for a null verifier or an empty name,
  // ALREADY_EXISTS when the name is taken.
  absl::Status Register(std::shared_ptr<const Verifier> verifier);

  // The verifier named `name`, or null. O(log n).
  std::shared_ptr<const Verifier> Find(absl::string_view name) const;

  // All verifiers, sorted by name.
  std::vector<std::shared_ptr<const Verifier>> List() const;

  // Runs the named verifier on `request` in the calling thread, with no
  // deadline; an unknown name gives a kUnknownVerifier outcome. For tools
  // and tests: the service goes through the Scorer.
  VerifyOutcome Verify(absl::string_view name, const VerifyRequest& request) const;

 private:
  std::map<std::string, std::shared_ptr<const Verifier>, std::less<>> verifiers_;
};

// The outcome for an item naming a verifier the registry lacks.
VerifyOutcome UnknownVerifierOutcome(absl::string_view name);

// A kInvalidInput outcome naming the verifier's required fields that are
// empty in `request` ("math needs reference_answer"), or nullopt when all
// are present.
std::optional<VerifyOutcome> CheckRequiredFields(const Verifier& verifier,
                                                 const VerifyRequest& request);

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_VERIFIER_H_
