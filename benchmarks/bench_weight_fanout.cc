// bench_weight_fanout: how a weight version reaches N rollout workers.
//
//   bench_weight_fanout [--json FILE] [--version-mib 64] [--workers 1,2,4,8]
//                       [--repeats 3] [--quick]
//
// In one process on loopback: the real trainer service (TrainerServiceImpl,
// its StreamWeights and GetWeightSource over a WeightStore the bench
// publishes into) and N workers, each with the real WeightRelay service and
// RelayFetcher a rollout worker runs. Each worker waits for a new version
// (WatchVersions), downloads it and checks it (per-chunk CRC32C, per-tensor
// CRC and the version's checksum). Two ways, each with fresh workers:
//
//  - relay (Sluice): through the trainer's fan-out tree, root fanout 1 and
//    fanout 2 (the trainer's defaults);
//  - star (the baseline, the way before relays): every worker streams the
//    version from the trainer.
//
// For each N: the trainer's egress per version (its
// sluice_trainer_weight_bytes_sent_total) and the time from publishing to
// every worker holding the version (median of --repeats versions), against
// one loopback transfer of the version measured with iperf3 in the same run.
// Every worker here is a thread of one process, so on a machine with fewer
// cores than workers they share the CPUs that real workers would each have.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "benchmarks/iperf3.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "services/clients/clients.h"
#include "services/clients/grpc_clients.h"
#include "services/weights/relay_fetcher.h"
#include "services/weights/version_stream.h"
#include "services/weights/weight_relay_service.h"
#include "trainer/trainer_service.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr char kRun[] = "bench-fanout";

struct Flags {
  std::string json_path;
  int64_t version_mib = 64;
  std::string workers = "1,2,4,8";
  int repeats = 3;
  int64_t chunk_kib = 0;
  bool quick = false;
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// A version of `bytes` bytes in tensors of at most 16 MiB, as the trainer
// publishes one.
std::shared_ptr<trainer::PublishedVersion> MakeVersion(int64_t version, int64_t bytes) {
  auto v = std::make_shared<trainer::PublishedVersion>();
  for (int64_t left = bytes, t = 0; left > 0; ++t) {
    const int64_t n = std::min<int64_t>(left, 16 << 20);
    std::string data(static_cast<size_t>(n), '\0');
    for (int64_t i = 0; i < n; i += 64) data[static_cast<size_t>(i)] = static_cast<char>(version + t + i / 64);
    v1::TensorSpec spec;
    spec.set_name(absl::StrCat("layers.", t, ".weight"));
    spec.set_dtype(v1::DTYPE_FLOAT32);
    spec.add_shape(n / 4);
    spec.set_size_bytes(n);
    spec.set_crc32c(Crc32c(data));
    v->tensors.push_back(std::move(spec));
    v->bytes.push_back(std::move(data));
    left -= n;
  }
  v->info.set_run_id(kRun);
  v->info.set_version(version);
  v->info.set_total_size_bytes(bytes);
  v->info.set_tensor_count(static_cast<int32_t>(v->tensors.size()));
  v->info.set_checksum(weights::VersionChecksum(v->bytes));
  return v;
}

double CounterValue(prometheus::Registry& registry, const std::string& name) {
  double sum = 0;
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) sum += metric.counter.value;
  }
  return sum;
}

// One simulated worker: a relay server (relay mode) and a follower thread
// that downloads every new version and records when it holds it.
class Worker {
 public:
  // Follows versions newer than `after_version` (what earlier workers got).
  Worker(int index, const std::string& trainer_address, bool relay, int64_t after_version,
         int64_t chunk_size_bytes)
      : id_(absl::StrCat("worker-", index)), relay_(relay), after_version_(after_version) {
    trainer_ = clients::NewGrpcTrainerClient(trainer_address);
    if (relay_) {
      cache_ = std::make_shared<weights::RelayCache>();
      service_ = std::make_unique<weights::WeightRelayServiceImpl>(cache_, registry_);
      int port = 0;
      server_ = Serve(service_.get(), &port);
      weights::RelayFetcherOptions options;
      options.worker_id = id_;
      options.relay_address = absl::StrCat("127.0.0.1:", port);
      options.chunk_size_bytes = chunk_size_bytes;
      fetcher_ = std::make_unique<weights::RelayFetcher>(
          *trainer_,
          [trainer_address](const std::string& source) {
            return source.empty() ? clients::NewGrpcTrainerWeightSource(trainer_address)
                                  : clients::NewGrpcRelayWeightSource(source);
          },
          cache_, options);
    }
    thread_ = std::thread([this] { Follow(); });
  }

