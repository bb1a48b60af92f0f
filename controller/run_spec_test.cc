#include "controller/run_spec.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <unistd.h>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/task/arithmetic.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "controller/spec_yaml.h"

namespace sluice::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Data(const std::string& relative) {
  return std::string(SLUICE_TESTDATA_DIR) + "/" + relative;
}

v1::RunSpec ArithmeticSpec() {
  v1::RunSpec spec;
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic();
  return spec;
}

// A Hugging Face model directory with Qwen2's real tokenizer and a small
// Qwen2-shaped config.json (no weights: the controller never reads them).
std::string QwenShapedModelDir() {
  static const std::string* dir = [] {
    // Per process: ctest runs the cases of this binary in parallel.
    auto* path = new std::string(
        absl::StrCat(::testing::TempDir(), "/qwen_shaped_model.", ::getpid()));
    std::filesystem::create_directories(*path);
    std::filesystem::copy_file(Data("tokenizers/qwen2/tokenizer.json"), *path + "/tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    std::ifstream in(Data("model_oracle/qwen2_tiny/config.json"));
    std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = "\"vocab_size\": 258";
    config.replace(config.find(from), from.size(), "\"vocab_size\": 151936");
    std::ofstream(*path + "/config.json") << config;
    return path;
  }();
  return *dir;
}

// Dataset text needs a real tokenizer: dataset specs use QwenShapedModelDir.
v1::RunSpec DatasetSpec(v1::DatasetFormat format, const std::string& relative_path) {
  v1::RunSpec spec;
  spec.mutable_model()->set_hf_model_dir(QwenShapedModelDir());
  spec.mutable_task()->mutable_dataset()->set_format(format);
  spec.mutable_task()->mutable_dataset()->set_path(Data(relative_path));
  return spec;
}

// A JSONL file in the test's temporary directory.
std::string WriteJsonl(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
  return path;
}

// The message of validating `spec` after defaults are resolved.
std::string ProblemsOf(const v1::RunSpec& spec) {
  const absl::Status status = ValidateRunSpec(ResolveDefaults(spec));
  if (status.ok()) return "";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(ResolveDefaultsTest, EmptyArithmeticSpecGetsEveryDocumentedDefault) {
  const v1::RunSpec spec = ResolveDefaults(ArithmeticSpec());
  EXPECT_EQ(spec.model().builtin(), "tiny");
  EXPECT_EQ(spec.model().max_context_tokens(), 32);
  EXPECT_EQ(spec.model().device(), "cpu");
  EXPECT_EQ(spec.model().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(spec.task().eval_split_size(), 200);
  const v1::ArithmeticTaskConfig& arithmetic = spec.task().arithmetic();
  EXPECT_EQ(arithmetic.min_operand(), 0);
  EXPECT_EQ(arithmetic.max_operand(), 99);
  EXPECT_EQ(arithmetic.num_operands(), 2);
  EXPECT_THAT(arithmetic.operators(), ::testing::ElementsAre("+", "-", "*"));
  EXPECT_EQ(arithmetic.num_prompts(), 10000);

  const v1::AlgorithmConfig& a = spec.algorithm();
  EXPECT_EQ(a.objective(), v1::OBJECTIVE_DECOUPLED_PPO);
  EXPECT_EQ(a.group_size(), 8);
  EXPECT_EQ(a.batch_size_groups(), 16);
  EXPECT_TRUE(a.has_max_staleness());
  EXPECT_EQ(a.max_staleness(), 4);
  EXPECT_DOUBLE_EQ(a.clip_eps_low(), 0.2);
  EXPECT_DOUBLE_EQ(a.clip_eps_high(), 0.2);
  EXPECT_DOUBLE_EQ(a.behaviour_weight_cap(), 5.0);
  EXPECT_EQ(a.behaviour_weight_mode(), v1::BEHAVIOUR_WEIGHT_MODE_TRUNCATE);
  EXPECT_DOUBLE_EQ(a.learning_rate(), 1e-6);
  EXPECT_TRUE(a.has_grad_clip_norm());
  EXPECT_DOUBLE_EQ(a.grad_clip_norm(), 1.0);
  EXPECT_TRUE(a.has_normalize_advantage_by_std());
  EXPECT_TRUE(a.normalize_advantage_by_std());
  EXPECT_DOUBLE_EQ(a.advantage_eps(), 1e-6);
  EXPECT_EQ(a.total_steps(), 1000);
  EXPECT_EQ(a.minibatches_per_batch(), 1);
  EXPECT_EQ(a.lr_schedule(), v1::LR_SCHEDULE_CONSTANT);
  EXPECT_EQ(a.min_lr_ratio(), 0);
  EXPECT_EQ(a.staleness_bound(), v1::STALENESS_BOUND_GROUP);
  EXPECT_EQ(a.proximal_logprobs(), v1::PROXIMAL_LOGPROBS_METHOD_RECOMPUTE);
  EXPECT_EQ(a.loss_aggregation(), v1::LOSS_AGGREGATION_TOKEN_MEAN);
  EXPECT_EQ(a.loss_normalizer_tokens(), 0);  // only resolved for CONSTANT_NORMALIZER
  EXPECT_EQ(a.dynamic_sampling(), v1::DYNAMIC_SAMPLING_DROP);
  EXPECT_FALSE(a.truncated_importance_sampling());
  EXPECT_EQ(a.behaviour_weight_floor(), 0);
  EXPECT_EQ(a.second_moment_threshold(), 0);
  EXPECT_EQ(a.kl_coef(), 0);
  EXPECT_EQ(a.entropy_coef(), 0);
  EXPECT_FALSE(a.tb_use_reference());
  // Verified in full unless a worker is trusted (the controller names those).
  EXPECT_TRUE(a.rollout_verification().has_fraction());
  EXPECT_EQ(a.rollout_verification().fraction(), 1.0);
  EXPECT_EQ(a.rollout_verification().trusted_fraction(), 1.0 / 16);
  EXPECT_THAT(a.rollout_verification().trusted_worker_ids(), ::testing::IsEmpty());

  // No warm start asked for: its defaults stay unset.
  EXPECT_EQ(spec.warm_start().sft_steps(), 0);
  EXPECT_EQ(spec.warm_start().learning_rate(), 0);
  EXPECT_EQ(spec.warm_start().batch_size(), 0);

  EXPECT_TRUE(spec.rollout().sampling().has_temperature());
  EXPECT_FLOAT_EQ(spec.rollout().sampling().temperature(), 1.0f);
  EXPECT_FLOAT_EQ(spec.rollout().sampling().top_p(), 1.0f);
  EXPECT_EQ(spec.rollout().num_workers(), 0);  // Every registered worker.
  EXPECT_EQ(spec.rollout().min_workers(), 1);
  EXPECT_EQ(spec.rollout().weight_swap_mode(), v1::WEIGHT_SWAP_MODE_KEEP_CACHE);
  ASSERT_EQ(spec.reward().verifiers_size(), 1);
  EXPECT_EQ(spec.reward().verifiers(0).name(), "math");
  EXPECT_DOUBLE_EQ(spec.reward().verifiers(0).weight(), 1.0);
  EXPECT_EQ(spec.buffer().sampler(), v1::SAMPLER_KIND_FIFO);
  EXPECT_EQ(spec.buffer().max_times_sampled(), 1);
  EXPECT_EQ(spec.eval().num_prompts(), 0);
  EXPECT_TRUE(spec.eval().sampling().has_temperature());
  EXPECT_FLOAT_EQ(spec.eval().sampling().temperature(), 0.0f);
  EXPECT_TRUE(spec.checkpoint().resume());
  EXPECT_TRUE(ValidateRunSpec(spec).ok()) << ValidateRunSpec(spec);
}

TEST(ResolveDefaultsTest, ExplicitValuesAreKept) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_model()->set_builtin("micro");
  spec.mutable_algorithm()->set_max_staleness(0);
  spec.mutable_algorithm()->set_grad_clip_norm(0);
  spec.mutable_algorithm()->set_normalize_advantage_by_std(false);
  spec.mutable_algorithm()->set_clip_eps_low(0.1);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(0);
  spec.mutable_reward()->add_verifiers()->set_name("format");
  const v1::RunSpec resolved = ResolveDefaults(spec);
  EXPECT_EQ(resolved.model().builtin(), "micro");
  EXPECT_EQ(resolved.algorithm().max_staleness(), 0);
  EXPECT_EQ(resolved.algorithm().grad_clip_norm(), 0);
  EXPECT_FALSE(resolved.algorithm().normalize_advantage_by_std());
  EXPECT_DOUBLE_EQ(resolved.algorithm().clip_eps_high(), 0.1);  // Follows low.
  EXPECT_FLOAT_EQ(resolved.rollout().sampling().temperature(), 0.0f);
  ASSERT_EQ(resolved.reward().verifiers_size(), 1);
  EXPECT_EQ(resolved.reward().verifiers(0).name(), "format");
  EXPECT_DOUBLE_EQ(resolved.reward().verifiers(0).weight(), 1.0);
}

TEST(ResolveDefaultsTest, WarmStartDefaultsOnlyWithSftSteps) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_group_size(4);
  spec.mutable_algorithm()->set_batch_size_groups(8);
  spec.mutable_warm_start()->set_sft_steps(100);
  const v1::RunSpec resolved = ResolveDefaults(spec);
  EXPECT_DOUBLE_EQ(resolved.warm_start().learning_rate(), 1e-4);
  EXPECT_EQ(resolved.warm_start().batch_size(), 32);
}

// A GPU run's unset dtype means two dtypes (bfloat16 compute, float32
// checkpoints): it is left unset, and described.
TEST(ResolveDefaultsTest, AGpuRunKeepsItsUnsetDtypeAndSaysWhatItMeans) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_model()->set_device("cuda:1");
  const v1::RunSpec resolved = ResolveDefaults(spec);
  EXPECT_EQ(resolved.model().device(), "cuda:1");
  EXPECT_EQ(resolved.model().dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(DescribeZeroDefaults(resolved),
              ::testing::Contains(::testing::StartsWith("model.dtype: UNSPECIFIED = bfloat16")));
}

// `sluice submit --validate-only` prints the resolved spec: every field it
// still shows as 0 says what that 0 means.
TEST(DescribeZeroDefaultsTest, NamesWhatEachRemainingZeroMeans) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_batch_size_groups(32);
  spec.mutable_algorithm()->set_max_staleness(2);
  spec.mutable_task()->set_eval_split_size(500);
  const std::vector<std::string> lines = DescribeZeroDefaults(ResolveDefaults(spec));
  EXPECT_THAT(lines, ::testing::IsSupersetOf({
                         "eval.num_prompts: 0 = the whole eval split (task.eval_split_size: 500 "
                         "prompts)",
                         "buffer.capacity_groups: 0 = unlimited (the admission gate holds the "
                         "buffer to about (eta + 1) * B = 96 groups)",
                         "buffer.min_size_to_sample_groups: 0 = the batch asked for (B = 32 "
                         "groups)",
                         "rollout.max_concurrent_groups_per_worker: 0 = auto (each worker sizes "
                         "it to its memory)",
                     }));
  EXPECT_THAT(lines, ::testing::Contains(::testing::StartsWith("reward.item_timeout_ms: 0 = ")));
  // Resolved to a value, so not described.
  EXPECT_THAT(lines, ::testing::Not(::testing::Contains(::testing::StartsWith("model.dtype"))));
  spec.mutable_eval()->set_num_prompts(100);
  spec.mutable_buffer()->set_capacity_groups(1000);
  spec.mutable_reward()->set_item_timeout_ms(2000);
  for (const std::string& line : DescribeZeroDefaults(ResolveDefaults(spec))) {
    EXPECT_FALSE(absl::StartsWith(line, "eval.num_prompts") ||
                 absl::StartsWith(line, "buffer.capacity_groups") ||
                 absl::StartsWith(line, "reward.item_timeout_ms"))
        << line;
  }
}

