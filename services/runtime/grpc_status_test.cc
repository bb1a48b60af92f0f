#include "services/runtime/grpc_status.h"

#include "gtest/gtest.h"

namespace sluice::runtime {
namespace {

class StatusMappingTest : public ::testing::TestWithParam<absl::StatusCode> {};

TEST_P(StatusMappingTest, CodeAndMessageSurviveTheRoundTrip) {
  const absl::Status original(GetParam(), "max_staleness must be >= 0, got -1");
  const grpc::Status wire = ToGrpcStatus(original);
  EXPECT_EQ(static_cast<int>(wire.error_code()), static_cast<int>(GetParam()));
  if (!original.ok()) {
    EXPECT_EQ(wire.error_message(), original.message());
  }
  EXPECT_EQ(FromGrpcStatus(wire), original.ok() ? absl::OkStatus() : original);
}

INSTANTIATE_TEST_SUITE_P(
    AllCanonicalCodes, StatusMappingTest,
    ::testing::Values(absl::StatusCode::kOk, absl::StatusCode::kCancelled,
                      absl::StatusCode::kUnknown, absl::StatusCode::kInvalidArgument,
                      absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kNotFound,
                      absl::StatusCode::kAlreadyExists, absl::StatusCode::kPermissionDenied,
                      absl::StatusCode::kResourceExhausted,
                      absl::StatusCode::kFailedPrecondition, absl::StatusCode::kAborted,
                      absl::StatusCode::kOutOfRange, absl::StatusCode::kUnimplemented,
                      absl::StatusCode::kInternal, absl::StatusCode::kUnavailable,
                      absl::StatusCode::kDataLoss, absl::StatusCode::kUnauthenticated));

TEST(StatusMappingTest, NonCanonicalAbslCodeBecomesUnknown) {
  const absl::Status odd(static_cast<absl::StatusCode>(42), "odd");
  EXPECT_EQ(ToGrpcStatus(odd).error_code(), grpc::StatusCode::UNKNOWN);
}

TEST(StatusMappingTest, CodeNamesMatchGrpcSpelling) {
  EXPECT_EQ(StatusCodeName(0), "OK");
  EXPECT_EQ(StatusCodeName(4), "DEADLINE_EXCEEDED");
  EXPECT_EQ(StatusCodeName(12), "UNIMPLEMENTED");
  EXPECT_EQ(StatusCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(99), "UNKNOWN_CODE");
}

}  // namespace
}  // namespace sluice::runtime
