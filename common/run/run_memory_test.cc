#include "common/run/run_memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace sluice::run {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A shape small enough to check by hand.
model::ModelConfig Small() {
  model::ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.max_position_embeddings = 32;
  return c;
}

// Qwen2.5-0.5B's shape.
model::ModelConfig Qwen05() {
  model::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  return c;
}

v1::RunSpec Spec(int group_size, int batch_groups) {
  v1::RunSpec spec;
  spec.mutable_algorithm()->set_group_size(group_size);
  spec.mutable_algorithm()->set_batch_size_groups(batch_groups);
  spec.mutable_algorithm()->set_max_staleness(2);
  spec.mutable_algorithm()->set_minibatches_per_batch(1);
  spec.mutable_algorithm()->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  spec.mutable_buffer()->set_max_times_sampled(1);
  spec.mutable_task()->set_eval_split_size(200);
  return spec;
}

TEST(RunMemoryTest, GenerationBatchByHand) {
  // KV: 4 sequences x 32 tokens x (2 layers x 2 x 1 head x 16 x 4 B) = 32768.
  // Prefill: 4 x 8 x (4*32 + 2*64) x 4 = 32768 activations, 4 x 2 heads x 8 x
  // 8 x 2 x 4 = 4096 attention, 4 x 8 x 100 x 4 = 12800 logits; it exceeds a
  // decoding step's 4 x 100 x 3 x 4 = 4800.
  EXPECT_EQ(GenerationBatchBytes(Small(), 4, 8, 32), 32768 + 32768 + 4096 + 12800);
}

TEST(RunMemoryTest, TrainingBatchByHand) {
  // Saved: 2 seq x 10 tok x 2 layers x (320 + 256 + 2*2*16) x 4 = 102400.
  // Attention: 2 x 2 layers x 2 heads x 10 x 10 x 2 x 4 = 6400.
  // Logits: 2 x 10 x 100 x 3 x 4 = 24000.
  EXPECT_EQ(TrainingBatchBytes(Small(), 2, 10), 102400 + 6400 + 24000);
}

TEST(RunMemoryTest, AnEntropyBonusKeepsTwoMoreVocabularySizedTensors) {
  // Logits: 2 x 10 x 100 x (3 + 2) x 4 = 40000 instead of 24000.
  EXPECT_EQ(TrainingBatchBytes(Small(), 2, 10, /*entropy_gradient=*/true),
            102400 + 6400 + 40000);
}

// The copies of the weights the trainer keeps besides its own: the batch
// start's (decoupled PPO recomputing pi_prox over minibatches) and the frozen
// reference (a KL to it, or trajectory balance against it). Each is counted
// exactly when the trainer allocates it.
TEST(RunMemoryTest, ProximalAndReferenceCopiesAreCountedWhenKept) {
  const auto copies = [](const v1::RunSpec& spec) {
    std::vector<std::string> kept;
    for (const MemoryTerm& term : EstimateRunMemory(spec, Small(), 8).trainer.terms) {
      if (term.what == "proximal policy" || term.what == "reference policy") {
        kept.push_back(term.what);
      }
    }
    return kept;
  };
  v1::RunSpec spec = Spec(4, 4);
  EXPECT_THAT(copies(spec), IsEmpty());
  spec.mutable_algorithm()->set_minibatches_per_batch(2);
  EXPECT_THAT(copies(spec), ::testing::ElementsAre("proximal policy"));
  EXPECT_TRUE(KeepsProximalPolicy(spec.algorithm()));
  // The log-linear approximation and truncated importance sampling keep none.
  spec.mutable_algorithm()->set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR);
  EXPECT_THAT(copies(spec), IsEmpty());
  spec.mutable_algorithm()->set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_RECOMPUTE);
  spec.mutable_algorithm()->set_truncated_importance_sampling(true);
  EXPECT_THAT(copies(spec), IsEmpty());
  spec.mutable_algorithm()->set_truncated_importance_sampling(false);
  spec.mutable_algorithm()->set_kl_coef(0.01);
  EXPECT_THAT(copies(spec), ::testing::ElementsAre("proximal policy", "reference policy"));
  // Trajectory balance has no proximal policy; its reference is its own switch.
  spec.mutable_algorithm()->set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
  spec.mutable_algorithm()->set_kl_coef(0);
  EXPECT_THAT(copies(spec), IsEmpty());
  spec.mutable_algorithm()->set_tb_use_reference(true);
  EXPECT_THAT(copies(spec), ::testing::ElementsAre("reference policy"));
  EXPECT_TRUE(KeepsReferencePolicy(spec.algorithm()));
}