TEST(ValidateRunSpecTest, RolloutVerificationFractionsAndTrustedWorkersAreBounded) {
  v1::RunSpec spec = ResolveDefaults(ArithmeticSpec());
  v1::RolloutVerificationConfig& v = *spec.mutable_algorithm()->mutable_rollout_verification();
  v.set_trusted_fraction(1.5);
  v.add_trusted_worker_ids("worker-0");
  v.add_trusted_worker_ids("");
  const std::string problems = ProblemsOf(spec);
  EXPECT_THAT(problems, HasSubstr("algorithm.rollout_verification.trusted_fraction: must be in "
                                  "[0, 1], got 1.5"));
  EXPECT_THAT(problems, HasSubstr("algorithm.rollout_verification.trusted_worker_ids[1]: must be "
                                  "a worker id of 1 to 256 bytes, got 0"));
}

TEST(ResolveDefaultsTest, IsIdempotent) {
  const v1::RunSpec once = ResolveDefaults(ArithmeticSpec());
  const v1::RunSpec twice = ResolveDefaults(once);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(once, twice));
}

TEST(ValidateRunSpecTest, GroupSizeOfOneIsRejectedWithTheReason) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_group_size(1);
  EXPECT_EQ(ProblemsOf(spec),
            "algorithm.group_size: must be >= 2 (GRPO needs several samples per prompt), got 1");
}

TEST(ValidateRunSpecTest, EveryProblemIsReportedOnItsOwnLine) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_group_size(-3);
  spec.mutable_algorithm()->set_learning_rate(2.0);
  spec.mutable_rollout()->mutable_sampling()->set_top_p(0);
  const std::string problems = ProblemsOf(spec);
  EXPECT_THAT(problems, HasSubstr("algorithm.group_size: must be >= 2"));
  EXPECT_THAT(problems, HasSubstr("\nalgorithm.learning_rate: must be > 0 and < 1, got 2"));
  EXPECT_THAT(problems, HasSubstr("\nrollout.sampling.top_p: must be in (0, 1], got 0"));
}

TEST(ValidateRunSpecTest, ModelNeedsASource) {
  // Unresolved, and resolved: an empty model is never the builtin default.
  v1::RunSpec spec = ArithmeticSpec();
  spec.clear_model();
  const absl::Status status = ValidateRunSpec(spec);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("model: exactly one of builtin or hf_model_dir must be set"));
  EXPECT_EQ(ResolveDefaults(spec).model().source_case(), v1::ModelConfig::SOURCE_NOT_SET);
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("model: exactly one of builtin or hf_model_dir must be "
                                          "set (e.g. model: {builtin: tiny}"));
}