  ~Worker() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  // Blocks until this worker holds `version`; when it did, and any error.
  absl::StatusOr<absl::Time> WaitFor(int64_t version, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return have_ >= version; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(id_, " did not get version ", version,
                                                      " in time; last error: ", last_error_));
    }
    return done_at_;
  }

 private:
  void Follow() {
    int64_t have = after_version_;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
      }
      auto announced = trainer_->WaitForVersionAfter(kRun, have, absl::Milliseconds(200));
      if (!announced.ok()) continue;
      int64_t version = -1;
      absl::Status status;
      if (relay_) {
        auto fetched = fetcher_->FetchLatest(kRun);
        status = fetched.status();
        if (fetched.ok()) version = fetched->version;
      } else {
        auto fetched = trainer_->FetchWeights(kRun, -1);
        status = fetched.status();
        if (fetched.ok()) version = fetched->manifest.version().version();
      }
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        last_error_ = std::string(status.message());
        continue;
      }
      have = version;
      have_ = version;
      done_at_ = absl::Now();
    }
  }

  const std::string id_;
  const bool relay_;
  const int64_t after_version_;
  prometheus::Registry registry_;
  std::unique_ptr<clients::TrainerClient> trainer_;
  std::shared_ptr<weights::RelayCache> cache_;
  std::unique_ptr<weights::WeightRelayServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<weights::RelayFetcher> fetcher_;
  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t have_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time done_at_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

struct Trainer {
  prometheus::Registry registry;
  std::unique_ptr<trainer::TrainerServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  int64_t next_version = 0;

