#include "trainer/ranks/trainer_group.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/ranks/sharded_adamw.h"

namespace sluice::trainer::ranks {
namespace {

using ::testing::HasSubstr;

// A port nobody listens on now (bound, read, closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

RankConfig Config(int rank, int world, int port, absl::Duration timeout = absl::Seconds(30)) {
  RankConfig config;
  config.rank = rank;
  config.world_size = world;
  config.host = "127.0.0.1";
  config.port = port;
  config.timeout = timeout;
  return config;
}

// Runs `body(group)` on `world` ranks, one thread each, over loopback.
void OnRanks(int world, const std::function<void(TrainerGroup&)>& body) {
  const int port = FreePort();
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<TrainerGroup>> group =
          TrainerGroup::Join(world == 1 ? RankConfig() : Config(r, world, port));
      ASSERT_TRUE(group.ok()) << group.status();
      body(**group);
    });
  }
  for (std::thread& rank : ranks) rank.join();
}

TEST(TrainerGroupTest, AllReduceSumsEveryTensorAcrossBucketsAndBroadcastCopiesTheRoots) {
  for (const int world : {1, 2, 3}) {
    OnRanks(world, [world](TrainerGroup& group) {
      // Three tensors over buckets of 40 bytes: two buckets.
      std::vector<at::Tensor> tensors = {torch::full({4}, float(group.rank() + 1)),
                                         torch::full({2, 3}, float(10 * (group.rank() + 1))),
                                         torch::full({1}, 1.0f)};
      ASSERT_TRUE(group.AllReduceSum(tensors, /*bucket_bytes=*/40).ok());
      const float ranks_sum = world * (world + 1) / 2.0f;
      EXPECT_TRUE(torch::allclose(tensors[0], torch::full({4}, ranks_sum)));
      EXPECT_TRUE(torch::allclose(tensors[1], torch::full({2, 3}, 10 * ranks_sum)));
      EXPECT_TRUE(torch::allclose(tensors[2], torch::full({1}, float(world))));

      std::vector<at::Tensor> mine = {torch::full({3}, float(group.rank())),
                                      torch::full({2}, float(-group.rank()))};
      ASSERT_TRUE(group.Broadcast(mine, world - 1).ok());
      EXPECT_TRUE(torch::allclose(mine[0], torch::full({3}, float(world - 1))));
      EXPECT_TRUE(torch::allclose(mine[1], torch::full({2}, float(1 - world))));

      at::Tensor all = torch::zeros({2 * world});
      ASSERT_TRUE(group.AllGather(torch::full({2}, float(group.rank())), all).ok());
      for (int r = 0; r < world; ++r) EXPECT_EQ(all[2 * r].item<float>(), float(r));
    });
  }
}

// A fake batch: 12 samples of unequal weight (their "tokens"), a small MLP.
struct FakeBatch {
  torch::Tensor x = torch::randn({12, 6}, torch::TensorOptions().dtype(torch::kFloat32));
  torch::Tensor y = torch::randn({12, 3});
  torch::Tensor weight = torch::arange(1, 13, torch::kFloat32);
};

// The same initial weights on every rank: the ranks are threads sharing
// LibTorch's global generator, so one draws at a time.
torch::nn::Sequential Model() {
  static std::mutex* draw = new std::mutex;
  std::lock_guard<std::mutex> lock(*draw);
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 3));
}

// The batch's loss restricted to samples [begin, end): their weighted
// squared error over the whole batch's weight, so that the shares of the
// ranks add up to the batch's loss.
torch::Tensor ShareOfLoss(torch::nn::Sequential& model, const FakeBatch& batch, int64_t begin,
                          int64_t end) {
  const torch::Tensor error =
      (model->forward(batch.x.slice(0, begin, end)) - batch.y.slice(0, begin, end)).pow(2).sum(1);
  return (error * batch.weight.slice(0, begin, end)).sum() / batch.weight.sum();
}

std::vector<torch::Tensor> Flat(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : model->parameters()) values.push_back(p.detach().clone());
  return values;
}

constexpr int kSteps = 4;
constexpr double kClip = 0.5;

// One rank, LibTorch's AdamW and clipping, on the whole batch.
std::vector<torch::Tensor> TrainAlone(const FakeBatch& batch) {
  torch::nn::Sequential model = Model();
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    ShareOfLoss(model, batch, 0, 12).backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
    optimizer.step();
  }
  return Flat(model);
}

// The largest difference between two sets of parameters.
double MaxDifference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