// The values that once exhausted the machine, and the other unbounded ones.
TEST(ValidateRunSpecTest, AbsurdValuesAreRefusedByTheirBounds) {
  struct Case {
    std::function<void(v1::RunSpec&)> set;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_group_size(1000000000); },
       "algorithm.group_size: must be <= 1024, got 1000000000"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_batch_size_groups(2147483647); },
       "algorithm.batch_size_groups: must be <= 65536, got 2147483647"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_max_staleness(1 << 30); },
       "algorithm.max_staleness: must be <= 10000"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_total_steps(int64_t{1} << 40); },
       "algorithm.total_steps: must be <= 1000000000"},
      {[](v1::RunSpec& s) { s.mutable_task()->mutable_arithmetic()->set_num_prompts(1LL << 40); },
       "task.arithmetic.num_prompts: must be <= 10000000 (the controller holds every prompt"},
      {[](v1::RunSpec& s) { s.mutable_task()->set_eval_split_size(2000000000); },
       "task.eval_split_size: must be <= 1000000"},
      {[](v1::RunSpec& s) { s.mutable_warm_start()->set_sft_steps(int64_t{1} << 40); },
       "warm_start.sft_steps: must be <= 10000000"},
      {[](v1::RunSpec& s) {
         s.mutable_warm_start()->set_sft_steps(1);
         s.mutable_warm_start()->set_batch_size(1 << 30);
       },
       "warm_start.batch_size: must be <= 65536"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->set_num_workers(1 << 30); },
       "rollout.num_workers: must be <= 100000"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->set_max_concurrent_groups_per_worker(1 << 30); },
       "rollout.max_concurrent_groups_per_worker: must be <= 65536"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->mutable_sampling()->set_max_new_tokens(1 << 30); },
       "rollout.sampling.max_new_tokens: must be <= 32 (the model's context length)"},
      {[](v1::RunSpec& s) {
         for (int i = 0; i < 17; ++i) s.mutable_rollout()->mutable_sampling()->add_stop_strings("x");
       },
       "rollout.sampling.stop_strings: must be <= 16"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->mutable_sampling()->add_stop_strings(""); },
       "rollout.sampling.stop_strings[0]: must be 1 to 256 bytes, got 0"},
      {[](v1::RunSpec& s) {
         s.mutable_rollout()->set_weight_swap_mode(static_cast<v1::WeightSwapMode>(9));
       },
       "rollout.weight_swap_mode: must be WEIGHT_SWAP_MODE_KEEP_CACHE or _RECOMPUTE, got 9"},
      {[](v1::RunSpec& s) { s.mutable_eval()->mutable_sampling()->set_top_k(1 << 30); },
       "eval.sampling.top_k: must be <= 24 (the vocabulary size)"},
      {[](v1::RunSpec& s) { s.mutable_reward()->set_item_timeout_ms(int64_t{1} << 40); },
       "reward.item_timeout_ms: must be <= 3600000 (an hour)"},
      {[](v1::RunSpec& s) {
         for (int i = 0; i < 40; ++i) {
           v1::WeightedVerifier* v = s.mutable_reward()->add_verifiers();
           v->set_name("math");
           v->set_weight(1);
         }
       },
       "reward.verifiers: must be <= 32 (entries), got 40"},
      {[](v1::RunSpec& s) { s.mutable_buffer()->set_max_times_sampled(1 << 30); },
       "buffer.max_times_sampled: must be <= 1000000"},
      {[](v1::RunSpec& s) { s.mutable_buffer()->set_capacity_groups(int64_t{1} << 40); },
       "buffer.capacity_groups: must be <= 1000000000"},
      {[](v1::RunSpec& s) { s.mutable_buffer()->set_samples_per_insert(1e300); },
       "buffer.samples_per_insert: must be <= 1e+06"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_kl_coef(1e300); },
       "algorithm.kl_coef: must be in [0, 1e+06]"},
      {[](v1::RunSpec& s) { s.mutable_checkpoint()->set_keep_last(1 << 30); },
       "checkpoint.keep_last: must be <= 1000000"},
  };
  for (const Case& c : cases) {
    v1::RunSpec spec = ArithmeticSpec();
    c.set(spec);
    EXPECT_THAT(ProblemsOf(spec), HasSubstr(c.expected)) << c.expected;
  }
  // The bounds themselves pass.
  v1::RunSpec at_bounds = ArithmeticSpec();
  at_bounds.mutable_algorithm()->set_group_size(1024);
  at_bounds.mutable_algorithm()->set_batch_size_groups(65536);
  at_bounds.mutable_rollout()->mutable_sampling()->set_max_new_tokens(32);
  EXPECT_EQ(ProblemsOf(at_bounds), "");
}

TEST(ValidateRunSpecTest, EveryStringAndListOfTheSpecIsBoundedNamingTheField) {
  struct Case {
    std::function<void(v1::RunSpec&)> set;
    std::string expected;
  };
  const std::string kib(1024, 'x');
  const std::vector<Case> cases = {
      {[](v1::RunSpec& s) { s.set_name(std::string(257, 'n')); },
       "name: must be at most 256 bytes, got 257"},
      {[](v1::RunSpec& s) {
         for (int i = 0; i < 65; ++i) (*s.mutable_labels())[absl::StrCat("k", i)] = "v";
       },
       "labels: must be <= 64 (entries), got 65"},
      {[](v1::RunSpec& s) { (*s.mutable_labels())[std::string(64, 'k')] = "v"; },
       "labels: a key must be 1 to 63 bytes, got 64"},
      {[](v1::RunSpec& s) { (*s.mutable_labels())["team"] = std::string(257, 'v'); },
       "labels[\"team\"]: must be at most 256 bytes, got 257"},
      {[](v1::RunSpec& s) { s.mutable_model()->set_builtin(std::string(129, 'm')); },
       "model.builtin: must be at most 128 bytes, got 129"},
      {[](v1::RunSpec& s) { s.mutable_model()->set_tokenizer_path(std::string(4097, 'p')); },
       "model.tokenizer_path: must be at most 4096 bytes, got 4097"},
      {[](v1::RunSpec& s) { s.mutable_model()->set_device(std::string(129, 'd')); },
       "model.device: must be at most 128 bytes, got 129"},
      {[&](v1::RunSpec& s) { s.mutable_task()->set_system_prompt(std::string(33 * 1024, 's')); },
       "task.system_prompt: must be at most 32768 bytes, got 33792"},
      {[&](v1::RunSpec& s) { s.mutable_task()->set_prompt_template(std::string(33 * 1024, 't')); },
       "task.prompt_template: must be at most 32768 bytes, got 33792"},
      {[](v1::RunSpec& s) { s.mutable_task()->set_chat_template(std::string(129, 'c')); },
       "task.chat_template: must be at most 128 bytes, got 129"},
      {[](v1::RunSpec& s) {
         for (int i = 0; i < 17; ++i) s.mutable_task()->mutable_arithmetic()->add_operators("+");
       },
       "task.arithmetic.operators: must be <= 16 (entries), got 17"},
      {[](v1::RunSpec& s) {
         s.mutable_rollout()->mutable_sampling()->add_stop_strings(std::string(257, 'x'));
       },
       "rollout.sampling.stop_strings[0]: must be 1 to 256 bytes, got 257"},
      {[](v1::RunSpec& s) {
         for (int i = 0; i < 65; ++i) s.mutable_eval()->mutable_sampling()->add_stop_token_ids(i);
       },
       "eval.sampling.stop_token_ids: must be <= 64 (entries), got 65"},
      {[](v1::RunSpec& s) { s.mutable_reward()->add_verifiers()->set_name(std::string(129, 'v')); },
       "reward.verifiers[0].name: must be at most 128 bytes, got 129"},
      {[](v1::RunSpec& s) {
         auto* v = s.mutable_reward()->add_verifiers();
         v->set_name("format");
         for (int i = 0; i < 33; ++i) (*v->mutable_params())[absl::StrCat("p", i)] = "1";
       },
       "reward.verifiers[0].params: must be <= 32 (entries), got 33"},
      {[](v1::RunSpec& s) {
         auto* v = s.mutable_reward()->add_verifiers();
         v->set_name("format");
         (*v->mutable_params())["format_regex"] = std::string(4097, 'r');
       },
       "reward.verifiers[0].params[\"format_regex\"]: must be at most 4096 bytes, got 4097"},
      {[](v1::RunSpec& s) { s.mutable_checkpoint()->set_dir(std::string(4097, 'c')); },
       "checkpoint.dir: must be at most 4096 bytes, got 4097"},
      // Each field within its bound, the whole over it: 32 verifiers with 32
      // long parameters each.
      {[&](v1::RunSpec& s) {
         for (int i = 0; i < 32; ++i) {
           auto* v = s.mutable_reward()->add_verifiers();
           v->set_name("format");
           for (int k = 0; k < 32; ++k) (*v->mutable_params())[absl::StrCat("p", k)] = kib;
         }
       },
       "the run spec: must be at most 262144 bytes serialized"},
  };
  for (const Case& c : cases) {
    v1::RunSpec spec = ArithmeticSpec();
    c.set(spec);
    const absl::Status sizes = ValidateRunSpecSizes(spec);
    EXPECT_EQ(sizes.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_THAT(std::string(sizes.message()), HasSubstr(c.expected));
    EXPECT_THAT(ProblemsOf(spec), HasSubstr(c.expected)) << c.expected;
  }
  // Every bound itself passes.
  v1::RunSpec at_bounds = ArithmeticSpec();
  at_bounds.set_name(std::string(256, 'n'));
  for (int i = 0; i < 64; ++i)
    (*at_bounds.mutable_labels())[absl::StrCat("k", i)] = std::string(256, 'v');
  at_bounds.mutable_task()->set_chat_template("chatml");
  at_bounds.mutable_task()->set_system_prompt(std::string(32 * 1024, 's'));
  EXPECT_TRUE(ValidateRunSpecSizes(at_bounds).ok()) << ValidateRunSpecSizes(at_bounds);
}

// The 20 MB name that wedged a stack: refused at once, on its bound alone
// (nothing else of the spec is read), so that it never reaches a service.
TEST(ValidateRunSpecTest, AHugeNameIsRefusedOnItsBoundAlone) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.set_name(std::string(20 << 20, 'n'));
  spec.mutable_algorithm()->set_group_size(1);  // Not reported: the size decides.
  const std::string problems = ProblemsOf(spec);
  EXPECT_THAT(problems, HasSubstr(absl::StrCat("name: must be at most 256 bytes, got ", 20 << 20)));
  EXPECT_THAT(problems, Not(HasSubstr("group_size")));
}

