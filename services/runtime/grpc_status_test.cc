#include "services/runtime/grpc_status.h"

#include <map>
#include <string>

#include "absl/strings/cord.h"
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

// ---- retry hints -------------------------------------------------------------

TEST(RetryAfterTest, RoundTripsInMilliseconds) {
  const absl::Status hinted =
      WithRetryAfter(absl::ResourceExhaustedError("full"), absl::Milliseconds(150));
  EXPECT_EQ(hinted.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(hinted.message(), "full");
  EXPECT_EQ(RetryAfter(hinted), absl::Milliseconds(150));
  EXPECT_EQ(RetryAfter(WithRetryAfter(absl::UnavailableError("x"), absl::Microseconds(2500))),
            absl::Milliseconds(2));
  EXPECT_EQ(RetryAfter(WithRetryAfter(absl::UnavailableError("x"), absl::ZeroDuration())),
            absl::ZeroDuration());
  EXPECT_EQ(RetryAfter(WithoutRetryAfter(hinted)), std::nullopt);
  EXPECT_EQ(RetryAfter(absl::ResourceExhaustedError("quota")), std::nullopt);
}

TEST(RetryAfterTest, OutOfRangeHintsAreClampedAndOkStatusCarriesNone) {
  EXPECT_EQ(RetryAfter(WithRetryAfter(absl::UnavailableError("x"), absl::Hours(5))),
            kMaxRetryAfter);
  EXPECT_EQ(RetryAfter(WithRetryAfter(absl::UnavailableError("x"), -absl::Seconds(1))),
            absl::ZeroDuration());
  EXPECT_EQ(RetryAfter(WithRetryAfter(absl::UnavailableError("x"), absl::InfiniteDuration())),
            kMaxRetryAfter);
  const absl::Status ok = WithRetryAfter(absl::OkStatus(), absl::Seconds(1));
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(RetryAfter(ok), std::nullopt);
}

class MalformedHintTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MalformedHintTest, IsNoHint) {
  absl::Status status = absl::ResourceExhaustedError("full");
  status.SetPayload("type.sluice.dev/sluice.RetryAfter", absl::Cord(GetParam()));
  EXPECT_EQ(RetryAfter(status), std::nullopt);
  EXPECT_EQ(ParseRetryPushback(GetParam()), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Values, MalformedHintTest,
                         ::testing::Values("", "-5", "+5", "abc", "1.5", " 10", "10 ", "10ms",
                                           "0x10", std::string("1\0", 2)));

TEST(RetryAfterTest, AHugePushbackIsCappedWithoutOverflow) {
  EXPECT_EQ(ParseRetryPushback("60000"), absl::Seconds(60));
  EXPECT_EQ(ParseRetryPushback("60001"), kMaxRetryAfter);
  EXPECT_EQ(ParseRetryPushback("99999999999999999999999999"), kMaxRetryAfter);
  EXPECT_EQ(ParseRetryPushback("0150"), absl::Milliseconds(150));
}

TEST(RetryAfterTest, FromGrpcStatusReadsThePushbackOfAFailedCall) {
  const std::string key(kRetryPushbackMetadataKey);
  std::multimap<grpc::string_ref, grpc::string_ref> trailing;
  trailing.emplace("other-key", "7");
  trailing.emplace(key, "150");
  const grpc::Status refused(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             "sandbox pool full; retry after 150 ms");
  const absl::Status status = FromGrpcStatus(refused, trailing);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "sandbox pool full; retry after 150 ms");
  EXPECT_EQ(RetryAfter(status), absl::Milliseconds(150));

  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, trailing).ok());
  EXPECT_EQ(RetryAfter(FromGrpcStatus(refused, {})), std::nullopt);
  std::multimap<grpc::string_ref, grpc::string_ref> malformed;
  malformed.emplace(key, "-1");
  EXPECT_EQ(FromGrpcStatus(refused, malformed), FromGrpcStatus(refused));
}

}  // namespace
}  // namespace sluice::runtime