// N ranks, each on its share of the batch's samples (split as groups are),
// optionally in two micro-batches each, with the gradients summed after
// backward or during it, give the weights one rank gives on the whole
// batch. Measured: differences below 1e-6 (float32 reduction
// order); the bound asserted is 1e-5.
TEST(ShardedAdamWTest, RanksOnSharesOfABatchGiveTheWeightsOfOneRankOnAllOfIt) {
  torch::manual_seed(3);
  const FakeBatch batch;
  const std::vector<torch::Tensor> alone = TrainAlone(batch);
  for (const int world : {1, 2, 4}) {
    for (const int micro_batches : {1, 2}) {
      for (const bool in_backward : {false, true}) {
        std::vector<std::vector<torch::Tensor>> results(world);
        std::vector<int64_t> state_bytes(world);
        OnRanks(world, [&](TrainerGroup& group) {
          torch::nn::Sequential model = Model();
          ShardedAdamWOptions options;
          options.lr = 1e-2;
          options.weight_decay = 0.1;
          options.max_grad_norm = kClip;
          options.bucket_bytes = 256;  // Several buckets.
          ShardedAdamW optimizer(model->parameters(), options, group);
          const int64_t share = 12 / world;
          const int64_t begin = share * group.rank();
          for (int step = 0; step < kSteps; ++step) {
            optimizer.ZeroGrad();
            for (int m = 0; m < micro_batches; ++m) {
              if (in_backward && m == micro_batches - 1) optimizer.ReduceDuringNextBackward();
              ShareOfLoss(model, batch, begin + share * m / micro_batches,
                          begin + share * (m + 1) / micro_batches)
                  .backward();
            }
            ASSERT_TRUE(optimizer.Step().ok());
          }
          results[group.rank()] = Flat(model);
          state_bytes[group.rank()] = optimizer.state_bytes();
        });
        for (int r = 0; r < world; ++r) {
          const double difference = MaxDifference(results[r], alone);
          RecordProperty(absl::StrCat("max_difference_", world, "_ranks_", micro_batches, "_micro",
                                      in_backward ? "_in_backward" : ""),
                         absl::StrCat(difference));
          EXPECT_LT(difference, 1e-5)
              << world << " ranks, " << micro_batches << " micro-batches, rank " << r
              << (in_backward ? ", reduced during backward" : "");
        }
        // Each rank holds about 1/N of the optimizer state.
        int64_t parameters = 0;
        for (const torch::Tensor& p : alone) parameters += p.numel();
        const double one_rank_bytes = 3.0 * parameters * sizeof(float);
        EXPECT_LE(state_bytes[0], one_rank_bytes / world + 3 * sizeof(float) * world) << world;
      }
    }
  }
}

// A fresh directory under the test's temporary directory.
std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") /
                                    absl::StrCat("sluice_ranks_", getpid(), "_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Trains `steps` steps on `world` ranks from `start` weights (or the
// model's own) and, when `load` is set, the optimizer state in it; saves
// the shards to `save` when set. Returns rank 0's weights.
std::vector<torch::Tensor> TrainRanks(int world, int steps, const FakeBatch& batch,
                                      const std::vector<torch::Tensor>* start,
                                      const std::string& load, const std::string& save,
                                      absl::Status* load_status = nullptr) {
  std::vector<std::vector<torch::Tensor>> results(world);
  OnRanks(world, [&](TrainerGroup& group) {
    torch::nn::Sequential model = Model();
    if (start != nullptr) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < start->size(); ++i) model->parameters()[i].copy_((*start)[i]);
    }
    ShardedAdamWOptions options;
    options.lr = 1e-2;
    options.weight_decay = 0.1;
    options.max_grad_norm = kClip;
    ShardedAdamW optimizer(model->parameters(), options, group);
    if (!load.empty()) {
      absl::Status loaded = optimizer.LoadShards(load);
      if (group.rank() == 0 && load_status != nullptr) *load_status = loaded;
      if (!loaded.ok()) return;
    }
    const int64_t share = 12 / world;
    for (int step = 0; step < steps; ++step) {
      optimizer.ZeroGrad();
      ShareOfLoss(model, batch, share * group.rank(), share * (group.rank() + 1)).backward();
      ASSERT_TRUE(optimizer.Step().ok());
    }
    if (!save.empty()) {
      ASSERT_TRUE(optimizer.SaveShard(save).ok());
    }
    results[group.rank()] = Flat(model);
  });
  return results[0];
}

