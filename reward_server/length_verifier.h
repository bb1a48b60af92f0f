#ifndef SLUICE_REWARD_SERVER_LENGTH_VERIFIER_H_
#define SLUICE_REWARD_SERVER_LENGTH_VERIFIER_H_

#include "reward_server/verifier.h"

namespace sluice::reward_server {

// The "length" verifier: a length penalty as a reward in [0, 1], composed
// with a correctness verifier to discourage overlong completions. It is
// DAPO's soft overlong punishment moved into [0, 1]: with L the response's
// length, M = max_length and C = length_cache,
//
//   reward = 1                  when L <= M - C
//          = (M - L) / C        when M - C < L <= M   (linear ramp to 0)
//          = 0                  when L > M
//
// (C = 0: a hard cut at M.) Parameters come from the request's metadata,
// normally from the run's composition params:
//   max_length    required, an integer > 0.
//   length_cache  optional, an integer in [0, max_length]; default 0.
//   length_unit   "tokens": metadata "completion_tokens" (the rollout worker
//                 sets it to the completion's token count; missing is
//                 kInvalidInput); "chars": Unicode code points of the
//                 response; "auto" (default): tokens when completion_tokens
//                 is present, else chars.
// A malformed parameter is kInvalidInput naming it. The extracted answer is
// the measured length, e.g. "312 tokens".
class LengthVerifier final : public Verifier {
 public:
  LengthVerifier();

  VerifyOutcome Verify(const VerifyRequest& request) const override;
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_LENGTH_VERIFIER_H_
