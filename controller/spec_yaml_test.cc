#include "controller/spec_yaml.h"

#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string MessageOf(absl::string_view yaml) {
  absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml(yaml, "spec.yaml");
  EXPECT_FALSE(spec.ok());
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(SpecYamlTest, ParsesScalarsOfEveryType) {
  absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml(R"(
name: arith-grpo
seed: 18446744073709551615
model: {builtin: tiny}
task:
  arithmetic:
    max_operand: 20
    operators: ["+", "-", "*"]
  eval_split_size: 50
algorithm:
  objective: OBJECTIVE_GRPO
  group_size: 4
  max_staleness: 0
  learning_rate: 1e-5
  normalize_advantage_by_std: false
rollout:
  sampling: {temperature: 0.7, top_p: 1}
labels: {experiment: ablation-3, version: 2}
)",
                                                      "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "arith-grpo");
  EXPECT_EQ(spec->seed(), 18446744073709551615ULL);
  EXPECT_EQ(spec->model().builtin(), "tiny");
  EXPECT_EQ(spec->task().arithmetic().max_operand(), 20);
  EXPECT_THAT(spec->task().arithmetic().operators(), ::testing::ElementsAre("+", "-", "*"));
  EXPECT_EQ(spec->task().eval_split_size(), 50);
  EXPECT_EQ(spec->algorithm().objective(), v1::OBJECTIVE_GRPO);
  EXPECT_EQ(spec->algorithm().group_size(), 4);
  // Explicit 0 of an optional field is kept as set.
  EXPECT_TRUE(spec->algorithm().has_max_staleness());
  EXPECT_EQ(spec->algorithm().max_staleness(), 0);
  EXPECT_DOUBLE_EQ(spec->algorithm().learning_rate(), 1e-5);
  EXPECT_TRUE(spec->algorithm().has_normalize_advantage_by_std());
  EXPECT_FALSE(spec->algorithm().normalize_advantage_by_std());
  EXPECT_FLOAT_EQ(spec->rollout().sampling().temperature(), 0.7f);
  EXPECT_FLOAT_EQ(spec->rollout().sampling().top_p(), 1.0f);
  // A number where a string is expected stays the text it was written as.
  EXPECT_EQ(spec->labels().at("version"), "2");
  EXPECT_EQ(spec->labels().at("experiment"), "ablation-3");
}