// A checkpoint of the optimizer's shards resumes at the world size that
// wrote it and, resharded, at another: 2 steps, a checkpoint, 2 more give
// the weights of 4 steps straight.
TEST(ShardedAdamWTest, ShardsResumeAtTheSameWorldSizeAndReshardToAnother) {
  torch::manual_seed(3);
  const FakeBatch batch;
  const std::vector<torch::Tensor> straight = TrainRanks(2, 4, batch, nullptr, "", "");
  const std::string dir = TempDir("shards");
  const std::vector<torch::Tensor> half = TrainRanks(2, 2, batch, nullptr, "", dir);
  EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer-rank-0-of-2.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer-rank-1-of-2.safetensors"));
  for (const int world : {2, 1, 4, 3}) {
    const std::vector<torch::Tensor> resumed = TrainRanks(world, 2, batch, &half, dir, "");
    EXPECT_LT(MaxDifference(resumed, straight), 1e-5) << "resumed on " << world << " ranks";
  }

  // A shard missing, or the state of another model, is refused naming it.
  std::filesystem::remove(dir + "/optimizer-rank-1-of-2.safetensors");
  absl::Status status;
  TrainRanks(1, 0, batch, &half, dir, "", &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("lacks rank 1's shard"));
  const std::string other = TempDir("other_model");
  {
    torch::nn::Sequential small(torch::nn::Linear(2, 2));
    OnRanks(1, [&](TrainerGroup& group) {
      ShardedAdamW optimizer(small->parameters(), ShardedAdamWOptions(), group);
      ASSERT_TRUE(optimizer.SaveShard(other).ok());
    });
  }
  TrainRanks(1, 0, batch, &half, other, "", &status);
  EXPECT_THAT(status.message(), HasSubstr("a model of 6 parameters; this model has"));
  TrainRanks(1, 0, batch, &half, TempDir("empty"), "", &status);
  EXPECT_THAT(status.message(), HasSubstr("no optimizer shards"));
}

TEST(TrainerGroupTest, ARankThatDisagreesOnTheWorldSizeIsRefusedNamingBoth) {
  const int port = FreePort();
  std::thread rank0([&] {
    // Rank 0 of two waits for a rank 1 that never comes right; it gives up.
    absl::StatusOr<std::unique_ptr<TrainerGroup>> group =
        TrainerGroup::Join(Config(0, 2, port, absl::Seconds(3)));
    EXPECT_FALSE(group.ok());
  });
  absl::StatusOr<std::unique_ptr<TrainerGroup>> wrong =
      TrainerGroup::Join(Config(1, 3, port, absl::Seconds(3)));
  rank0.join();
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_THAT(wrong.status().message(), HasSubstr("--world-size 3 but rank 0"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("with 2"));
}

TEST(TrainerGroupTest, ASecondProcessWithATakenRankIsRefused) {
  const int port = FreePort();
  std::vector<std::unique_ptr<TrainerGroup>> joined(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<TrainerGroup>> group = TrainerGroup::Join(Config(r, 2, port));
      ASSERT_TRUE(group.ok()) << group.status();
      joined[r] = *std::move(group);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  absl::StatusOr<std::unique_ptr<TrainerGroup>> again =
      TrainerGroup::Join(Config(1, 2, port, absl::Seconds(5)));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("rank 1 of the trainer group at"));
  EXPECT_THAT(again.status().message(), HasSubstr("is already taken"));
}

TEST(TrainerGroupTest, ARendezvousNobodyServesFailsWithinTheTimeout) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TrainerGroup>> group =
      TrainerGroup::Join(Config(1, 2, FreePort(), absl::Seconds(2)));
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kUnavailable) << group.status();
  EXPECT_THAT(group.status().message(), HasSubstr("cannot reach the trainer group's rendezvous"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// A rank that stops taking part (died, stopped) fails the others' next
// collective within the group's timeout, naming it.
TEST(TrainerGroupTest, ARankThatStopsTakingPartFailsTheOthersCollectiveWithinTheTimeout) {
  const int port = FreePort();
  absl::Status rank0_result;
  std::unique_ptr<TrainerGroup> rank1;
  std::thread rank0([&] {
    absl::StatusOr<std::unique_ptr<TrainerGroup>> group =
        TrainerGroup::Join(Config(0, 2, port, absl::Seconds(2)));
    ASSERT_TRUE(group.ok()) << group.status();
    std::vector<at::Tensor> grads = {torch::ones({8})};
    rank0_result = (*group)->AllReduceSum(grads);
  });
  absl::StatusOr<std::unique_ptr<TrainerGroup>> group =
      TrainerGroup::Join(Config(1, 2, port, absl::Seconds(2)));
  ASSERT_TRUE(group.ok()) << group.status();
  rank1 = *std::move(group);  // Joined, then never reduces.
  rank0.join();
  EXPECT_EQ(rank0_result.code(), absl::StatusCode::kUnavailable) << rank0_result;
  EXPECT_THAT(rank0_result.message(), HasSubstr("an all-reduce of the trainer group failed"));
}

}  // namespace
}  // namespace sluice::trainer::ranks