  Trainer() {
    service = std::make_unique<trainer::TrainerServiceImpl>(registry);
    int port = 0;
    server = Serve(service.get(), &port);
    address = absl::StrCat("127.0.0.1:", port);
    service->weight_store().Reset(kRun);
  }
  ~Trainer() {
    service->Shutdown();
    server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  double egress() { return CounterValue(registry, "sluice_trainer_weight_bytes_sent_total"); }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Publishes `repeats` versions to `n` fresh workers; the median time to all
// of them and the trainer's egress per version.
absl::StatusOr<json> Measure(Trainer& trainer, int n, bool relay, int64_t bytes, int repeats,
                             int64_t chunk_size_bytes) {
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < n; ++i) workers.push_back(std::make_unique<Worker>(i, trainer.address, relay, trainer.next_version - 1,
                                                     chunk_size_bytes));
  absl::SleepFor(absl::Milliseconds(300));  // every follower watching
  std::vector<double> seconds;
  double egress = 0;
  for (int r = 0; r < repeats; ++r) {
    auto version = MakeVersion(trainer.next_version++, bytes);
    const int64_t number = version->info.version();
    const double before = trainer.egress();
    const absl::Time published = absl::Now();
    trainer.service->weight_store().Publish(std::move(version));
    absl::Time last = published;
    for (auto& worker : workers) {
      auto done = worker->WaitFor(number, absl::Now() + absl::Minutes(2));
      if (!done.ok()) return done.status();
      last = std::max(last, *done);
    }
    seconds.push_back(absl::ToDoubleSeconds(last - published));
    egress += trainer.egress() - before;
  }
  const double per_version = egress / repeats;
  return json{{"workers", n},
              {"mode", relay ? "relay" : "star"},
              {"version_bytes", bytes},
              {"trainer_egress_bytes_per_version", per_version},
              {"trainer_egress_versions_per_version", per_version / static_cast<double>(bytes)},
              {"seconds_to_all_workers", Median(seconds)},
              {"seconds_each", seconds}};
}

int Main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_weight_fanout: trainer egress and time for a weight version to reach N "
               "workers, relayed against streamed from the trainer to each, and iperf3"};
  app.add_option("--json", flags.json_path, "write the figures as JSON to this file");
  app.add_option("--version-mib", flags.version_mib, "bytes of one weight version, in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", flags.workers, "worker counts, comma-separated")->capture_default_str();
  app.add_option("--repeats", flags.repeats, "versions published per worker count (median)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk-kib", flags.chunk_kib,
                 "chunk size asked of the trainer through relays, KiB (0 = its default, 1 MiB)")
      ->capture_default_str();
  app.add_flag("--quick", flags.quick, "4 MiB versions, 1 and 4 workers, 1 repeat (smoke test)");
  CLI11_PARSE(app, argc, argv);
  if (flags.quick) {
    flags.version_mib = 4;
    flags.workers = "1,4";
    flags.repeats = 1;
  }
  log::Init("bench_weight_fanout", log::Level::kWarning, log::Format::kText);
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(flags.workers, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::cerr << "--workers: '" << part << "' is not a positive count\n";
      return 2;
    }
    counts.push_back(n);
  }
  const int64_t bytes = flags.version_mib << 20;

  auto iperf = bench::Iperf3BytesPerSecond();
  if (!iperf.ok()) {
    std::cerr << "bench_weight_fanout: " << iperf.status().message() << "\n";
    return 1;
  }
  const double one_transfer = static_cast<double>(bytes) / *iperf;
  std::printf("iperf3 loopback: %.2f GB/s; one transfer of a %lld MiB version: %.3f s\n",
              *iperf / 1e9, static_cast<long long>(flags.version_mib), one_transfer);

  Trainer trainer;
  json runs = json::array();
  json baseline = json::array();
  std::printf("%8s %6s %14s %12s %16s %18s %14s\n", "workers", "mode", "egress/version",
              "to all (s)", "vs one transfer", "vs N at once", "relay speedup");
  for (int n : counts) {
    auto star = Measure(trainer, n, /*relay=*/false, bytes, flags.repeats, 0);
    auto relay = Measure(trainer, n, /*relay=*/true, bytes, flags.repeats,
                         flags.chunk_kib << 10);
    if (!star.ok() || !relay.ok()) {
      std::cerr << "bench_weight_fanout: "
                << (star.ok() ? relay.status() : star.status()).message() << "\n";
      return 1;
    }
    // The machine's floor for N copies at once: N parallel iperf3 streams
    // (on loopback every stream costs the same CPUs the workers share).
    auto parallel = n == 1 ? iperf : bench::Iperf3BytesPerSecond(n);
    if (!parallel.ok()) {
      std::cerr << "bench_weight_fanout: " << parallel.status().message() << "\n";
      return 1;
    }
    const double n_transfers = static_cast<double>(bytes) * n / *parallel;
    for (json* run : {&*star, &*relay}) {
      (*run)["vs_one_loopback_transfer"] = (*run)["seconds_to_all_workers"].get<double>() / one_transfer;
      (*run)["iperf3_parallel_bytes_per_s"] = *parallel;
      (*run)["seconds_n_loopback_transfers_at_once"] = n_transfers;
      (*run)["vs_n_loopback_transfers_at_once"] =
          (*run)["seconds_to_all_workers"].get<double>() / n_transfers;
    }
    const double speedup = (*star)["seconds_to_all_workers"].get<double>() /
                           (*relay)["seconds_to_all_workers"].get<double>();
    (*relay)["time_speedup_vs_star"] = speedup;
    (*relay)["egress_ratio_vs_star"] = (*relay)["trainer_egress_bytes_per_version"].get<double>() /
                                       (*star)["trainer_egress_bytes_per_version"].get<double>();
    for (const json* run : {&*star, &*relay}) {
      std::printf("%8d %6s %14.2f %12.3f %16.2f %18.2f %14s\n", n,
                  (*run)["mode"].get<std::string>().c_str(),
                  (*run)["trainer_egress_versions_per_version"].get<double>(),
                  (*run)["seconds_to_all_workers"].get<double>(),
                  (*run)["vs_one_loopback_transfer"].get<double>(),
                  (*run)["vs_n_loopback_transfers_at_once"].get<double>(),
                  run == &*relay ? absl::StrCat(speedup).substr(0, 5).c_str() : "");
    }
    baseline.push_back(*star);
    runs.push_back(*relay);
  }
  json out = {{"version_bytes", bytes},
              {"iperf3_bytes_per_s", *iperf},
              {"one_loopback_transfer_seconds", one_transfer},
              {"cpus", std::thread::hardware_concurrency()},
              {"relay_tree", {{"root_fanout", 1}, {"fanout", 2}}},
              {"runs", runs},
              {"baseline_runs", baseline}};
  if (!flags.json_path.empty()) {
    std::ofstream(flags.json_path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::Main(argc, argv); }
