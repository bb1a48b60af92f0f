// bench_trainer_scaling: what data-parallel trainer ranks buy on this
// machine. For each world size N it starts N ranks (this binary again, one
// process and one LibTorch thread each) that join one trainer group over
// loopback (trainer/ranks: c10d TCPStore + gloo) and train the same model on
// one global batch: each rank the forward and backward of its 1/N of the
// sequences, then ShardedAdamW's step (gradients summed over the ranks,
// AdamW on the rank's slice, slices gathered). Reported per world size: step
// seconds, tokens/s and its ratio to one rank in the same run, the
// collectives' seconds and GB/s against the loopback TCP limit measured in
// the same run (iperf3, one stream), the optimizer state per rank and the fraction of the
// gradients' reduction that ran while backward did (buckets summed as
// backward completes them, ShardedAdamW::ReduceDuringNextBackward): one
// extra step reduces after backward, which times the all-reduce alone, and
// the overlap is 1 - (what the measured steps waited for it after backward)
// / (that time).
//
//   bench_trainer_scaling [--ranks 1,2] [--json FILE] [--quick]
//                         [--batch SEQUENCES] [--seq TOKENS] [--steps N]
//
// Model: benchmarks/model_shapes.h's 56 M Qwen2 shape (--quick: a tiny one,
// for the smoke test).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmarks/iperf3.h"
#include "benchmarks/model_shapes.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/subprocess.h"
#include "common/torch_threads.h"
#include "nlohmann/json.hpp"
#include "trainer/ranks/rank_config.h"
#include "trainer/ranks/sharded_adamw.h"
#include "trainer/ranks/trainer_group.h"