TEST(RunMemoryTest, StoredGroupBytes) {
  EXPECT_EQ(StoredGroupBytes(8, 100), 8 * (100 * 16 + 512) + 1024);
}

TEST(RunMemoryTest, SequenceLengthIsPromptPlusNewTokensWithinTheContext) {
  v1::RunSpec spec = Spec(8, 16);
  EXPECT_EQ(RunSequenceTokens(spec, Small(), -1), 32);  // unknown prompt: the context
  EXPECT_EQ(RunSequenceTokens(spec, Small(), 5), 32);   // no max_new_tokens: up to the context
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(10);
  EXPECT_EQ(RunSequenceTokens(spec, Small(), 5), 15);
  spec.mutable_model()->set_max_context_tokens(12);
  EXPECT_EQ(RunSequenceTokens(spec, Small(), 5), 12);
}

TEST(RunMemoryTest, QwenWorkerKvCacheIsWhatVllmWouldReserve) {
  // 128 sequences x 1,024 tokens x 24 layers x 2 x 2 KV heads x 64 x 4 B
  // = 3 GiB of KV cache, plus two copies of the 494M weights.
  v1::RunSpec spec = Spec(8, 16);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(768);
  const RunMemoryEstimate estimate = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_EQ(estimate.sequence_tokens, 1024);
  const int64_t kv = int64_t{128} * 1024 * 24 * 2 * 2 * 64 * 4;
  EXPECT_EQ(kv, int64_t{3} << 30);
  ASSERT_EQ(estimate.rollout_worker.terms.size(), 2u);
  EXPECT_EQ(estimate.rollout_worker.terms[0].bytes, Qwen05().ParameterCount() * 2 * 4);
  // The prefill's logits of every prompt position (128 x 256 x 151,936 x 4 B
  // = 18.5 GiB) dominate: generation.cc computes them all and keeps the last.
  EXPECT_EQ(estimate.rollout_worker.terms[1].bytes, GenerationBatchBytes(Qwen05(), 128, 256, 1024));
  EXPECT_EQ(estimate.rollout_worker.batch_bytes, estimate.rollout_worker.terms[1].bytes);
  EXPECT_EQ(estimate.trainer.batch_bytes, estimate.trainer.terms.back().bytes);
  EXPECT_GT(estimate.rollout_worker.terms[1].bytes, kv + (int64_t{18} << 30));
  // The trainer holds 4 x 4 B per parameter plus 4 published versions.
  EXPECT_GE(estimate.trainer.bytes, Qwen05().ParameterCount() * 32);
  // The buffer: (2 + 1 + 1) x 16 groups of 8 x 1024 tokens.
  EXPECT_EQ(estimate.replay_buffer.bytes, 64 * StoredGroupBytes(8, 1024));
}

