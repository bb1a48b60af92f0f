#ifndef SLUICE_REWARD_SERVER_PROTO_CONVERT_H_
#define SLUICE_REWARD_SERVER_PROTO_CONVERT_H_

#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "reward_server/scorer.h"
#include "reward_server/verifier.h"
#include "sluice/v1/reward_server.pb.h"

namespace sluice::reward_server {

// The one place where the reward server's core types meet sluice.v1 protos.
// Pure functions; no validation (the service validates before converting).

// timeout_ms 0 stays 0 (the verifier's default); negative stays negative
// (the scorer answers kInvalidInput).
ScoreItem ScoreItemFromProto(const v1::ScoreItem& proto);

std::vector<WeightedVerifier> CompositionFromProto(
    const google::protobuf::RepeatedPtrField<v1::WeightedVerifier>& proto);

v1::VerifierError VerifierErrorToProto(VerifierErrorKind kind);

void VerifyOutcomeToProto(const VerifyOutcome& outcome, v1::VerifierResult* proto);

void BatchScoresToProto(const BatchScores& scores, v1::ScoreBatchResponse* proto);

void VerifierInfoToProto(const VerifierInfo& info, v1::VerifierInfo* proto);

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_PROTO_CONVERT_H_
