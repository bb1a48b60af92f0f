#ifndef SLUICE_REPLAY_BUFFER_PROTO_CONVERT_H_
#define SLUICE_REPLAY_BUFFER_PROTO_CONVERT_H_

// Conversions between sluice.v1 replay-buffer messages and the core's types,
// at the service edge. Pure functions; validation stays in the core (a
// negative timeout_ms becomes a negative duration the core rejects by name).

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "replay_buffer/run_table.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace sluice::replay_buffer {

void RunStatsToProto(const RunStats& stats, v1::BufferStats* proto);

AcquireRequest AcquireRequestFromProto(const v1::AcquireGenerationSlotsRequest& request);
void AcquireResultToProto(const AcquireResult& result,
                          v1::AcquireGenerationSlotsResponse* response);

ReleaseRequest ReleaseRequestFromProto(const v1::ReleaseGenerationSlotsRequest& request);

v1::InsertStatus InsertStatusToProto(InsertStatus status);
void InsertResultToProto(const InsertResult& result, v1::InsertGroupResult* proto);

// timeout_ms 0 becomes `default_timeout`.
SampleRequest SampleRequestFromProto(const v1::SampleRequest& request,
                                     absl::Duration default_timeout);
// A Sample response without copying the groups: it points at the table's
// stored groups (kept alive by `result`, which must outlive this) and lets go
// of them on destruction. Only to serialize (e.g. one synchronous Write);
// copying 64 KB per group costs more than the rest of the sample path.
class AliasedSampleResponse {
 public:
  explicit AliasedSampleResponse(const SampleResult& result);
  ~AliasedSampleResponse();
  AliasedSampleResponse(const AliasedSampleResponse&) = delete;
  AliasedSampleResponse& operator=(const AliasedSampleResponse&) = delete;
  const v1::SampleResponse& get() const { return response_; }

 private:
  v1::SampleResponse response_;
};

void TimeToProto(absl::Time time, google::protobuf::Timestamp* timestamp);

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_PROTO_CONVERT_H_