// weight_sync decides what the trainer's store and the workers hold: a
// bf16 store is half a float32 one, plus deltas (at most half of it), plus
// the trainer's float32 copy of the last version; with deltas each worker
// keeps the version it holds as it came.
TEST(RunMemoryTest, WeightSyncSetsTheStoreAndTheHeldVersion) {
  auto term = [](const ServiceMemoryEstimate& e, const std::string& what) -> int64_t {
    for (const auto& t : e.terms) {
      if (t.what == what) return t.bytes;
    }
    return -1;
  };
  const int64_t params = Qwen05().ParameterCount();
  v1::RunSpec spec = Spec(8, 16);
  RunMemoryEstimate f32 = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_EQ(term(f32.trainer, "published versions"), params * 4 * 4);
  EXPECT_EQ(term(f32.trainer, "version deltas"), -1);
  EXPECT_EQ(term(f32.trainer, "float32 copy of the last version"), -1);
  EXPECT_EQ(term(f32.rollout_worker, "held version"), -1);

  spec.mutable_weight_sync()->set_dtype(v1::DTYPE_BFLOAT16);  // deltas on by default
  RunMemoryEstimate bf16 = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_EQ(term(bf16.trainer, "published versions"), params * 4 * 2);
  EXPECT_EQ(term(bf16.trainer, "version deltas"), params * 4);
  EXPECT_EQ(term(bf16.trainer, "float32 copy of the last version"), params * 4);
  EXPECT_EQ(term(bf16.rollout_worker, "held version"), params * 2);
  EXPECT_EQ(bf16.rollout_worker.bytes, f32.rollout_worker.bytes + params * 2);

  spec.mutable_weight_sync()->set_delta(false);
  RunMemoryEstimate plain = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_EQ(term(plain.trainer, "version deltas"), -1);
  EXPECT_EQ(term(plain.rollout_worker, "held version"), -1);
  EXPECT_EQ(plain.trainer.bytes, f32.trainer.bytes - params * 4 * 2 + params * 4);
}

// The buffer checks a new table with the replay buffer's term alone, from
// what ConfigureRun carries: it must agree with the controller's estimate.
TEST(RunMemoryTest, ReplayBufferTermFromTheTableConfigIsTheRunEstimates) {
  v1::RunSpec spec = Spec(8, 16);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(768);
  spec.mutable_buffer()->set_max_times_sampled(2);
  const RunMemoryEstimate estimate = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_EQ(estimate.max_prompt_tokens, 256);
  const ServiceMemoryEstimate table = EstimateReplayBufferMemory(
      16, 2, 8, spec.buffer(), estimate.sequence_tokens);
  EXPECT_EQ(table.bytes, estimate.replay_buffer.bytes);
  EXPECT_EQ(table.bytes, (2 + 1 + 2) * 16 * StoredGroupBytes(8, 1024));
  EXPECT_EQ(table.fields, estimate.replay_buffer.fields);
  spec.mutable_buffer()->set_capacity_groups(10);
  EXPECT_EQ(EstimateReplayBufferMemory(16, 2, 8, spec.buffer(), 1024).bytes,
            10 * StoredGroupBytes(8, 1024));
  EXPECT_EQ(EstimateRunMemory(spec, Qwen05(), -1).max_prompt_tokens, 0);  // unknown
}

// The buffer keeps each trained batch until a checkpoint covers it: up to
// checkpoint.every_n_steps batches (one more when minibatches may put a
// checkpoint inside a batch); none beyond the one in training without
// periodic checkpoints. The buffer's own check at ConfigureRun agrees.
TEST(RunMemoryTest, BatchesKeptUntilCheckpointedAreCounted) {
  v1::RunSpec spec = Spec(8, 16);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(768);
  EXPECT_EQ(RetainedStepBatches(spec), 0);
  const int64_t without = EstimateRunMemory(spec, Qwen05(), 256).replay_buffer.bytes;
  spec.mutable_checkpoint()->set_every_n_steps(10);
  EXPECT_EQ(RetainedStepBatches(spec), 0);  // no checkpoint.dir: nothing to resume from
  spec.mutable_checkpoint()->set_dir("/ckpt");
  EXPECT_EQ(RetainedStepBatches(spec), 10);
  const RunMemoryEstimate estimate = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_EQ(estimate.replay_buffer.bytes - without, 10 * 16 * StoredGroupBytes(8, 1024));
  EXPECT_EQ(estimate.replay_buffer.fields[1], "checkpoint.every_n_steps");
  EXPECT_EQ(EstimateReplayBufferMemory(16, 2, 8, spec.buffer(), estimate.sequence_tokens, "",
                                       RetainedStepBatches(spec))
                .bytes,
            estimate.replay_buffer.bytes);
  spec.mutable_algorithm()->set_minibatches_per_batch(4);
  EXPECT_EQ(RetainedStepBatches(spec), 4);  // ceil(10 / 4) + 1
  EXPECT_THAT(CheckMemoryBudget("replay buffer", estimate.replay_buffer, {1 << 20, "a buffer"}),
              ::testing::HasSubstr("trained batches kept until checkpointed"));
}

