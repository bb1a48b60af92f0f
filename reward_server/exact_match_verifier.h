#ifndef SLUICE_REWARD_SERVER_EXACT_MATCH_VERIFIER_H_
#define SLUICE_REWARD_SERVER_EXACT_MATCH_VERIFIER_H_

#include "reward_server/verifier.h"

namespace sluice::reward_server {

// The "exact_match" verifier, the default for generic JSONL tasks: reward 1
// when the response equals reference_answer once leading and trailing ASCII
// whitespace is removed from both, else 0. Case and inner whitespace count.
// The extracted answer is the trimmed response. Requires reference_answer.
// Thread-safe; O(length).
class ExactMatchVerifier final : public Verifier {
 public:
  ExactMatchVerifier();

  VerifyOutcome Verify(const VerifyRequest& request) const override;
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_EXACT_MATCH_VERIFIER_H_