namespace {

using nlohmann::json;
using sluice::trainer::ranks::RankConfig;
using sluice::trainer::ranks::ShardedAdamW;
using sluice::trainer::ranks::ShardedAdamWOptions;
using sluice::trainer::ranks::TrainerGroup;

struct Flags {
  std::string ranks = "1,2";
  std::string json_path;
  bool quick = false;
  // A minibatch of 16 sequences of 256 tokens (4,096 tokens a step).
  int batch = 16;
  int seq = 256;
  int steps = 3;
  // A rank's own invocation (set by the parent).
  int rank = -1;
  int world_size = 1;
  int port = 0;
  std::string out;
};

sluice::model::ModelConfig Shape(bool quick) {
  sluice::model::ModelConfig config = sluice::bench::MidSizeQwen2();
  if (quick) {
    config.vocab_size = 512;
    config.hidden_size = 64;
    config.intermediate_size = 128;
    config.num_hidden_layers = 2;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 16;
  }
  return config;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return 0;
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// One rank: joins the group, trains, writes its figures to flags.out.
int RunRank(const Flags& flags) {
  sluice::ConfigureTorchThreads(1);
  RankConfig config;
  config.rank = flags.rank;
  config.world_size = flags.world_size;
  config.host = "127.0.0.1";
  config.port = flags.port;
  config.timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<TrainerGroup>> group = TrainerGroup::Join(config);
  if (!group.ok()) {
    std::cerr << "bench_trainer_scaling: " << group.status() << "\n";
    return 1;
  }
  const sluice::model::ModelConfig shape = Shape(flags.quick);
  auto model = sluice::model::Transformer::Create(shape, /*seed=*/7);
  if (!model.ok()) {
    std::cerr << "bench_trainer_scaling: " << model.status() << "\n";
    return 1;
  }
  ShardedAdamWOptions options;
  options.lr = 1e-5;
  options.max_grad_norm = 1.0;
  ShardedAdamW optimizer((*model)->parameter_tensors(), options, **group);

  // The global batch: the same tokens on every rank (one seed); each rank
  // trains on its own sequences, its loss its share of the batch's mean.
  torch::manual_seed(11);
  const torch::Tensor tokens =
      torch::randint(0, shape.vocab_size, {flags.batch, flags.seq + 1}, torch::kLong);
  const int64_t share = flags.batch / flags.world_size;
  const torch::Tensor mine = tokens.slice(0, share * flags.rank, share * (flags.rank + 1));
  const double global_tokens = static_cast<double>(flags.batch) * flags.seq;

  double step_seconds = 0;
  double compute_seconds = 0;
  double reduce_seconds = 0;
  double gather_seconds = 0;
  int64_t comm_bytes = 0;
  // Step 0 warms up; steps 1..steps are measured, reducing during backward;
  // one more reduces after backward, which gives the collectives' own time
  // (what overlap hides is measured against it).
  double sync_reduce_seconds = 0;
  double sync_gather_seconds = 0;
  for (int step = 0; step <= flags.steps + 1; ++step) {
    const bool sync = step == flags.steps + 1;
    const absl::Time start = absl::Now();
    optimizer.ZeroGrad();
    const torch::Tensor logits = (*model)->Forward(mine.slice(1, 0, flags.seq));
    const torch::Tensor logp =
        sluice::model::TokenLogProbs(logits, mine.slice(1, 1, flags.seq + 1));
    if (!sync) optimizer.ReduceDuringNextBackward();
    (-logp.sum() / global_tokens).backward();
    const absl::Time computed = absl::Now();
    if (absl::Status stepped = optimizer.Step(); !stepped.ok()) {
      std::cerr << "bench_trainer_scaling: " << stepped << "\n";
      return 1;
    }
    if (sync) {
      sync_reduce_seconds = optimizer.last_step().reduce_seconds;
      sync_gather_seconds = optimizer.last_step().gather_seconds;
      comm_bytes = optimizer.last_step().reduced_bytes + optimizer.last_step().gathered_bytes;
      continue;
    }
    if (step == 0) continue;
    step_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    compute_seconds += absl::ToDoubleSeconds(computed - start);
    reduce_seconds += optimizer.last_step().reduce_seconds;
    gather_seconds += optimizer.last_step().gather_seconds;
  }
  const double steps = flags.steps;
  const bool alone = flags.world_size == 1;
  const double exposed = reduce_seconds / steps;
  const double comm_seconds = sync_reduce_seconds + sync_gather_seconds;
  const json figures = {
      {"ranks", flags.world_size},
      {"rank", flags.rank},
      {"step_seconds", step_seconds / steps},
      {"compute_seconds", compute_seconds / steps},
      {"allreduce_seconds", alone ? 0.0 : sync_reduce_seconds},
      {"allreduce_seconds_after_backward", alone ? 0.0 : exposed},
      {"allgather_seconds", alone ? 0.0 : gather_seconds / steps},
      {"comm_gbps", !alone && comm_seconds > 0 ? comm_bytes / comm_seconds / 1e9 : 0.0},
      {"tokens_per_s", step_seconds > 0 ? global_tokens * steps / step_seconds : 0.0},
      {"optimizer_state_bytes_per_rank", optimizer.state_bytes()},
      {"overlap_fraction", !alone && sync_reduce_seconds > 0
                               ? std::clamp(1 - exposed / sync_reduce_seconds, 0.0, 1.0)
                               : 0.0}};
  std::ofstream(flags.out) << figures.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app("bench_trainer_scaling: data-parallel trainer ranks, tokens/s per world size");
  app.add_option("--ranks", flags.ranks, "world sizes to measure, comma-separated");
  app.add_option("--json", flags.json_path, "write the figures here");
  app.add_flag("--quick", flags.quick, "a tiny model and batch (smoke test)");
  app.add_option("--batch", flags.batch, "sequences per global batch");
  app.add_option("--seq", flags.seq, "tokens per sequence");
  app.add_option("--steps", flags.steps, "measured steps (after one warm-up)");
  app.add_option("--rank", flags.rank)->group("");
  app.add_option("--world-size", flags.world_size)->group("");
  app.add_option("--port", flags.port)->group("");
  app.add_option("--out", flags.out)->group("");
  CLI11_PARSE(app, argc, argv);
  if (flags.quick) {
    flags.batch = 4;
    flags.seq = 16;
    flags.steps = 2;
  }
  if (flags.rank >= 0) return RunRank(flags);

  std::vector<int> world_sizes;
  for (absl::string_view part : absl::StrSplit(flags.ranks, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || flags.batch % n != 0) {
      std::cerr << "bench_trainer_scaling: --ranks " << flags.ranks
                << ": each must be >= 1 and divide --batch " << flags.batch << "\n";
      return 2;
    }
    world_sizes.push_back(n);
  }
  const absl::StatusOr<double> loopback =
      sluice::bench::Iperf3BytesPerSecond(1, absl::Seconds(flags.quick ? 1 : 2));
  if (!loopback.ok()) {
    std::cerr << "bench_trainer_scaling: " << loopback.status() << "\n";
    return 1;
  }
  const double loopback_gbps = *loopback / 1e9;
  std::printf("loopback TCP (iperf3, one stream): %.2f GB/s\n", loopback_gbps);
  std::printf("%6s %9s %11s %8s %9s %9s %8s %9s %13s\n", "ranks", "step s", "tokens/s", "x 1 rank",
              "reduce s", "exposed s", "overlap", "comm GB/s", "optim MB/rank");
  json runs = json::array();
  double one_rank_tokens_per_s = 0;
  const std::string self = "/proc/self/exe";
  char exe[4096] = {};
  const ssize_t exe_length = readlink(self.c_str(), exe, sizeof(exe) - 1);
  const std::string binary = exe_length > 0 ? std::string(exe, exe_length) : argv[0];
  for (const int world : world_sizes) {
    const int port = FreePort();
    std::vector<std::unique_ptr<sluice::Subprocess>> ranks;
    std::vector<std::string> outs;
    for (int r = 0; r < world; ++r) {
      sluice::SubprocessOptions spawn;
      outs.push_back(
          absl::StrCat("/tmp/bench_trainer_scaling.", getpid(), ".", world, ".", r, ".json"));
      spawn.argv = {binary,
                    absl::StrCat("--rank=", r),
                    absl::StrCat("--world-size=", world),
                    absl::StrCat("--port=", port),
                    absl::StrCat("--out=", outs.back()),
                    absl::StrCat("--batch=", flags.batch),
                    absl::StrCat("--seq=", flags.seq),
                    absl::StrCat("--steps=", flags.steps)};
      if (flags.quick) spawn.argv.push_back("--quick");
      spawn.env = {{"OPENBLAS_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}};
      absl::StatusOr<std::unique_ptr<sluice::Subprocess>> started =
          sluice::Subprocess::Start(spawn);
      if (!started.ok()) {
        std::cerr << "bench_trainer_scaling: " << started.status() << "\n";
        return 1;
      }
      ranks.push_back(*std::move(started));
    }
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<sluice::ExitStatus> exit = ranks[r]->Wait(absl::Now() + absl::Minutes(30));
      if (!exit.ok() || !exit->success()) {
        std::cerr << "bench_trainer_scaling: rank " << r << " of " << world << " failed"
                  << (exit.ok() ? ": " + exit->ToString() : "") << "\n";
        return 1;
      }
    }
    std::ifstream in(outs[0]);
    json figures = json::parse(in, nullptr, /*allow_exceptions=*/false);
    for (const std::string& out : outs) std::remove(out.c_str());
    if (!figures.is_object()) {
      std::cerr << "bench_trainer_scaling: rank 0 of " << world << " wrote no figures\n";
      return 1;
    }
    const double tokens_per_s = figures["tokens_per_s"].get<double>();
    if (world == 1) one_rank_tokens_per_s = tokens_per_s;
    const double ratio = one_rank_tokens_per_s > 0 ? tokens_per_s / one_rank_tokens_per_s : 0;
    figures["tokens_per_s_vs_one_rank"] = ratio;
    figures["comm_fraction_of_loopback"] =
        loopback_gbps > 0 ? figures["comm_gbps"].get<double>() / loopback_gbps : 0.0;
    figures.erase("rank");
    std::printf("%6d %9.3f %11.1f %8.2f %9.3f %9.3f %8.2f %9.2f %13.1f\n", world,
                figures["step_seconds"].get<double>(), tokens_per_s, ratio,
                figures["allreduce_seconds"].get<double>(),
                figures["allreduce_seconds_after_backward"].get<double>(),
                figures["overlap_fraction"].get<double>(), figures["comm_gbps"].get<double>(),
                figures["optimizer_state_bytes_per_rank"].get<double>() / 1e6);
    runs.push_back(figures);
  }
  const json report = {
      {"loopback_gbps", loopback_gbps},
      {"model", flags.quick ? "tiny" : "56M Qwen2 shape (benchmarks/model_shapes.h)"},
      {"batch_sequences", flags.batch},
      {"sequence_tokens", flags.seq},
      {"runs", runs}};
  if (!flags.json_path.empty()) std::ofstream(flags.json_path) << report.dump(2) << "\n";
  return 0;
}
