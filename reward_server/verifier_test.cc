#include "reward_server/verifier.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/exact_match_verifier.h"

namespace sluice::reward_server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NamedVerifier final : public Verifier {
 public:
  explicit NamedVerifier(std::string name, std::vector<std::string> required = {})
      : Verifier({.name = std::move(name), .required_fields = std::move(required)}) {}
  VerifyOutcome Verify(const VerifyRequest& request) const override {
    VerifyOutcome outcome;
    outcome.reward = 1.0;
    return outcome;
  }
};

TEST(VerifierRegistryTest, FindsListsSortedAndRejectsDuplicates) {
  VerifierRegistry registry;
  ASSERT_TRUE(registry.Register(std::make_shared<NamedVerifier>("zeta")).ok());
  ASSERT_TRUE(registry.Register(std::make_shared<NamedVerifier>("alpha")).ok());
  EXPECT_EQ(registry.Register(std::make_shared<NamedVerifier>("alpha")).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.Register(nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register(std::make_shared<NamedVerifier>("")).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_NE(registry.Find("zeta"), nullptr);
  EXPECT_EQ(registry.Find("zeta")->name(), "zeta");
  EXPECT_EQ(registry.Find("nope"), nullptr);
  std::vector<std::string> names;
  for (const auto& verifier : registry.List()) names.push_back(verifier->name());
  EXPECT_THAT(names, ElementsAre("alpha", "zeta"));
}

TEST(VerifierRegistryTest, UnknownNameIsAnUnknownVerifierOutcome) {
  VerifierRegistry registry;
  VerifyOutcome outcome = registry.Verify("nope", VerifyRequest{});
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kUnknownVerifier);
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_EQ(outcome.verifier_name, "nope");
  EXPECT_THAT(outcome.detail, HasSubstr("no verifier named \"nope\""));
  EXPECT_FALSE(outcome.retryable);
}

TEST(VerifierRegistryTest, MissingRequiredFieldIsInvalidInputNamingIt) {
  VerifierRegistry registry;
  ASSERT_TRUE(registry
                  .Register(std::make_shared<NamedVerifier>(
                      "code", std::vector<std::string>{"test", "entry_point", "language"}))
                  .ok());
  VerifyRequest request;
  request.entry_point = "f";
  VerifyOutcome outcome = registry.Verify("code", request);
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_EQ(outcome.detail, "code needs test, language");
  request.test = "assert f() == 1";
  request.metadata["language"] = "python";
  outcome = registry.Verify("code", request);
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(outcome.verifier_name, "code");
}

TEST(VerifierErrorKindTest, NamesAndRetryability) {
  EXPECT_EQ(VerifierErrorKindName(VerifierErrorKind::kNone), "none");
  EXPECT_EQ(VerifierErrorKindName(VerifierErrorKind::kUnknownVerifier), "unknown_verifier");
  EXPECT_TRUE(IsRetryable(VerifierErrorKind::kUnavailable));
  EXPECT_TRUE(IsRetryable(VerifierErrorKind::kSandbox));
  EXPECT_TRUE(IsRetryable(VerifierErrorKind::kInternal));
  for (VerifierErrorKind kind :
       {VerifierErrorKind::kNone, VerifierErrorKind::kParse, VerifierErrorKind::kTimeout,
        VerifierErrorKind::kCrash, VerifierErrorKind::kUnknownVerifier,
        VerifierErrorKind::kInvalidInput, VerifierErrorKind::kResourceExhausted}) {
    EXPECT_FALSE(IsRetryable(kind)) << VerifierErrorKindName(kind);
  }
}

TEST(TruncateUtf8Test, CutsOnCharacterBoundaries) {
  std::string short_text = "abc";
  TruncateUtf8(&short_text, 3);
  EXPECT_EQ(short_text, "abc");
  std::string ascii(100, 'x');
  TruncateUtf8(&ascii, 10);
  EXPECT_EQ(ascii, "xxxxxxx...");
  // "é" is two bytes; a cut inside it backs off to before it.
  std::string accents;
  for (int i = 0; i < 10; ++i) accents += "\xC3\xA9";
  TruncateUtf8(&accents, 8);
  EXPECT_EQ(accents, "\xC3\xA9\xC3\xA9...");
  std::string tiny = "abcdef";
  TruncateUtf8(&tiny, 2);
  EXPECT_EQ(tiny, "");
}

TEST(ExactMatchVerifierTest, TrimmedStringEquality) {
  const ExactMatchVerifier verifier;
  VerifyRequest request;
  request.response = "  Paris\n";
  request.reference_answer = "Paris ";
  VerifyOutcome outcome = verifier.Verify(request);
  EXPECT_EQ(outcome.reward, 1.0);
  EXPECT_EQ(outcome.extracted_answer, "Paris");
  request.response = "paris";
  EXPECT_EQ(verifier.Verify(request).reward, 0.0);
  request.response = "Pa ris";
  EXPECT_EQ(verifier.Verify(request).reward, 0.0);
}

TEST(BuiltinVerifiersTest, RegistryOffersEveryBuiltinVerifier) {
  absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status();
  std::vector<std::string> names;
  for (const auto& verifier : registry->List()) names.push_back(verifier->name());
  EXPECT_THAT(names, ElementsAre("code", "exact_match", "format", "length", "math"));
  VerifyRequest request;
  request.response = "07+45=52";
  request.reference_answer = "52";
  EXPECT_EQ(registry->Verify("math", request).reward, 1.0);

  BuiltinVerifierOptions bad;
  bad.math.relative_tolerance = 2;
  EXPECT_EQ(MakeBuiltinVerifierRegistry(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::reward_server