TEST(SpecYamlTest, ShortLowerCaseEnumNames) {
  absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml(R"(
algorithm: {objective: grpo, behaviour_weight_mode: mask}
buffer: {sampler: fifo}
model: {dtype: float32, builtin: micro}
)",
                                                      "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->algorithm().objective(), v1::OBJECTIVE_GRPO);
  EXPECT_EQ(spec->algorithm().behaviour_weight_mode(), v1::BEHAVIOUR_WEIGHT_MODE_MASK);
  EXPECT_EQ(spec->buffer().sampler(), v1::SAMPLER_KIND_FIFO);
  EXPECT_EQ(spec->model().dtype(), v1::DTYPE_FLOAT32);

  spec = ParseRunSpecYaml("algorithm: {objective: decoupled_ppo}", "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->algorithm().objective(), v1::OBJECTIVE_DECOUPLED_PPO);
}

TEST(SpecYamlTest, UnknownEnumValueListsTheChoices) {
  EXPECT_EQ(MessageOf("\nalgorithm:\n  objective: grpoo\n"),
            "spec.yaml:3: algorithm.objective: unknown value \"grpoo\"; expected one of grpo, "
            "decoupled_ppo, trajectory_balance (or the full name, e.g. OBJECTIVE_GRPO)");
}

TEST(SpecYamlTest, UnknownFieldNamesTheFieldTheMessageAndTheLine) {
  const std::string message = MessageOf(R"(name: x
algorithm:
  grup_size: 8
)");
  EXPECT_EQ(message,
            "spec.yaml:3: unknown field \"grup_size\" in algorithm; did you mean \"group_size\"?");
}

TEST(SpecYamlTest, UnknownTopLevelFieldListsTheKnownOnes) {
  const std::string message = MessageOf("colour: blue\n");
  EXPECT_THAT(message, HasSubstr("spec.yaml:1: unknown field \"colour\" in the run spec; known "
                                 "fields: name, seed, model, task"));
}

TEST(SpecYamlTest, EveryProblemIsReported) {
  const std::string message = MessageOf(R"(
algorithm:
  group_size: eight
  max_staleness: 2.5
rollout:
  sampling:
    temperature: hot
)");
  EXPECT_THAT(message, HasSubstr("spec.yaml:3: algorithm.group_size: expected an integer, got "
                                 "\"eight\""));
  EXPECT_THAT(message, HasSubstr("spec.yaml:4: algorithm.max_staleness: expected an integer"));
  EXPECT_THAT(message, HasSubstr("spec.yaml:7: rollout.sampling.temperature: expected a number, "
                                 "got \"hot\""));
}

TEST(SpecYamlTest, WrongShapes) {
  EXPECT_THAT(MessageOf("algorithm: 3\n"),
              HasSubstr("algorithm: expected a mapping of AlgorithmConfig fields, got \"3\""));
  EXPECT_THAT(MessageOf("- a\n- b\n"), HasSubstr("the run spec: expected a mapping"));
  EXPECT_THAT(MessageOf("name: [a, b]\n"), HasSubstr("name: expected a string, got a list"));
  EXPECT_THAT(MessageOf("algorithm: {group_size: 99999999999}\n"),
              HasSubstr("out of range for a 32-bit integer"));
}

TEST(SpecYamlTest, BothMembersOfAOneofAreAnError) {
  EXPECT_THAT(MessageOf("model: {builtin: tiny, hf_model_dir: /m}\n"),
              HasSubstr("model: only one of builtin or hf_model_dir may be set"));
}

TEST(SpecYamlTest, SyntaxErrorsNameTheFileAndPosition) {
  EXPECT_THAT(MessageOf("algorithm: {group_size: 8\n"), HasSubstr("spec.yaml:"));
  EXPECT_THAT(MessageOf("algorithm: {group_size: 8\n"), HasSubstr("invalid YAML"));
}

// yaml-cpp refuses nesting past its depth limit with the words "bad file":
// the error says what is wrong instead.
TEST(SpecYamlTest, NestingTooDeepSaysSo) {
  const std::string deep = "labels: " + std::string(5000, '[') + std::string(5000, ']') + "\n";
  const std::string message = MessageOf(deep);
  EXPECT_THAT(message, HasSubstr("spec.yaml:1:"));
  EXPECT_THAT(message, HasSubstr("invalid YAML: nested more than"));
  EXPECT_THAT(message, Not(HasSubstr("bad file")));
}

// 100,000 labels parse whole (the conversion takes O(n log n); reading
// 40,000 labels took 2.75 s when it was quadratic).
TEST(SpecYamlTest, ManyLabelsAreReadWhole) {
  std::string yaml = "labels:\n";
  constexpr int kLabels = 100000;
  for (int i = 0; i < kLabels; ++i) yaml += "  k" + std::to_string(i) + ": v\n";
  const absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml(yaml, "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->labels_size(), kLabels);
}

// Found by the run_spec fuzz target: a string that is not UTF-8 made
// nlohmann::json throw out of ParseRunSpecYaml (terminating sluice submit).
TEST(SpecYamlTest, InvalidUtf8IsAnErrorNamingTheLineAndColumn) {
  for (const std::string& bad :
       {std::string("\xff"), std::string("\xc3("), std::string("\xed\xa0\x80"),
        std::string("\xf4\x90\x80\x80"), std::string("\xe2\x82")}) {
    absl::StatusOr<v1::RunSpec> spec =
        ParseRunSpecYaml("seed: 1\nname: ab" + bad + "c\n", "spec.yaml");
    ASSERT_FALSE(spec.ok()) << absl::CEscape(bad);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("spec.yaml:2:9: invalid UTF-8 (byte 0x"));
  }
  absl::StatusOr<v1::RunSpec> spec =
      ParseRunSpecYaml("name: \xc3\xa9t\xc3\xa9 \xf0\x9f\x99\x82\n", "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "\xc3\xa9t\xc3\xa9 \xf0\x9f\x99\x82");
}

TEST(SpecYamlTest, EmptyDocumentAndNullValuesLeaveFieldsUnset) {
  absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml("", "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec = ParseRunSpecYaml("algorithm:\n  max_staleness:\ntask: {arithmetic: {}}\n", "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->algorithm().has_max_staleness());
  EXPECT_TRUE(spec->task().has_arithmetic());
  // A message field given with no value is selected with its defaults.
  spec = ParseRunSpecYaml("task:\n  arithmetic:\n", "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->task().has_arithmetic());
}

TEST(SpecYamlTest, LoadRunSpecFileNamesThePath) {
  const std::string path = ::testing::TempDir() + "/spec_yaml_test.yaml";
  std::ofstream(path) << "algorithm:\n  grup_size: 8\n";
  absl::StatusOr<v1::RunSpec> spec = LoadRunSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path + ":2: unknown field"));

  spec = LoadRunSpecFile(path + ".missing");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path + ".missing: cannot read"));
}

}  // namespace
}  // namespace sluice::controller