TEST(CheckVerifierNamesTest, UnknownNamesGetADidYouMeanAndTheServersList) {
  v1::RunSpec spec = ResolveDefaults(ArithmeticSpec());
  spec.mutable_reward()->mutable_verifiers(0)->set_name("mth");
  v1::WeightedVerifier* other = spec.mutable_reward()->add_verifiers();
  other->set_name("nosuch");
  other->set_weight(1);
  const std::vector<std::string> known = {"code", "exact_match", "format", "length", "math"};
  const absl::Status status = CheckVerifierNames(spec, known, "the reward server at r:1");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "reward.verifiers[0].name: unknown verifier \"mth\"; did you mean \"math\"? (the "
            "reward server at r:1 offers code, exact_match, format, length, math)\n"
            "reward.verifiers[1].name: unknown verifier \"nosuch\" (the reward server at r:1 "
            "offers code, exact_match, format, length, math)");
  EXPECT_TRUE(CheckVerifierNames(ResolveDefaults(ArithmeticSpec()), known, "x").ok());
}

TEST(ValidateSpecOfflineTest, ChecksBuiltinVerifiersAndEstimatesMemory) {
  v1::RunSpec spec = ArithmeticSpec();
  absl::StatusOr<OfflineValidation> valid = ValidateSpecOffline(spec);
  ASSERT_TRUE(valid.ok()) << valid.status();
  EXPECT_EQ(valid->spec.algorithm().group_size(), 8);
  EXPECT_GT(valid->memory.rollout_worker.bytes, 0);
  EXPECT_EQ(valid->memory.sequence_tokens, 32);  // the tiny model's context
  EXPECT_THAT(DescribeRunMemory(valid->memory), HasSubstr("(each sequence up to 32 tokens)"));
  spec.mutable_reward()->add_verifiers()->set_name("nosuch");
  EXPECT_THAT(std::string(ValidateSpecOffline(spec).status().message()),
              HasSubstr("unknown verifier \"nosuch\" (this build's reward server offers"));
}

TEST(CheckRunMemoryTest, NamesTheServiceTheEstimateAndTheFields) {
  v1::RunSpec spec = ResolveDefaults(ArithmeticSpec());
  absl::StatusOr<run::RunMemoryEstimate> estimate = EstimateSpecMemory(spec);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  ServiceMemoryBudgets budgets;
  EXPECT_TRUE(CheckRunMemory(*estimate, budgets).ok());  // Unknown budgets are not checked.
  budgets.rollout_worker = {1024, "the rollout worker at w:1"};
  budgets.trainer = {int64_t{64} << 30, "the trainer at t:1"};
  const absl::Status status = CheckRunMemory(*estimate, budgets);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              ::testing::AllOf(HasSubstr("rollout worker: the run needs about"),
                               HasSubstr("more than the 1.0 KiB budget of the rollout worker at w:1"),
                               HasSubstr("algorithm.group_size"), Not(HasSubstr("trainer:"))));
}

TEST(ValidateRunSpecTest, UnknownBuiltinModelListsTheKnownOnes) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_model()->set_builtin("huge");
  EXPECT_EQ(ProblemsOf(spec), "model.builtin: unknown model \"huge\"; known: tiny, micro");
}

TEST(ValidateRunSpecTest, HuggingFaceModelDirectoriesAreReadAndChecked) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_model()->set_hf_model_dir(QwenShapedModelDir());
  EXPECT_TRUE(ValidateRunSpec(ResolveDefaults(spec)).ok())
      << ValidateRunSpec(ResolveDefaults(spec));
  spec.mutable_task()->set_chat_template("chatml");
  EXPECT_TRUE(ValidateRunSpec(ResolveDefaults(spec)).ok());

  spec.mutable_model()->set_hf_model_dir("/models/qwen");
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("model.hf_model_dir: \"/models/qwen\" is not a "
                                          "directory readable by the controller"));
}

TEST(ValidateRunSpecTest, TheExampleQwenSpecIsValidOnceItsModelExists) {
  absl::StatusOr<v1::RunSpec> spec = LoadRunSpecFile(Data("../configs/gsm8k-qwen.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().hf_model_dir(), "/models/Qwen2.5-0.5B-Instruct");
  // Paths as they would be on a machine with the model, from any directory.
  spec->mutable_model()->set_hf_model_dir(QwenShapedModelDir());
  spec->mutable_task()->mutable_dataset()->set_path(Data("datasets/gsm8k/test.jsonl"));
  spec->mutable_model()->set_max_context_tokens(512);  // The stand-in config's context.
  EXPECT_EQ(ProblemsOf(*spec), "");
}

TEST(ValidateRunSpecTest, ModelDtypeIsAFloatingPointOne) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_model()->set_dtype(v1::DTYPE_BFLOAT16);
  EXPECT_EQ(ProblemsOf(spec), "");
  spec.mutable_model()->set_dtype(v1::DTYPE_INT8);
  EXPECT_EQ(ProblemsOf(spec),
            "model.dtype: must be DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16, got DTYPE_INT8");
}

TEST(ValidateRunSpecTest, BuiltinModelsCannotSpellDatasetText) {
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_GSM8K, "datasets/gsm8k/test.jsonl");
  spec.mutable_model()->set_builtin("tiny");
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("task.dataset: the builtin models' character tokenizer "
                                          "knows only"));
  spec = ArithmeticSpec();
  spec.mutable_task()->set_prompt_template("Compute {question}");
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("task.prompt_template: the builtin models' tokenizer "
                                          "cannot spell it: character 'C' at offset 0"));
}

