#ifndef SLUICE_REWARD_SERVER_FORMAT_VERIFIER_H_
#define SLUICE_REWARD_SERVER_FORMAT_VERIFIER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "reward_server/verifier.h"

namespace re2 {
class RE2;
}

namespace sluice::reward_server {

// The "format" verifier: reward 1 when the response has the shape a run asks
// for, else 0. Usually a small weight beside "math" or "code" in a run's
// composition (reward.verifiers: [{name: math, weight: 1}, {name: format,
// weight: 0.1, params: {format: think_answer}}]).
//
// What is checked comes from the request's metadata (a run sets it through
// the composition entry's params; an item's own metadata wins):
//   format_regex       an RE2 pattern that must match somewhere in the
//                      response (anywhere: anchor it with ^...$ and (?s) to
//                      constrain the whole text). RE2 runs in time linear in
//                      the response, so no pattern can hang the server. An
//                      invalid pattern is kInvalidInput naming RE2's error.
//   format_full_match  "true": the pattern must match the whole response.
//   format             a preset, used when format_regex is absent:
//     "answer_marker" (default)  the final answer is given with an explicit
//                      marker ExtractAnswer understands (\boxed{}, "####",
//                      "the answer is", "Answer:"), not left as the last
//                      number of the text;
//     "boxed"          exactly one non-empty outermost \boxed{...} (or \fbox),
//                      found by the math verifier's own scan;
//     "think_answer"   "<think>" ... "</think>" exactly once, at the start
//                      (after whitespace), followed by a non-empty answer.
// The extracted answer is the matched text (the first match for a regex).
// Patterns are compiled once and cached (up to kMaxCachedPatterns).
class FormatVerifier final : public Verifier {
 public:
  static constexpr size_t kMaxPatternBytes = 4096;
  static constexpr size_t kMaxCachedPatterns = 256;

  FormatVerifier();
  ~FormatVerifier() override;

  VerifyOutcome Verify(const VerifyRequest& request) const override;

 private:
  // The compiled `pattern`, or INVALID_ARGUMENT with RE2's reason.
  absl::StatusOr<std::shared_ptr<const re2::RE2>> Compile(const std::string& pattern) const;

  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const re2::RE2>> cache_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_FORMAT_VERIFIER_H_
