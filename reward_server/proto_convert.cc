#include "reward_server/proto_convert.h"

namespace sluice::reward_server {

ScoreItem ScoreItemFromProto(const v1::ScoreItem& proto) {
  ScoreItem item;
  item.item_id = proto.item_id();
  item.verifier = proto.verifier();
  item.request.response = proto.response();
  item.request.reference_answer = proto.reference_answer();
  item.request.reference_is_solution = proto.reference_is_solution();
  item.request.prompt = proto.prompt();
  item.request.test = proto.test();
  item.request.entry_point = proto.entry_point();
  item.request.metadata.insert(proto.metadata().begin(), proto.metadata().end());
  item.timeout = absl::Milliseconds(proto.timeout_ms());
  return item;
}

std::vector<WeightedVerifier> CompositionFromProto(
    const google::protobuf::RepeatedPtrField<v1::WeightedVerifier>& proto) {
  std::vector<WeightedVerifier> composition;
  composition.reserve(proto.size());
  for (const v1::WeightedVerifier& entry : proto) {
    composition.push_back(
        {entry.name(), entry.weight(), {entry.params().begin(), entry.params().end()}});
  }
  return composition;
}

v1::VerifierError VerifierErrorToProto(VerifierErrorKind kind) {
  switch (kind) {
    case VerifierErrorKind::kNone:
      return v1::VERIFIER_ERROR_NONE;
    case VerifierErrorKind::kTimeout:
      return v1::VERIFIER_ERROR_TIMEOUT;
    case VerifierErrorKind::kCrash:
      return v1::VERIFIER_ERROR_CRASH;
    case VerifierErrorKind::kParse:
      return v1::VERIFIER_ERROR_PARSE;
    case VerifierErrorKind::kSandbox:
      return v1::VERIFIER_ERROR_SANDBOX;
    case VerifierErrorKind::kUnknownVerifier:
      return v1::VERIFIER_ERROR_UNKNOWN_VERIFIER;
    case VerifierErrorKind::kInvalidInput:
      return v1::VERIFIER_ERROR_INVALID_INPUT;
    case VerifierErrorKind::kResourceExhausted:
      return v1::VERIFIER_ERROR_RESOURCE_EXHAUSTED;
    case VerifierErrorKind::kUnavailable:
      return v1::VERIFIER_ERROR_UNAVAILABLE;
    case VerifierErrorKind::kInternal:
      return v1::VERIFIER_ERROR_INTERNAL;
  }
  return v1::VERIFIER_ERROR_INTERNAL;
}

void VerifyOutcomeToProto(const VerifyOutcome& outcome, v1::VerifierResult* proto) {
  proto->set_reward(outcome.reward);
  proto->set_extracted_answer(outcome.extracted_answer);
  proto->set_error_kind(VerifierErrorToProto(outcome.error_kind));
  proto->set_detail(outcome.detail);
  proto->set_verifier_name(outcome.verifier_name);
  proto->set_duration_ms(absl::ToInt64Milliseconds(outcome.duration));
  proto->set_retryable(outcome.retryable);
  for (const VerifyOutcome& component : outcome.components) {
    VerifyOutcomeToProto(component, proto->add_components());
  }
  proto->set_weight(outcome.weight);
  proto->set_tests_passed(outcome.tests_passed);
  proto->set_tests_total(outcome.tests_total);
}

void BatchScoresToProto(const BatchScores& scores, v1::ScoreBatchResponse* proto) {
  proto->mutable_results()->Reserve(static_cast<int>(scores.items.size()));
  for (const ItemScore& item : scores.items) {
    v1::ScoreResult* result = proto->add_results();
    result->set_item_id(item.item_id);
    VerifyOutcomeToProto(item.outcome, result->mutable_result());
  }
  proto->set_duration_ms(absl::ToInt64Milliseconds(scores.duration));
}

void VerifierInfoToProto(const VerifierInfo& info, v1::VerifierInfo* proto) {
  proto->set_name(info.name);
  proto->set_description(info.description);
  proto->set_default_timeout_ms(absl::ToInt64Milliseconds(info.default_timeout));
  proto->set_max_timeout_ms(absl::ToInt64Milliseconds(info.max_timeout));
  for (const std::string& field : info.required_fields) proto->add_required_fields(field);
}

}  // namespace sluice::reward_server