TEST(ValidateRunSpecTest, TaskNeedsASource) {
  v1::RunSpec spec;
  spec.mutable_model()->set_builtin("tiny");
  EXPECT_EQ(ProblemsOf(spec), "task: exactly one of arithmetic or dataset must be set");
}

TEST(ResolveDefaultsTest, DatasetsGetTheirFormatsVerifierAndPromptTemplate) {
  for (const auto& [format, verifier, prompt_template] :
       std::vector<std::tuple<v1::DatasetFormat, std::string, std::string>>{
           {v1::DATASET_FORMAT_GSM8K, "math",
            "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."},
           {v1::DATASET_FORMAT_MATH, "math",
            "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."},
           {v1::DATASET_FORMAT_HUMANEVAL, "code", "{question}"}}) {
    SCOPED_TRACE(v1::DatasetFormat_Name(format));
    const v1::RunSpec spec = ResolveDefaults(DatasetSpec(format, "any.jsonl"));
    ASSERT_EQ(spec.reward().verifiers_size(), 1);
    EXPECT_EQ(spec.reward().verifiers(0).name(), verifier);
    EXPECT_DOUBLE_EQ(spec.reward().verifiers(0).weight(), 1.0);
    EXPECT_EQ(spec.task().prompt_template(), prompt_template);
    EXPECT_EQ(spec.task().eval_split_size(), 200);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ResolveDefaults(spec), spec));
  }
}

TEST(ResolveDefaultsTest, DatasetKeepsTheUsersVerifiersAndTemplate) {
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_GSM8K, "any.jsonl");
  spec.mutable_reward()->add_verifiers()->set_name("format");
  spec.mutable_task()->set_prompt_template("Q: {question}\nA:");
  spec = ResolveDefaults(spec);
  ASSERT_EQ(spec.reward().verifiers_size(), 1);
  EXPECT_EQ(spec.reward().verifiers(0).name(), "format");
  EXPECT_EQ(spec.task().prompt_template(), "Q: {question}\nA:");
}

TEST(ResolveDefaultsTest, ArithmeticKeepsAnEmptyPromptTemplate) {
  EXPECT_EQ(ResolveDefaults(ArithmeticSpec()).task().prompt_template(), "");
}

TEST(ValidateRunSpecTest, DatasetTasksAreAccepted) {
  for (const auto& [format, path] : std::vector<std::pair<v1::DatasetFormat, std::string>>{
           {v1::DATASET_FORMAT_GSM8K, "datasets/gsm8k/test.jsonl"},
           {v1::DATASET_FORMAT_MATH, "datasets/math500/test.jsonl"},
           {v1::DATASET_FORMAT_HUMANEVAL, "datasets/humaneval/HumanEval.jsonl.gz"}}) {
    SCOPED_TRACE(path);
    v1::RunSpec spec = DatasetSpec(format, path);
    EXPECT_EQ(ProblemsOf(spec), "");
    spec.mutable_task()->set_chat_template("chatml");
    spec.mutable_task()->set_system_prompt("You are a helpful assistant.");
    EXPECT_EQ(ProblemsOf(spec), "");
  }
}

TEST(ValidateRunSpecTest, UnreadableDatasetNamesThePath) {
  const v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_GSM8K, "datasets/nope.jsonl");
  EXPECT_THAT(ProblemsOf(spec), HasSubstr(absl::StrCat("task.dataset.path: cannot read \"",
                                                       Data("datasets/nope.jsonl"), "\": ")));
}

TEST(ValidateRunSpecTest, DatasetInTheWrongFormatNamesTheFileAndLine) {
  // MATH-500 rows have no "question" column.
  const v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_GSM8K, "datasets/math500/test.jsonl");
  EXPECT_EQ(ProblemsOf(spec),
            absl::StrCat("task.dataset.path: cannot read \"", Data("datasets/math500/test.jsonl"),
                         "\": line 1: no \"question\" column"));
}

TEST(ValidateRunSpecTest, DatasetFormatMustBeSetAndSupported) {
  EXPECT_THAT(ProblemsOf(DatasetSpec(v1::DATASET_FORMAT_UNSPECIFIED, "datasets/gsm8k/test.jsonl")),
              HasSubstr("task.dataset.format: must be DATASET_FORMAT_JSONL, _GSM8K, _MATH or "
                        "_HUMANEVAL, got DATASET_FORMAT_UNSPECIFIED"));
  const std::string mbpp = ProblemsOf(DatasetSpec(v1::DATASET_FORMAT_MBPP, "mbpp.jsonl"));
  EXPECT_THAT(mbpp, HasSubstr("task.dataset.format: MBPP is not supported yet"));
  // The format is the problem; no second line about verifiers.
  EXPECT_THAT(mbpp, Not(HasSubstr("reward.verifiers:")));
}

TEST(ValidateRunSpecTest, JsonlDatasetNeedsVerifiers) {
  const std::string path =
      WriteJsonl("run_spec_jsonl.jsonl",
                 {R"({"prompt": "1+1=", "answer": "2"})", R"({"prompt": "2+2=", "answer": "4"})"});
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_JSONL, "unused");
  spec.mutable_task()->mutable_dataset()->set_path(path);
  EXPECT_EQ(ProblemsOf(spec),
            "reward.verifiers: a JSONL dataset needs reward.verifiers (e.g. {name: math}); only "
            "GSM8K, MATH and HumanEval datasets get a default verifier");
  spec.mutable_reward()->add_verifiers()->set_name("math");
  EXPECT_EQ(ProblemsOf(spec), "");
}

TEST(ValidateRunSpecTest, PromptTemplateAndChatTemplateAreChecked) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->set_prompt_template("Compute:");
  spec.mutable_task()->set_chat_template("llama3");
  const std::string problems = ProblemsOf(spec);
  EXPECT_THAT(problems, HasSubstr("task.prompt_template: must contain \"{question}\""));
  EXPECT_THAT(problems, HasSubstr("task.chat_template: unknown \"llama3\"; known: none, chatml"));

  spec.mutable_task()->set_prompt_template("= {question}");
  spec.mutable_task()->set_chat_template("none");
  EXPECT_EQ(ProblemsOf(spec), "");
}

TEST(ValidateRunSpecTest, NegativeMaxPromptsIsRejected) {
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_GSM8K, "datasets/gsm8k/test.jsonl");
  spec.mutable_task()->mutable_dataset()->set_max_prompts(-1);
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("task.dataset.max_prompts: must be >= 0"));
}

TEST(ValidateRunSpecTest, ArithmeticOptionsAreNamedByTheirPathInTheSpec) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->mutable_arithmetic()->set_min_operand(50);
  spec.mutable_task()->mutable_arithmetic()->set_max_operand(10);
  spec.mutable_task()->mutable_arithmetic()->add_operators("/");
  const std::string problems = ProblemsOf(spec);
  EXPECT_THAT(problems, HasSubstr("task.arithmetic.max_operand: must be >= min_operand (50), "
                                  "got 10"));
  EXPECT_THAT(problems, HasSubstr("task.arithmetic.operators[0]: must be"));
}

TEST(ValidateRunSpecTest, EvalSplitLargerThanTheProblemSpaceNamesTheSpecField) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->mutable_arithmetic()->set_max_operand(2);
  spec.mutable_task()->mutable_arithmetic()->add_operators("+");
  spec.mutable_task()->set_eval_split_size(50);
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("task.eval_split_size: only 9 distinct problems"));
}

