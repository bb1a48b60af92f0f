// The services on separate hosts: six network namespaces (tests/netns.h)
// joined by a bridge, each with its own IPv4 address and its own directory,
// every service listening on its host's address (the controller on all of
// them) at its default port and advertising that address:
//
//   controller   sluice-controller     runs dir (the run's record)
//   buffer       sluice-replay-buffer  data dir (WAL and snapshots)
//   reward       sluice-reward-server
//   trainer      sluice-trainer        checkpoint dir (spec.checkpoint.dir)
//   worker-a     sluice-rollout-worker
//   worker-b     sluice-rollout-worker
//
// Nothing assumes loopback: a service that advertised 127.0.0.1 would be
// unreachable from every other host, and no host has a route anywhere but
// the test network. The controller listens on 0.0.0.0 with
// --advertise-address, as in a container; the rollout workers lease prompts
// and the trainer reports at the address it advertises.
//
// Nothing shares a file system either: each service is given only paths
// under its own host's directory (also its working directory and TMPDIR).
// The builtin model needs no files; in a deployment the volumes shared
// between hosts would be the Hugging Face model directory
// (spec.model.hf_model_dir: read by the controller, the trainer and every
// rollout worker at the same path) and, for a trainer that may be restarted
// on another host, its checkpoint directory (docs/multi-host.md).
//
// Mid-run, worker-a's host is cut off at the switch (its port taken down,
// so packets are dropped without a reset, as in a real partition) for
// longer than the controller's worker TTL: the controller declares it lost
// and gives its prompts to worker-b, and the run goes on. Then the link is
// healed: the same worker process heartbeats again, is re-admitted,
// generates new groups, and the run reaches SUCCEEDED with the loss
// counted in summary.json.
//
// Skipped only where network namespaces cannot be made (not root, no
// iproute2, `ip netns add` refused as in a container without
// CAP_SYS_ADMIN); SLUICE_REQUIRE_NETNS=1 makes that a failure instead.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "tests/netns.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

// Long enough that the partition, the heal and worker-a's first new groups
// (5-10 s: 100-320 steps on the loaded 2-core development machine, more on
// a faster one) fall well inside the run.
constexpr int64_t kSteps = 1500;
constexpr int kBatchGroups = 4;
constexpr int kEta = 4;
constexpr int64_t kWorkerTtlMs = 3000;

v1::RunSpec Spec(const std::string& checkpoint_dir) {
  v1::RunSpec spec;
  spec.set_name("multi-host");
  spec.set_seed(11);
  spec.mutable_model()->set_builtin("tiny");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(400);
  spec.mutable_task()->set_eval_split_size(20);
  spec.mutable_warm_start()->set_sft_steps(20);
  spec.mutable_warm_start()->set_batch_size(32);
  auto* alg = spec.mutable_algorithm();
  alg->set_group_size(4);
  alg->set_batch_size_groups(kBatchGroups);
  alg->set_max_staleness(kEta);
  alg->set_total_steps(kSteps);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(4);
  spec.mutable_rollout()->set_max_concurrent_groups_per_worker(4);
  spec.mutable_eval()->set_every_n_steps(1000);
  spec.mutable_checkpoint()->set_dir(checkpoint_dir);
  spec.mutable_checkpoint()->set_every_n_steps(500);
  spec.mutable_checkpoint()->set_keep_last(1);
  return spec;
}

struct Service {
  std::string host;
  std::string grpc;  // As its ready line reports it: the address others dial.
  std::string metrics;  // Its /metrics URL, from its ready line.
  std::string log_path;
  std::unique_ptr<Subprocess> process;
};

// What the controller knows of one worker (ListWorkers), for one run.
struct WorkerView {
  bool found = false;
  bool live = false;
  uint64_t incarnation = 0;
  int64_t restarts = 0;
  std::string address;
  int64_t groups_inserted = 0;
  int32_t groups_in_flight = 0;
  int64_t policy_version = 0;
};

class MultiHostProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::TestNetwork>> network = testing::TestNetwork::Create(
        {"controller", "buffer", "reward", "trainer", "worker-a", "worker-b"});
    if (absl::IsFailedPrecondition(network.status()) &&
        std::getenv("SLUICE_REQUIRE_NETNS") == nullptr) {
      GTEST_SKIP() << "network namespaces cannot be made here, so the services cannot be put "
                      "on separate hosts: "
                   << network.status();
    }
    ASSERT_TRUE(network.ok()) << network.status();
    network_ = std::move(*network);
    dir_ = testing::MakeTempDir("multi-host");

    // Started in dependency order; each reports ready only once serving.
    Start("reward", "sluice-reward-server", 50053, {"--workers=1"});
    Start("buffer", "sluice-replay-buffer", 50054, {"--data-dir=" + HostDir("buffer") + "/data"});
    Start("trainer", "sluice-trainer", 50055, {"--torch-threads=1"});
    if (HasFatalFailure()) return;
    // Each service's default path root is its host's directory, where it
    // runs; the controller confines the spec's paths too, and they name
    // another host's (the trainer's checkpoints): it gets every host's.
    Start("controller", "sluice-controller", 50051,
          {"--runs-dir=" + HostDir("controller") + "/runs", "--allowed-path-roots=" + dir_,
           "--trainer-address=" + services_["trainer"].grpc,
           "--replay-buffer-address=" + services_["buffer"].grpc,
           "--reward-server-address=" + services_["reward"].grpc,
           "--worker-heartbeat-interval-ms=500", absl::StrCat("--worker-ttl-ms=", kWorkerTtlMs)},
          /*wildcard=*/true);
    if (HasFatalFailure()) return;
    for (const std::string worker : {"worker-a", "worker-b"}) {
      Start(worker, "sluice-rollout-worker", 50052,
            {"--controller-address=" + services_["controller"].grpc, "--worker-id=" + worker,
             "--torch-threads=1"});
    }
    controller_ = v1::ControllerService::NewStub(
        grpc::CreateChannel(services_["controller"].grpc, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    // Workers first (they leave), the controller, then what they called.
    for (const std::string name :
         {"worker-a", "worker-b", "controller", "trainer", "buffer", "reward"}) {
      auto it = services_.find(name);
      if (it == services_.end() || it->second.process == nullptr) continue;
      const ExitStatus exit = it->second.process->Stop(absl::Seconds(30));
      EXPECT_FALSE(exit.signaled && exit.signal == SIGKILL)
          << name << " did not stop on SIGTERM within 30s";
    }
    services_.clear();
    network_.reset();  // Removes the namespaces, also after a failure.
  }

  std::string HostDir(const std::string& host) { return dir_ + "/hosts/" + host; }

  // Runs `binary` on `host`, listening on the host's address at `port` (on
  // every address of the host with `wildcard`, as in a container; then it
  // must be told what to advertise), with the host's directory as its
  // working directory and TMPDIR.
  void Start(const std::string& host, const std::string& binary, int port,
             std::vector<std::string> flags, bool wildcard = false) {
    const std::string home = HostDir(host);
    fs::create_directories(home + "/tmp");
    const std::string address = absl::StrCat(network_->Address(host), ":", port);
    if (wildcard) flags.push_back("--advertise-address=" + address);
    std::vector<std::string> argv = {
        "env", "--chdir=" + home, testing::BinDir() + "/" + binary,
        absl::StrCat("--listen-address=", wildcard ? "0.0.0.0" : network_->Address(host), ":",
                     port),
        absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    SubprocessOptions options;
    options.argv = network_->ExecArgv(host, argv);
    options.env = {{"TMPDIR", home + "/tmp"}, {"OPENBLAS_NUM_THREADS", "1"}};
    options.log_path = home + "/" + binary + ".log";
    options.ready_pipe = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(options);
    ASSERT_TRUE(started.ok()) << host << ": " << started.status();
    Service& service = services_[host];
    service.host = host;
    service.log_path = options.log_path;
    service.process = std::move(*started);
    absl::StatusOr<std::string> ready = service.process->WaitReady(absl::Now() + absl::Minutes(1));
    ASSERT_TRUE(ready.ok()) << host << ": " << ready.status() << "\n"
                            << testing::ReadFile(options.log_path);
    const nlohmann::json info = nlohmann::json::parse(*ready);
    // Reachable by the other hosts at its own address, not loopback (the
    // ready line names an address to dial on the host itself).
    if (!wildcard) {
      ASSERT_EQ(info.value("grpc", ""), address) << *ready;
    }
    service.grpc = address;
    service.metrics = info.value("metrics", "");
    // `ip netns exec` and `env` exec: the pid we signal is the service's.
    ASSERT_EQ(info.value("pid", int64_t{0}), service.process->pid()) << *ready;
  }

  // The sum of the samples whose line starts with `prefix` on `host`'s /metrics.
  double MetricSum(const std::string& host, const std::string& prefix) {
    absl::StatusOr<std::string> text =
        runtime::HttpGet(services_[host].metrics, absl::Seconds(5));
    EXPECT_TRUE(text.ok()) << host << ": " << text.status();
    return text.ok() ? testing::MetricSum(*text, prefix) : 0;
  }

  WorkerView Worker(const std::string& worker_id, const std::string& run_id) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ListWorkersResponse response;
    const grpc::Status status =
        controller_->ListWorkers(&context, v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    WorkerView view;
    for (const v1::WorkerInfo& worker : response.workers()) {
      if (worker.worker_id() != worker_id) continue;
      view.found = true;
      view.live = worker.live();
      view.incarnation = worker.incarnation();
      view.restarts = worker.restarts();
      view.address = worker.address();
      for (const v1::RolloutRunStatus& run : worker.status().runs()) {
        if (run.run_id() != run_id) continue;
        view.groups_inserted = run.groups_inserted();
        view.groups_in_flight = run.groups_in_flight();
        view.policy_version = run.policy_version();
      }
    }
    return view;
  }

  v1::Run Await(const std::string& run_id, const std::function<bool(const v1::Run&)>& done,
                absl::Duration timeout) {
    return testing::AwaitRun(*controller_, run_id, done, timeout);
  }

  std::string Logs() {
    std::string logs;
    for (const auto& [host, service] : services_) {
      logs += absl::StrCat("--- ", host, " (", service.log_path, ") last 3000 bytes ---\n");
      const std::string text = testing::ReadFile(service.log_path);
      logs += text.size() > 3000 ? text.substr(text.size() - 3000) : text;
    }
    return logs;
  }

  std::unique_ptr<testing::TestNetwork> network_;
  std::string dir_;
  std::map<std::string, Service> services_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
};

TEST_F(MultiHostProcessTest, AWorkersHostIsPartitionedMidRunAndHealedAndTheRunSucceeds) {
  std::string run_id;
  {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = Spec(HostDir("trainer") + "/checkpoints");
    v1::SubmitRunResponse response;
    const grpc::Status status = controller_->SubmitRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    run_id = response.run().run_id();
  }
  const absl::Time started = absl::Now();

  // Into RL with both workers serving.
  v1::Run run = Await(
      run_id,
      [](const v1::Run& r) {
        return (r.progress().step() >= 20 && r.progress().workers_live() == 2) ||
               testing::RunEnded(r);
      },
      absl::Minutes(3));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_TRAINING") << run.error_message() << "\n"
                                                                  << Logs();
  ASSERT_EQ(run.progress().workers_live(), 2);
  for (const std::string worker : {"worker-a", "worker-b"}) {
    const WorkerView view = Worker(worker, run_id);
    EXPECT_TRUE(view.live) << worker;
    // It registered with its host's address.
    EXPECT_EQ(view.address, services_[worker].grpc) << worker;
  }
  const WorkerView before = Worker("worker-a", run_id);

  // Partition worker-a's host for longer than the worker TTL.
  const int64_t step_at_partition = run.progress().step();
  const int64_t lost_before = run.summary().recovery().workers_lost();
  ASSERT_TRUE(network_->Disconnect("worker-a").ok());
  const absl::Time partitioned_at = absl::Now();
  run = Await(
      run_id,
      [&](const v1::Run& r) {
        return (r.summary().recovery().workers_lost() > lost_before &&
                r.progress().workers_live() == 1) ||
               testing::RunEnded(r);
      },
      absl::Minutes(1));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_TRAINING") << run.error_message() << "\n"
                                                                  << Logs();
  ASSERT_GT(run.summary().recovery().workers_lost(), lost_before)
      << "worker-a was not declared lost";
  const double seconds_to_loss = absl::ToDoubleSeconds(absl::Now() - partitioned_at);
  EXPECT_FALSE(Worker("worker-a", run_id).live);
  EXPECT_TRUE(Worker("worker-b", run_id).live);
  // The run goes on with worker-b alone while worker-a is cut off.
  const int64_t step_at_loss = run.progress().step();
  run = Await(
      run_id,
      [&](const v1::Run& r) {
        return r.progress().step() >= step_at_loss + 5 || testing::RunEnded(r);
      },
      absl::Minutes(1));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_TRAINING")
      << "the run ended before worker-a could be healed; lengthen it\n"
      << run.error_message();
  ASSERT_GE(run.progress().step(), step_at_loss + 5) << "no progress without worker-a";
  EXPECT_FALSE(Worker("worker-a", run_id).live);  // Still cut off.

  // Heal: the same process heartbeats again and is re-admitted.
  const int64_t step_at_heal = run.progress().step();
  ASSERT_TRUE(network_->Reconnect("worker-a").ok());
  const absl::Time healed_at = absl::Now();
  run = Await(
      run_id,
      [](const v1::Run& r) { return r.progress().workers_live() == 2 || testing::RunEnded(r); },
      absl::Minutes(1));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_TRAINING")
      << "the run ended before worker-a rejoined; lengthen it\n"
      << run.error_message();
  ASSERT_EQ(run.progress().workers_live(), 2) << "worker-a did not rejoin\n" << Logs();
  const double seconds_to_rejoin = absl::ToDoubleSeconds(absl::Now() - healed_at);
  const int64_t step_at_rejoin = run.progress().step();
  const WorkerView rejoined = Worker("worker-a", run_id);
  EXPECT_TRUE(rejoined.live);
  EXPECT_EQ(rejoined.incarnation, before.incarnation) << "rejoined, not restarted";
  EXPECT_EQ(rejoined.restarts, 0);
  EXPECT_FALSE(services_["worker-a"].process->TryWait().has_value());

  // It generates for the run again: more groups inserted than it had in
  // flight when it rejoined, so some were started after the heal.
  const int64_t inserted_at_rejoin = rejoined.groups_inserted;
  const int64_t in_flight_at_rejoin = rejoined.groups_in_flight;
  WorkerView after;
  run = Await(
      run_id,
      [&](const v1::Run& r) {
        after = Worker("worker-a", run_id);
        return after.groups_inserted > inserted_at_rejoin + in_flight_at_rejoin ||
               testing::RunEnded(r);
      },
      absl::Minutes(2));
  EXPECT_GT(after.groups_inserted, inserted_at_rejoin + in_flight_at_rejoin)
      << "worker-a inserted " << inserted_at_rejoin << " groups before rejoining ("
      << in_flight_at_rejoin << " in flight then) and " << after.groups_inserted
      << " by the end of the run; " << run.error_message();
  // And it loads new weights from the trainer's host again.
  EXPECT_GT(after.policy_version, rejoined.policy_version);
  const int64_t step_generating = run.progress().step();

  run = Await(run_id, testing::RunEnded, absl::Minutes(5));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_SUCCEEDED") << run.error_message() << "\n"
                                                                   << Logs();
  std::printf(
      "multi-host: worker-a partitioned at step %ld, lost after %.1fs (TTL %.1fs) at step %ld, "
      "healed at step %ld, rejoined %.1fs later at step %ld, generating again by step %ld; groups "
      "inserted by worker-a: %ld before the partition, %ld at rejoin, %ld after; run of %ld steps "
      "took %.1fs\n",
      static_cast<long>(step_at_partition), seconds_to_loss, kWorkerTtlMs / 1000.0,
      static_cast<long>(step_at_loss), static_cast<long>(step_at_heal), seconds_to_rejoin,
      static_cast<long>(step_at_rejoin), static_cast<long>(step_generating),
      static_cast<long>(before.groups_inserted), static_cast<long>(inserted_at_rejoin),
      static_cast<long>(after.groups_inserted), static_cast<long>(kSteps),
      absl::ToDoubleSeconds(absl::Now() - started));

  // The run's record is on the controller's host.
  const std::string run_dir = HostDir("controller") + "/runs/" + run_id;
  const auto summary = nlohmann::json::parse(testing::ReadFile(run_dir + "/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), kSteps);
  EXPECT_EQ(summary["groups_trained"].get<int64_t>(), kSteps * kBatchGroups);
  EXPECT_LE(summary["max_observed_staleness"].get<int64_t>(), kEta);
  const auto& recovery = summary["recovery"];
  EXPECT_GE(recovery.value("workers_lost", int64_t{0}), 1) << summary;
  // Both at the start, and worker-a again after the heal.
  EXPECT_GE(recovery.value("workers_joined", int64_t{0}), 3) << summary;
  EXPECT_EQ(recovery["restarts"].value("rollout_worker", int64_t{0}), 0) << summary;

  // Weights crossed between the workers' hosts: the trainer sent versions
  // to one worker and placed the other under it (docs/weight-fanout.md),
  // and the partitioned worker's child moved to another source.
  EXPECT_GT(MetricSum("trainer", "sluice_trainer_weight_sources_total{source=\"relay\"}"), 0)
      << Logs();
  EXPECT_GT(MetricSum("worker-a", "sluice_weight_relay_bytes_sent_total") +
                MetricSum("worker-b", "sluice_weight_relay_bytes_sent_total"),
            0);

  // Each service wrote only under its own host's directory.
  bool checkpointed = false;
  for (const auto& entry : fs::directory_iterator(HostDir("trainer") + "/checkpoints")) {
    checkpointed |= entry.path().filename().string().rfind("step-", 0) == 0;
  }
  EXPECT_TRUE(checkpointed) << "no checkpoint in the trainer host's directory";
  EXPECT_FALSE(fs::is_empty(HostDir("buffer") + "/data"));
}

}  // namespace
}  // namespace sluice
