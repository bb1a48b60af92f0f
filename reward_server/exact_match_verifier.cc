#include "reward_server/exact_match_verifier.h"

#include "absl/strings/ascii.h"

namespace sluice::reward_server {

ExactMatchVerifier::ExactMatchVerifier()
    : Verifier({
          .name = "exact_match",
          .description = "Reward 1 when the response equals reference_answer after trimming "
                         "surrounding whitespace, else 0.",
          .default_timeout = absl::Milliseconds(1000),
          .max_timeout = absl::Seconds(60),
          .required_fields = {"reference_answer"},
      }) {}

VerifyOutcome ExactMatchVerifier::Verify(const VerifyRequest& request) const {
  const absl::string_view response = absl::StripAsciiWhitespace(request.response);
  const absl::string_view reference = absl::StripAsciiWhitespace(request.reference_answer);
  VerifyOutcome outcome;
  outcome.extracted_answer = std::string(response);
  outcome.reward = response == reference ? 1.0 : 0.0;
  outcome.detail = response == reference ? "match" : "no match";
  return outcome;
}

}  // namespace sluice::reward_server