TEST(ValidateRunSpecTest, TrajectoryBalanceIsAccepted) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
  spec.mutable_algorithm()->set_tb_use_reference(true);
  spec.mutable_algorithm()->set_tb_beta(0.05);
  EXPECT_EQ(ProblemsOf(spec), "");
  // Groups of equal rewards carry its signal: kept unless said otherwise.
  EXPECT_EQ(ResolveDefaults(spec).algorithm().dynamic_sampling(), v1::DYNAMIC_SAMPLING_KEEP);
  spec.mutable_algorithm()->set_objective(v1::OBJECTIVE_GRPO);
  spec.mutable_algorithm()->set_tb_use_reference(false);
  EXPECT_EQ(ProblemsOf(spec), "");
  spec.mutable_algorithm()->set_objective(static_cast<v1::Objective>(9));
  EXPECT_THAT(ProblemsOf(spec),
              HasSubstr("algorithm.objective: must be OBJECTIVE_GRPO, OBJECTIVE_DECOUPLED_PPO or "
                        "OBJECTIVE_TRAJECTORY_BALANCE, got 9"));
}

TEST(ResolveDefaultsTest, TheConstantNormalizerIsTheLongestCompletion) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_loss_aggregation(v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER);
  // max_new_tokens 0 = up to the context: tiny's 32.
  EXPECT_EQ(ResolveDefaults(spec).algorithm().loss_normalizer_tokens(), 32);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(12);
  EXPECT_EQ(ResolveDefaults(spec).algorithm().loss_normalizer_tokens(), 12);
  spec.mutable_algorithm()->set_loss_normalizer_tokens(100);
  EXPECT_EQ(ResolveDefaults(spec).algorithm().loss_normalizer_tokens(), 100);
  EXPECT_EQ(ProblemsOf(spec), "");
}

// Every objective and correction the YAML can name, by its short enum
// names, with the field that predates them (truncated_importance_sampling)
// still read as before.
TEST(ValidateRunSpecTest, ObjectiveChoicesParseFromYamlAndValidate) {
  const std::vector<std::string> algorithms = {
      "{objective: decoupled_ppo, proximal_logprobs: loglinear, minibatches_per_batch: 2}",
      "{objective: decoupled_ppo, truncated_importance_sampling: true}",
      "{objective: decoupled_ppo, behaviour_weight_mode: mask, behaviour_weight_floor: 0.5, "
      "behaviour_weight_cap: 2}",
      "{objective: decoupled_ppo, second_moment_threshold: 0.04}",
      "{objective: grpo, normalize_advantage_by_std: false, loss_aggregation: "
      "constant_normalizer, loss_normalizer_tokens: 16}",
      "{objective: grpo, clip_eps_high: 0.28, loss_aggregation: sequence_mean, "
      "dynamic_sampling: refill}",
      "{objective: grpo, dynamic_sampling: keep, kl_coef: 0.01, entropy_coef: 0.001}",
      "{objective: trajectory_balance, tb_beta: 0.1, tb_use_reference: true}",
      "{objective: trajectory_balance, dynamic_sampling: drop}",
      "{objective: grpo, lr_warmup_steps: 10, lr_schedule: cosine, min_lr_ratio: 0.1}",
      "{objective: decoupled_ppo, lr_schedule: linear}",
      "{objective: grpo, lr_schedule: constant}",
      "{objective: decoupled_ppo, max_staleness: 8, staleness_bound: token}",
      "{objective: grpo, staleness_bound: group}",
  };
  for (const std::string& algorithm : algorithms) {
    SCOPED_TRACE(algorithm);
    absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml(
        absl::StrCat("model: {builtin: tiny}\ntask: {arithmetic: {}}\nalgorithm: ", algorithm,
                     "\n"),
        "spec.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(ProblemsOf(*spec), "");
  }
}

TEST(ValidateRunSpecTest, WeightSyncFromYamlIsResolvedAndItsMisusesNamed) {
  const auto parse = [](const std::string& weight_sync, const std::string& device) {
    absl::StatusOr<v1::RunSpec> spec = ParseRunSpecYaml(
        absl::StrCat("model: {builtin: tiny", device.empty() ? "" : ", device: " + device,
                     "}\ntask: {arithmetic: {}}\nweight_sync: ", weight_sync, "\n"),
        "spec.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? *spec : v1::RunSpec();
  };
  // Unset on cpu: float32 over gRPC, no deltas, spelled out once resolved.
  v1::RunSpec resolved = ResolveDefaults(parse("{}", ""));
  EXPECT_EQ(resolved.weight_sync().transport(), v1::WEIGHT_TRANSPORT_GRPC);
  EXPECT_EQ(resolved.weight_sync().dtype(), v1::DTYPE_FLOAT32);
  EXPECT_TRUE(resolved.weight_sync().has_delta());
  EXPECT_FALSE(resolved.weight_sync().delta());
  EXPECT_EQ(ValidateRunSpec(resolved).message(), "");
  resolved = ResolveDefaults(parse("{dtype: bfloat16}", ""));
  EXPECT_TRUE(resolved.weight_sync().delta());
  EXPECT_EQ(ProblemsOf(parse("{transport: grpc, dtype: float16, delta: false}", "")), "");
  EXPECT_EQ(ProblemsOf(parse("{transport: cuda_ipc}", "")),
            "weight_sync.transport: cuda_ipc moves weights between GPUs of one host; "
            "model.device is \"cpu\" (use grpc, or run on cuda)");
  EXPECT_THAT(ProblemsOf(parse("{transport: nccl}", "cpu")),
              HasSubstr("weight_sync.transport: nccl"));
  EXPECT_THAT(ProblemsOf(parse("{delta: true}", "")),
              HasSubstr("weight_sync.delta: sparse deltas need a 16-bit weight_sync.dtype"));
  EXPECT_THAT(ProblemsOf(parse("{dtype: int8}", "")), HasSubstr("weight_sync.dtype: "));
}

TEST(ValidateRunSpecTest, ObjectiveChoicesOutOfRangeOrIgnoredAreRefused) {
  struct Case {
    std::function<void(v1::AlgorithmConfig&)> set;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](v1::AlgorithmConfig& a) { a.set_behaviour_weight_floor(-0.1); },
       "algorithm.behaviour_weight_floor: must be >= 0 (0 = none), got -0.1"},
      {[](v1::AlgorithmConfig& a) { a.set_behaviour_weight_floor(6); },
       "algorithm.behaviour_weight_floor: must be < behaviour_weight_cap (5), got 6"},
      {[](v1::AlgorithmConfig& a) {
         a.set_behaviour_weight_floor(0.5);
         a.set_behaviour_weight_mode(v1::BEHAVIOUR_WEIGHT_MODE_NONE);
       },
       "algorithm.behaviour_weight_floor: bounds the behaviour weight, which "
       "BEHAVIOUR_WEIGHT_MODE_NONE leaves unbounded"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_GRPO);
         a.set_behaviour_weight_floor(0.5);
       },
       "algorithm.behaviour_weight_floor: bounds decoupled PPO's behaviour weight; "
       "OBJECTIVE_GRPO has none"},
      {[](v1::AlgorithmConfig& a) { a.set_second_moment_threshold(-1); },
       "algorithm.second_moment_threshold: must be in [0, 1e+06] (0 = off; M2PO uses 0.04), "
       "got -1"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
         a.set_second_moment_threshold(0.04);
       },
       "algorithm.second_moment_threshold: masks by decoupled PPO's behaviour weight; "
       "OBJECTIVE_TRAJECTORY_BALANCE has none"},
      {[](v1::AlgorithmConfig& a) {
         a.set_proximal_logprobs(static_cast<v1::ProximalLogprobsMethod>(7));
       },
       "algorithm.proximal_logprobs: must be PROXIMAL_LOGPROBS_METHOD_RECOMPUTE or _LOGLINEAR, "
       "got 7"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_GRPO);
         a.set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR);
       },
       "algorithm.proximal_logprobs: PROXIMAL_LOGPROBS_METHOD_LOGLINEAR approximates decoupled "
       "PPO's proximal policy; OBJECTIVE_GRPO has none"},
      {[](v1::AlgorithmConfig& a) {
         a.set_truncated_importance_sampling(true);
         a.set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR);
       },
       "algorithm.truncated_importance_sampling: takes the current weights as the proximal "
       "policy, so proximal_logprobs LOGLINEAR would be ignored; choose one"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_GRPO);
         a.set_truncated_importance_sampling(true);
       },
       "algorithm.truncated_importance_sampling: replaces decoupled PPO's proximal policy; only "
       "with OBJECTIVE_DECOUPLED_PPO, got OBJECTIVE_GRPO"},
      {[](v1::AlgorithmConfig& a) {
         a.set_loss_aggregation(static_cast<v1::LossAggregation>(9));
       },
       "algorithm.loss_aggregation: must be LOSS_AGGREGATION_TOKEN_MEAN, _SEQUENCE_MEAN or "
       "_CONSTANT_NORMALIZER, got 9"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
         a.set_loss_aggregation(v1::LOSS_AGGREGATION_SEQUENCE_MEAN);
       },
       "algorithm.loss_aggregation: trajectory balance's loss is a mean over sequences already"},
      {[](v1::AlgorithmConfig& a) { a.set_loss_normalizer_tokens(-3); },
       "algorithm.loss_normalizer_tokens: must be >= 0 (0 = rollout.sampling.max_new_tokens), "
       "got -3"},
      {[](v1::AlgorithmConfig& a) { a.set_dynamic_sampling(static_cast<v1::DynamicSampling>(8)); },
       "algorithm.dynamic_sampling: must be DYNAMIC_SAMPLING_KEEP, _DROP or _REFILL, got 8"},
      {[](v1::AlgorithmConfig& a) { a.set_entropy_coef(-0.01); },
       "algorithm.entropy_coef: must be in [0, 1e+06], got -0.01"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
         a.set_entropy_coef(0.01);
       },
       "algorithm.entropy_coef: is a term of the GRPO and decoupled-PPO losses, not of "
       "trajectory balance"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
         a.set_kl_coef(0.01);
       },
       "algorithm.kl_coef: is a term of the GRPO and decoupled-PPO losses; trajectory balance "
       "takes its reference inside the residual: set tb_use_reference"},
      {[](v1::AlgorithmConfig& a) { a.set_lr_schedule(static_cast<v1::LrSchedule>(6)); },
       "algorithm.lr_schedule: must be LR_SCHEDULE_CONSTANT, _COSINE or _LINEAR, got 6"},
      {[](v1::AlgorithmConfig& a) {
         a.set_lr_schedule(v1::LR_SCHEDULE_COSINE);
         a.set_min_lr_ratio(1.5);
       },
       "algorithm.min_lr_ratio: must be in [0, 1], got 1.5"},
      {[](v1::AlgorithmConfig& a) { a.set_min_lr_ratio(0.1); },
       "algorithm.min_lr_ratio: is where a decaying schedule ends; set algorithm.lr_schedule to "
       "cosine or linear, or leave it out (got 0.1 with a constant learning rate)"},
      {[](v1::AlgorithmConfig& a) { a.set_staleness_bound(static_cast<v1::StalenessBound>(5)); },
       "algorithm.staleness_bound: must be STALENESS_BOUND_GROUP or _TOKEN, got 5"},
      {[](v1::AlgorithmConfig& a) {
         a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
         a.set_staleness_bound(v1::STALENESS_BOUND_TOKEN);
       },
       "algorithm.staleness_bound: STALENESS_BOUND_TOKEN drops single tokens from the loss; "
       "trajectory balance's loss is over whole sequences"},
      {[](v1::AlgorithmConfig& a) { a.set_tb_use_reference(true); },
       "algorithm.tb_use_reference: is trajectory balance's (OBJECTIVE_TRAJECTORY_BALANCE); for "
       "a KL to the reference with OBJECTIVE_DECOUPLED_PPO set kl_coef"},
  };
  for (const Case& c : cases) {
    v1::RunSpec spec = ArithmeticSpec();
    c.set(*spec.mutable_algorithm());
    const std::string problems = ProblemsOf(spec);
    EXPECT_THAT(problems, HasSubstr(c.expected));
    // One line: the bad field alone.
    EXPECT_EQ(problems.find('\n'), std::string::npos) << problems;
  }
}