TEST(RunMemoryTest, AbsurdSpecsSaturateInsteadOfOverflowing) {
  const v1::RunSpec spec = Spec(1000000000, std::numeric_limits<int32_t>::max());
  const RunMemoryEstimate estimate = EstimateRunMemory(spec, Qwen05(), -1);
  EXPECT_EQ(estimate.rollout_worker.bytes, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(estimate.replay_buffer.bytes, std::numeric_limits<int64_t>::max());
  EXPECT_GT(estimate.trainer.bytes, int64_t{1} << 50);
  const std::string line =
      CheckMemoryBudget("rollout worker", estimate.rollout_worker,
                        {int64_t{16} << 30, "--memory-budget of the rollout worker at w:1"});
  EXPECT_THAT(line, AllOf(HasSubstr("rollout worker: the run needs about more than 8 EiB"),
                          HasSubstr("16.0 GiB budget of --memory-budget of the rollout worker"),
                          HasSubstr("algorithm.group_size"),
                          HasSubstr("x 1,000,000,000)")));
}

TEST(RunMemoryTest, CheckNamesTheLargestTermFirstAndPassesWhatFits) {
  v1::RunSpec spec = Spec(8, 16);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(768);
  const RunMemoryEstimate estimate = EstimateRunMemory(spec, Qwen05(), 256);
  EXPECT_THAT(CheckMemoryBudget("rollout worker", estimate.rollout_worker, {int64_t{64} << 30, "x"}),
              IsEmpty());
  EXPECT_THAT(CheckMemoryBudget("rollout worker", estimate.rollout_worker, {0, "unknown"}),
              IsEmpty());
  const std::string line =
      CheckMemoryBudget("rollout worker", estimate.rollout_worker, {int64_t{2} << 30, "w"});
  EXPECT_THAT(line, HasSubstr("(generation batch 2"));
  EXPECT_THAT(line, HasSubstr("lower algorithm.batch_size_groups (or set "
                              "rollout.max_concurrent_groups_per_worker), algorithm.group_size"));
}

TEST(RunMemoryTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(900), "900 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.0 GiB");
}

TEST(RunMemoryTest, ParseMemorySize) {
  EXPECT_EQ(*ParseMemorySize("17179869184"), int64_t{16} << 30);
  EXPECT_EQ(*ParseMemorySize("16GiB"), int64_t{16} << 30);
  EXPECT_EQ(*ParseMemorySize("16G"), int64_t{16} << 30);
  EXPECT_EQ(*ParseMemorySize("512 MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseMemorySize("1.5g"), int64_t{3} << 29);
  EXPECT_EQ(*ParseMemorySize("64k"), 65536);
  for (const char* bad : {"", "abc", "-1", "0", "12 parsecs", "1e30", "0%", "101%", "GiB"}) {
    EXPECT_FALSE(ParseMemorySize(bad).ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseMemorySize("12 parsecs").status().message()),
              HasSubstr("unknown unit 'parsecs'"));
  const std::optional<int64_t> machine = MachineMemoryBytes();
  ASSERT_TRUE(machine.has_value());
  EXPECT_GT(*machine, int64_t{256} << 20);
  const absl::StatusOr<int64_t> half = ParseMemorySize("50%");
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_NEAR(static_cast<double>(*half), static_cast<double>(*machine) / 2, 1.0);
}

}  // namespace
}  // namespace sluice::run