TEST(ValidateRunSpecTest, BufferFieldsAreCheckedAsTheReplayBufferChecksThem) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_buffer()->set_sampler(v1::SAMPLER_KIND_PRIORITIZED);
  EXPECT_EQ(ProblemsOf(spec), "");
  spec.mutable_buffer()->set_sampler(static_cast<v1::SamplerKind>(12));
  spec.mutable_buffer()->set_samples_per_insert(2);
  spec.mutable_buffer()->set_samples_per_insert_tolerance(1);
  EXPECT_EQ(ProblemsOf(spec),
            "buffer.sampler: unknown sampler kind 12\n"
            "buffer.samples_per_insert_tolerance: must be >= (batch_size_groups + "
            "samples_per_insert) / 2 = 9, got 1; with less, inserts could block before a whole "
            "batch may be sampled and both sides would wait for ever");
}

TEST(ValidateRunSpecTest, Ranges) {
  struct Case {
    std::function<void(v1::RunSpec&)> set;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](v1::RunSpec& s) { s.mutable_rollout()->mutable_sampling()->set_temperature(-0.5f); },
       "rollout.sampling.temperature: must be >= 0"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->mutable_sampling()->set_top_p(1.5f); },
       "rollout.sampling.top_p: must be in (0, 1], got 1.5"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_learning_rate(-1e-3); },
       "algorithm.learning_rate: must be > 0 and < 1"},
      {[](v1::RunSpec& s) {
         s.mutable_warm_start()->set_sft_steps(10);
         s.mutable_warm_start()->set_learning_rate(1.5);
       },
       "warm_start.learning_rate: must be > 0 and < 1, got 1.5"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_clip_eps_low(1.0); },
       "algorithm.clip_eps_low: must be in (0, 1), got 1"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_clip_eps_high(-0.1); },
       "algorithm.clip_eps_high: must be in (0, 1), got -0.1"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_max_staleness(-1); },
       "algorithm.max_staleness: must be >= 0 (0 = synchronous on-policy), got -1"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_total_steps(-5); },
       "algorithm.total_steps: must be > 0, got -5"},
      {[](v1::RunSpec& s) { s.mutable_warm_start()->set_target_accuracy(1.2); },
       "warm_start.target_accuracy: must be in [0, 1], got 1.2"},
      {[](v1::RunSpec& s) { s.mutable_algorithm()->set_batch_size_groups(-1); },
       "algorithm.batch_size_groups: must be >= 1, got -1"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->set_num_workers(-2); },
       "rollout.num_workers: must be >= 0 (0 = every registered worker), got -2"},
      {[](v1::RunSpec& s) { s.mutable_rollout()->set_min_workers(-1); },
       "rollout.min_workers: must be >= 1, got -1"},
      {[](v1::RunSpec& s) {
         s.mutable_rollout()->set_num_workers(2);
         s.mutable_rollout()->set_min_workers(3);
       },
       "rollout.min_workers: must be <= rollout.num_workers (2), got 3"},
      {[](v1::RunSpec& s) { s.mutable_eval()->set_num_prompts(500); },
       "eval.num_prompts: must be <= task.eval_split_size (200), got 500"},
      {[](v1::RunSpec& s) { s.mutable_reward()->add_verifiers()->set_weight(-1); },
       "reward.verifiers[0].name: must name a verifier"},
  };
  for (const Case& c : cases) {
    v1::RunSpec spec = ArithmeticSpec();
    c.set(spec);
    EXPECT_THAT(ProblemsOf(spec), HasSubstr(c.expected));
  }
}

TEST(ValidateRunSpecTest, VerifierParamsAreCheckedAtSubmission) {
  const auto with = [](const std::string& name, std::map<std::string, std::string> params) {
    v1::RunSpec spec = ArithmeticSpec();
    v1::WeightedVerifier* v = spec.mutable_reward()->add_verifiers();
    v->set_name(name);
    v->set_weight(1);
    for (const auto& [key, value] : params) (*v->mutable_params())[key] = value;
    return ProblemsOf(spec);
  };
  EXPECT_THAT(with("length", {{"max_lenght", "10"}}),
              HasSubstr("reward.verifiers[0].params: max_lenght: not a parameter of \"length\""));
  EXPECT_THAT(with("length", {{"length_cache", "4"}}),
              HasSubstr("reward.verifiers[0].params: max_length: required"));
  EXPECT_THAT(with("length", {{"max_length", "10"}, {"length_cache", "20"}}),
              HasSubstr("length_cache: must be in [0, 10], got 20"));
  EXPECT_THAT(with("format", {{"format_regex", "(unclosed"}}),
              HasSubstr("format_regex: not a valid RE2 pattern"));
  EXPECT_THAT(with("format", {{"format", "xml"}}), HasSubstr("format: must be one of"));
  EXPECT_THAT(with("math", {{"precision", "99"}}), HasSubstr("precision: must be in [0, 15]"));
  EXPECT_THAT(with("code", {{"x", "1"}}), HasSubstr("x: not a parameter of \"code\""));
  // Good params, and verifiers that are not built in, pass.
  EXPECT_EQ(with("length", {{"max_length", "10"}, {"length_cache", "4"}, {"length_unit", "tokens"}}),
            "");
  EXPECT_EQ(with("format", {{"format_regex", "^<think>"}, {"format_full_match", "false"}}), "");
  EXPECT_EQ(with("my_verifier", {{"anything", "goes"}}), "");
}

TEST(ValidateRunSpecTest, NanIsOutOfEveryRange) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_algorithm()->set_learning_rate(std::nan(""));
  EXPECT_THAT(ProblemsOf(spec), HasSubstr("algorithm.learning_rate"));
}

TEST(BuildTrainingPromptsTest, TheTrainingPoolOfTheSpec) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->mutable_arithmetic()->set_num_prompts(50);
  spec.mutable_task()->set_eval_split_size(10);
  spec.set_seed(7);
  absl::StatusOr<std::vector<v1::Prompt>> prompts = BuildTrainingPrompts(ResolveDefaults(spec));
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 50u);
  for (const v1::Prompt& prompt : *prompts) {
    EXPECT_THAT(prompt.prompt_id(), HasSubstr("arith-"));
    EXPECT_THAT(prompt.text(), HasSubstr("="));
    EXPECT_FALSE(prompt.reference_answer().empty());
  }
  absl::StatusOr<std::vector<v1::Prompt>> again = BuildTrainingPrompts(ResolveDefaults(spec));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].text(), (*prompts)[0].text());
}

TEST(BuildTrainingPromptsTest, ArithmeticPromptsAreTheTasksOwn) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->mutable_arithmetic()->set_num_prompts(30);
  spec.mutable_task()->set_eval_split_size(5);
  spec.set_seed(3);
  spec = ResolveDefaults(spec);
  absl::StatusOr<std::vector<v1::Prompt>> prompts = BuildTrainingPrompts(spec);
  absl::StatusOr<task::ArithmeticTask> task =
      task::ArithmeticTask::Generate(ArithmeticOptionsFor(spec));
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_EQ(prompts->size(), task->train.size());
  for (size_t i = 0; i < prompts->size(); ++i) {
    EXPECT_EQ((*prompts)[i].prompt_id(), task->train[i].prompt_id);
    EXPECT_EQ((*prompts)[i].text(), task->train[i].prompt);
    EXPECT_EQ((*prompts)[i].reference_answer(), task->train[i].reference_answer);
    EXPECT_EQ((*prompts)[i].verifier(), "");
    EXPECT_TRUE((*prompts)[i].metadata().empty());
  }
}

TEST(BuildTrainingPromptsTest, HumanEvalPromptsCarryTheCodeVerifierAndItsInputs) {
  v1::RunSpec spec = ResolveDefaults(
      DatasetSpec(v1::DATASET_FORMAT_HUMANEVAL, "datasets/humaneval/HumanEval.jsonl.gz"));
  absl::StatusOr<std::vector<v1::Prompt>> prompts = BuildTrainingPrompts(spec);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 164u - 16u);  // 10% of 164 held out.
  for (const v1::Prompt& prompt : *prompts) {
    EXPECT_THAT(prompt.prompt_id(), HasSubstr("HumanEval/"));
    EXPECT_EQ(prompt.verifier(), "");  // The run's composition scores it.
    EXPECT_EQ(prompt.text(), prompt.metadata().at("prompt"));
    EXPECT_FALSE(prompt.metadata().at("test").empty());
    EXPECT_FALSE(prompt.metadata().at("entry_point").empty());
  }
}

TEST(BuildTrainingPromptsTest, Gsm8kPromptsAreTemplated) {
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_GSM8K, "datasets/gsm8k/test.jsonl");
  spec.mutable_task()->mutable_dataset()->set_max_prompts(100);
  spec.mutable_task()->set_eval_split_size(10);
  absl::StatusOr<std::vector<v1::Prompt>> prompts = BuildTrainingPrompts(ResolveDefaults(spec));
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 90u);
  for (const v1::Prompt& prompt : *prompts) {
    EXPECT_THAT(prompt.text(), HasSubstr("put your final answer within \\boxed{}."));
    EXPECT_EQ(prompt.verifier(), "");
    EXPECT_FALSE(prompt.reference_answer().empty());
    EXPECT_FALSE(prompt.reference_is_solution());  // "18", extracted from the solution.
  }
}

TEST(BuildTrainingPromptsTest, JsonlSolutionReferencesAreMarkedForTheRewardServer) {
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_JSONL, "datasets/gsm8k/test.jsonl");
  spec.mutable_task()->mutable_dataset()->set_prompt_field("question");
  spec.mutable_task()->mutable_dataset()->set_answer_is_solution(true);
  spec.mutable_task()->mutable_dataset()->set_max_prompts(20);
  spec.mutable_reward()->add_verifiers()->set_name("math");
  absl::StatusOr<std::vector<v1::Prompt>> prompts = BuildTrainingPrompts(ResolveDefaults(spec));
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_FALSE(prompts->empty());
  for (const v1::Prompt& prompt : *prompts) {
    EXPECT_TRUE(prompt.reference_is_solution());
    EXPECT_THAT(prompt.reference_answer(), HasSubstr("####"));
  }
}

TEST(BuildTrainingPromptsTest, MissingDatasetIsAnError) {
  absl::StatusOr<std::vector<v1::Prompt>> prompts = BuildTrainingPrompts(
      ResolveDefaults(DatasetSpec(v1::DATASET_FORMAT_GSM8K, "datasets/nope.jsonl")));
  EXPECT_EQ(prompts.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice::controller
