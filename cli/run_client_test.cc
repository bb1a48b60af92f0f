// The run client against a real ControllerService on loopback, whose
// trainer, buffer and workers are fakes driven by the test.
#include "cli/run_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "controller/controller_service.h"
#include "controller/fake_service_clients.h"
#include "controller/worker_registry.h"

namespace sluice::cli {
namespace {

using ::testing::HasSubstr;
namespace fakes = controller::testing;

v1::RunSpec ValidSpec() {
  v1::RunSpec spec;
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic();
  spec.mutable_algorithm()->set_total_steps(2);
  return spec;
}

// A runs directory of the current test's own: ctest runs a fixture's tests
// side by side, and a controller restores every run in its directory.
std::string OwnRunsDir(absl::string_view prefix) {
  return absl::StrCat(::testing::TempDir(), "/", prefix, "-",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                      getpid());
}

class RunClientTest : public ::testing::Test {
 protected:
  RunClientTest() {
    controller::RunRegistryOptions options;
    options.runs_dir = OwnRunsDir("run-client-runs");
    options.driver.prompt_source = [](const v1::RunSpec&) {
      std::vector<v1::Prompt> prompts(4);
      for (size_t i = 0; i < prompts.size(); ++i) prompts[i].set_prompt_id(absl::StrCat(i));
      return prompts;
    };
    controller::ServiceClients clients;
    clients.trainer = trainer_;
    clients.replay_buffer = std::make_shared<fakes::FakeBuffer>();
    clients.workers = workers_;
    clients.reward_server_address = "reward:1";
    clients.health = std::make_shared<fakes::FakeHealth>();
    registry_ = std::make_unique<controller::RunRegistry>(options, clients);
    service_ = std::make_unique<controller::ControllerServiceImpl>(registry_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    target_ = absl::StrCat("127.0.0.1:", port);
    worker_->Attach(workers_);
  }

  ~RunClientTest() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    registry_->Shutdown();
  }

  // Plays the trainer of a successful run once the workers were started.
  std::thread PlayTrainer() {
    return std::thread([this] {
      ASSERT_TRUE(worker_->started.WaitForNotificationWithTimeout(absl::Seconds(10)));
      const std::string run_id = worker_->start_request().run_id();
      const auto report = [&](v1::TrainerState state, auto fill) {
        v1::ReportTrainerProgressRequest request;
        request.set_run_id(run_id);
        request.set_state(state);
        fill(request);
        ASSERT_TRUE(registry_->ReportTrainerProgress(request).ok());
      };
      report(v1::TRAINER_STATE_EVALUATING, [](auto& r) {
        r.mutable_eval()->set_phase("before");
        r.mutable_eval()->set_accuracy(0.4);
      });
      report(v1::TRAINER_STATE_WAITING_FOR_DATA, [](auto&) {});
      for (int step = 1; step <= 2; ++step) {
        report(v1::TRAINER_STATE_TRAINING, [step](auto& r) {
          r.mutable_step()->set_step(step);
          r.mutable_step()->set_policy_version(step);
          r.mutable_step()->set_reward_mean(0.5);
        });
      }
      report(v1::TRAINER_STATE_EVALUATING, [](auto& r) {
        r.mutable_eval()->set_phase("after");
        r.mutable_eval()->set_accuracy(0.9);
      });
      report(v1::TRAINER_STATE_FINISHED, [](auto&) {});
    });
  }

  std::shared_ptr<fakes::FakeTrainer> trainer_ = std::make_shared<fakes::FakeTrainer>();
  std::shared_ptr<controller::WorkerRegistry> workers_ =
      std::make_shared<controller::WorkerRegistry>(
          controller::WorkerRegistryOptions{.heartbeat_interval = absl::Milliseconds(5)});
  std::shared_ptr<fakes::FakeWorker> worker_ = std::make_shared<fakes::FakeWorker>();
  std::unique_ptr<controller::RunRegistry> registry_;
  std::unique_ptr<controller::ControllerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(RunClientTest, SubmitAndWatchFollowsTheRunToItsEnd) {
  std::thread trainer = PlayTrainer();
  std::ostringstream out;
  std::ostringstream progress;
  SubmitOptions options;
  options.watch = true;
  options.watch_interval_ms = 10;
  options.out = &out;
  options.progress = &progress;
  absl::StatusOr<v1::Run> run = SubmitAndWatch(target_, ValidSpec(), options);
  trainer.join();
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_THAT(out.str(), HasSubstr(run->run_id() + "\n"));
  EXPECT_THAT(out.str(), HasSubstr("SUCCEEDED"));
  EXPECT_THAT(out.str(), HasSubstr("0.400 -> 0.900"));
  // One progress line per update (not a terminal), the last one terminal.
  EXPECT_THAT(progress.str(), HasSubstr("pending"));
  EXPECT_THAT(progress.str(), HasSubstr("succeeded"));
  EXPECT_EQ(progress.str().find('\r'), std::string::npos);
}

TEST_F(RunClientTest, WithoutWatchReturnsTheSubmittedRun) {
  std::ostringstream out;
  SubmitOptions options;
  options.out = &out;
  absl::StatusOr<v1::Run> run = SubmitAndWatch(target_, ValidSpec(), options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->state(), v1::RUN_STATE_PENDING);
  EXPECT_EQ(out.str(), run->run_id() + "\n");
  absl::StatusOr<v1::CancelRunResponse> cancelled = CancelRun(target_, run->run_id(), "test");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->run().state(), v1::RUN_STATE_CANCELLED);
  EXPECT_FALSE(cancelled->already_ended());
  EXPECT_EQ(FormatCancelOutcome(*cancelled), run->run_id() + " RUN_STATE_CANCELLED: test");
  EXPECT_EQ(GetRun(target_, run->run_id())->error_message(), "test");
  // Cancelling it again says it had already ended, rather than "CANCELLED".
  absl::StatusOr<v1::CancelRunResponse> again = CancelRun(target_, run->run_id(), "again");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->already_ended());
  EXPECT_THAT(FormatCancelOutcome(*again),
              ::testing::MatchesRegex("run " + run->run_id() +
                                      " had already ended \\(CANCELLED at .* UTC: test\\); "
                                      "nothing was cancelled"));
}

TEST_F(RunClientTest, InvalidSpecIsInvalidArgumentWithTheFieldProblems) {
  v1::RunSpec spec = ValidSpec();
  spec.mutable_algorithm()->set_group_size(1);
  absl::StatusOr<v1::Run> run = SubmitAndWatch(target_, spec, SubmitOptions());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("algorithm.group_size"));
}

TEST_F(RunClientTest, ValidateOnlyReturnsTheResolvedSpec) {
  SubmitOptions options;
  options.validate_only = true;
  absl::StatusOr<v1::Run> run = SubmitAndWatch(target_, ValidSpec(), options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->run_id(), "");
  EXPECT_EQ(run->spec().algorithm().group_size(), 8);
}

TEST(RunClientStandaloneTest, UnreachableControllerSaysSoWithAHint) {
  absl::StatusOr<v1::Run> run =
      SubmitAndWatch("127.0.0.1:1", ValidSpec(), SubmitOptions{.call_timeout = absl::Seconds(5)});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(run.status().message()),
              HasSubstr("cannot reach the controller at 127.0.0.1:1"));
}

TEST(RunClientStandaloneTest, TargetComesFromTheFlagThenTheLocalStack) {
  const std::filesystem::path dir = ::testing::TempDir() + "/run-client-target";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / ".sluice" / "stack");
  const std::filesystem::path previous = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  unsetenv("SLUICE_STATE_DIR");
  EXPECT_EQ(*ResolveControllerTarget(""), "127.0.0.1:50051");
  std::ofstream(".sluice/stack/endpoints.json")
      << R"({"services": {"controller": {"grpc": "127.0.0.1:4242"}}})";
  EXPECT_EQ(*ResolveControllerTarget(""), "127.0.0.1:4242");
  EXPECT_EQ(*ResolveControllerTarget("host:1"), "host:1");
  std::filesystem::current_path(previous);
}

// `sluice up --state-dir DIR` writes DIR/endpoints.json: the client verbs
// find it with --state-dir or $SLUICE_STATE_DIR (as the Python client does),
// and say so when the stack is not up there, instead of dialing the default.
TEST(RunClientStandaloneTest, TargetComesFromTheStateDirFlagOrEnvironment) {
  const std::filesystem::path dir = ::testing::TempDir() + "/run-client-state-dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "up");
  unsetenv("SLUICE_STATE_DIR");
  const std::string state_dir = (dir / "up").string();
  const absl::StatusOr<std::string> missing = ResolveControllerTarget("", state_dir);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("is `sluice up --state-dir " + state_dir + "` running?"));
  std::ofstream(dir / "up" / "endpoints.json")
      << R"({"services": {"controller": {"grpc": "127.0.0.1:4343"}}})";
  EXPECT_EQ(*ResolveControllerTarget("", state_dir), "127.0.0.1:4343");
  EXPECT_EQ(*ResolveControllerTarget("host:1", state_dir), "host:1");
  setenv("SLUICE_STATE_DIR", state_dir.c_str(), 1);
  EXPECT_EQ(*ResolveControllerTarget(""), "127.0.0.1:4343");
  unsetenv("SLUICE_STATE_DIR");
}

// Nothing listens at the address: the error says how to find the stack,
// not that TLS might be the problem.
TEST(RunClientStandaloneTest, AnUnreachableControllerSaysHowToFindTheStack) {
  runtime::SetProcessClientSecurity(runtime::ClientSecurity());
  const absl::StatusOr<v1::Run> run = GetRun("127.0.0.1:1", "run-x", absl::Seconds(5));
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(run.status().message()),
              HasSubstr("(is `sluice up` running? pass --target HOST:PORT or --state-dir DIR)"));
  EXPECT_THAT(std::string(run.status().message()), ::testing::Not(HasSubstr("TLS")));
}

// `sluice runs watch` across a controller restart: the controller stops
// (SIGTERM) mid-run and another starts on the same address and runs
// directory a moment later, re-adopts the run, and the watch goes on to the
// run's real end. Before, the watch gave up after 5 quick retries (and the
// stopping controller failed the run anyway).
// A real controller service (fake trainer, worker and buffer behind it) that
// a test can stop and start again at the same address: a Unix socket, which
// no other process can take while it is down (a TCP port could be).
class RunClientRestartTest : public ::testing::Test {
 protected:
  struct Controller {
    std::unique_ptr<controller::RunRegistry> registry;
    std::unique_ptr<controller::ControllerServiceImpl> service;
    std::unique_ptr<grpc::Server> server;
    int port = 0;  // Non-zero once it listens.
  };

  void SetUp() override {
    runs_dir_ = OwnRunsDir("run-client-restart");
    std::filesystem::remove_all(runs_dir_);
    socket_path_ = absl::StrCat(::testing::TempDir(), "/run-client-", getpid(), ".sock");
    std::filesystem::remove(socket_path_);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(runs_dir_, ignored);
    std::filesystem::remove(socket_path_, ignored);
  }

  std::string target() const { return "unix:" + socket_path_; }

  Controller Start() {
    std::error_code ignored;
    std::filesystem::remove(socket_path_, ignored);  // A stopped server's socket file.
    Controller c;
    controller::RunRegistryOptions options;
    options.runs_dir = runs_dir_;
    options.driver.prompt_source = [](const v1::RunSpec&) {
      std::vector<v1::Prompt> prompts(4);
      for (size_t i = 0; i < prompts.size(); ++i) prompts[i].set_prompt_id(absl::StrCat(i));
      return prompts;
    };
    controller::ServiceClients clients;
    clients.trainer = trainer_;
    clients.replay_buffer = std::make_shared<fakes::FakeBuffer>();
    clients.workers = std::make_shared<controller::WorkerRegistry>(
        controller::WorkerRegistryOptions{.heartbeat_interval = absl::Milliseconds(5)});
    clients.reward_server_address = "reward:1";
    clients.health = std::make_shared<fakes::FakeHealth>();
    c.registry = std::make_unique<controller::RunRegistry>(options, clients);
    EXPECT_TRUE(c.registry->Restore().ok());
    worker_->Attach(clients.workers);
    c.service = std::make_unique<controller::ControllerServiceImpl>(c.registry.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort(target(), grpc::InsecureServerCredentials(), &c.port);
    builder.RegisterService(c.service.get());
    c.server = builder.BuildAndStart();
    return c;
  }

  static void Stop(Controller& c) {
    c.service->BeginShutdown();
    c.registry->Shutdown();
    c.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // While no controller serves the socket: true once a client dials it
  // (this listens there itself, takes one connection and closes it), false
  // after `timeout`. A watch that dialed while the controller was down has
  // seen it down, however long this machine took to get there.
  bool AwaitDialWhileDown(absl::Duration timeout) {
    std::error_code ignored;
    std::filesystem::remove(socket_path_, ignored);
    const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return false;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", socket_path_.c_str());
    bool dialed = false;
    if (bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0 &&
        listen(listener, 4) == 0) {
      pollfd ready{listener, POLLIN, 0};
      if (poll(&ready, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
        const int connection = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        dialed = connection >= 0;
        if (connection >= 0) close(connection);
      }
    }
    close(listener);
    std::filesystem::remove(socket_path_, ignored);
    return dialed;
  }

  std::string runs_dir_;
  std::string socket_path_;
  std::shared_ptr<fakes::FakeTrainer> trainer_ = std::make_shared<fakes::FakeTrainer>();
  std::shared_ptr<fakes::FakeWorker> worker_ = std::make_shared<fakes::FakeWorker>();
};

// Tells when a watch has shown its first progress line: it is following the
// run (a watch started while no controller answers fails at once, as a wrong
// --target should).
struct FirstLine : std::stringbuf {
  int sync() override {
    if (!shown.HasBeenNotified()) shown.Notify();
    return std::stringbuf::sync();
  }
  absl::Notification shown;
};

// A watch of a run submitted to `target`, on its own thread, following it
// (its first progress line shown) when Follow() returns true.
class Watch {
 public:
  Watch(const std::string& target, const std::atomic<bool>* stop_watching)
      : target_(target), progress_(&first_line_), stop_watching_(stop_watching) {}
  ~Watch() { Join(); }

  // Submits, waits until the trainer starts the run, then watches it; true
  // once the watch follows it.
  bool Follow(fakes::FakeTrainer& trainer) {
    submitted_ = SubmitAndWatch(target_, ValidSpec(), SubmitOptions());
    if (!submitted_.ok() || !trainer.AwaitStarts(1, absl::Seconds(10))) return false;
    thread_ = std::thread([this] {
      SubmitOptions options;
      options.watch_interval_ms = 10;
      options.resume_for = absl::Seconds(30);
      options.progress = &progress_;
      options.stop_watching = stop_watching_;
      watched_ = WatchRun(target_, submitted_->run_id(), options);
    });
    return first_line_.shown.WaitForNotificationWithTimeout(absl::Seconds(10));
  }
  const std::string& run_id() const { return submitted_->run_id(); }
  // What the watch returned (after it returned).
  const absl::StatusOr<v1::Run>& Join() {
    if (thread_.joinable()) thread_.join();
    return watched_;
  }

 private:
  const std::string target_;
  FirstLine first_line_;
  std::ostream progress_;
  const std::atomic<bool>* stop_watching_;
  absl::StatusOr<v1::Run> submitted_ = absl::UnknownError("not submitted");
  absl::StatusOr<v1::Run> watched_ = absl::UnknownError("not returned");
  std::thread thread_;
};

TEST_F(RunClientRestartTest, WatchPicksUpAgainAfterAControllerRestart) {
  Controller first = Start();
  ASSERT_GT(first.port, 0);
  Watch watch(target(), /*stop_watching=*/nullptr);
  ASSERT_TRUE(watch.Follow(*trainer_));
  Stop(first);
  // The controller is down until the watch has tried to reach it.
  ASSERT_TRUE(AwaitDialWhileDown(absl::Seconds(30)));
  Controller second = Start();
  ASSERT_GT(second.port, 0);
  ASSERT_TRUE(trainer_->AwaitStarts(2, absl::Seconds(10)));  // Re-adopted.
  v1::ReportTrainerProgressRequest finished;
  finished.set_run_id(watch.run_id());
  finished.set_state(v1::TRAINER_STATE_FINISHED);
  ASSERT_TRUE(second.registry->ReportTrainerProgress(finished).ok());
  const absl::StatusOr<v1::Run>& watched = watch.Join();
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(watched->summary().recovery().controller_readoptions(), 1);
  Stop(second);
}

// `sluice quickstart` stopping its own stack: the broken stream is not
// resumed (it would be for resume_for, 30 s here, against a controller that
// is not coming back); the watch says it stopped.
TEST_F(RunClientRestartTest, AWatchToldTheControllerIsStoppingEndsWithItsStream) {
  Controller controller = Start();
  ASSERT_GT(controller.port, 0);
  std::atomic<bool> stopping{false};
  Watch watch(target(), &stopping);
  ASSERT_TRUE(watch.Follow(*trainer_));
  stopping.store(true);
  Stop(controller);
  const absl::StatusOr<v1::Run>& watched = watch.Join();
  EXPECT_EQ(watched.status().code(), absl::StatusCode::kCancelled) << watched.status();
  EXPECT_THAT(std::string(watched.status().message()),
              HasSubstr("the controller is being stopped"));
}

TEST(FormatTest, ProgressLineShowsTheFigures) {
  v1::Run run;
  run.set_state(v1::RUN_STATE_TRAINING);
  v1::RunProgress& p = *run.mutable_progress();
  p.set_step(12);
  p.set_total_steps(200);
  p.set_policy_version(12);
  p.set_reward_mean(0.4123);
  p.set_pass_rate(0.38);
  p.set_staleness_mean(0.8);
  p.set_staleness_max(2);
  p.set_generated_tokens_per_second(1520);
  p.set_trained_tokens_per_second(3400);
  p.set_latest_eval_accuracy(0.42);
  p.set_latest_eval_step(10);
  p.set_phase("waiting for data");
  p.set_elapsed_seconds(75);
  EXPECT_EQ(FormatProgressLine(run),
            "training    01:15  step 12/200  v12  reward 0.412  pass 38.0%  stale 0.8/2  gen "
            "1.5k tok/s  train 3.4k tok/s  eval 42.0% @10  | waiting for data");
  // With the RL phase's time so far, the time left at that rate.
  run.mutable_summary()->set_rl_seconds(6);  // 0.5 s a step, 188 steps left
  EXPECT_THAT(FormatProgressLine(run), HasSubstr("eval 42.0% @10  ETA 01:34  | waiting for data"));
}

// The warm start shows its own figures (not RL's zeros): SFT steps, at most
// sft_steps as it stops at its target, the latest dev accuracy against that
// target, and at most how long is left.
TEST(FormatTest, WarmStartShowsItsOwnFiguresAndTarget) {
  v1::Run run;
  run.set_state(v1::RUN_STATE_WARM_START);
  run.mutable_spec()->mutable_warm_start()->set_sft_steps(600);
  run.mutable_spec()->mutable_warm_start()->set_target_accuracy(0.45);
  v1::RunProgress& p = *run.mutable_progress();
  p.set_total_steps(700);
  p.set_warm_start_step(240);
  p.set_elapsed_seconds(26);
  p.set_phase("warm start 240/600");
  EXPECT_EQ(FormatProgressLine(run), "warm start  00:26  sft step 240/<=600  target dev 45%");
  v1::EvalResult& dev = *run.mutable_summary()->add_evals();
  dev.set_phase("warm_start");
  dev.set_step(240);
  dev.set_accuracy(0.38);
  run.mutable_summary()->set_warm_start_seconds(24);  // 0.1 s a step
  EXPECT_EQ(FormatProgressLine(run),
            "warm start  00:26  sft step 240/<=600  dev 38.0% (target 45%)  ETA <= 00:36");
  // Its evaluation is a phase worth showing.
  p.set_phase("warm start eval @ 240");
  EXPECT_THAT(FormatProgressLine(run), ::testing::EndsWith("  | warm start eval @ 240"));
  // Without a target it runs every step: the ETA is not a bound.
  run.mutable_spec()->mutable_warm_start()->set_target_accuracy(0);
  EXPECT_EQ(FormatProgressLine(run),
            "warm start  00:26  sft step 240/600  dev 38.0%  ETA 00:36  | warm start eval @ 240");
}

TEST(FormatTest, BeforeTheWarmStartOnlyThePhaseIsShown) {
  v1::Run run;
  run.set_state(v1::RUN_STATE_PENDING);
  run.mutable_progress()->set_total_steps(700);
  run.mutable_progress()->set_elapsed_seconds(3);
  run.mutable_progress()->set_phase("loading model");
  EXPECT_EQ(FormatProgressLine(run), "pending     00:03  | loading model");
}

// A run that says what it is for (configs/smoke.yaml: a plumbing check) is
// not read as one that failed to learn.
TEST(FormatTest, TheOutcomeSaysWhatTheRunIsFor) {
  v1::Run run;
  run.set_run_id("run-x");
  run.set_state(v1::RUN_STATE_SUCCEEDED);
  run.mutable_summary()->set_eval_before(0.05);
  run.mutable_summary()->set_eval_after(0.05);
  EXPECT_THAT(FormatOutcome(run), ::testing::Not(HasSubstr("about this run")));
  run.mutable_spec()->set_description("a plumbing check, too short to learn");
  EXPECT_THAT(FormatOutcome(run),
              HasSubstr("eval accuracy (held-out, greedy): 0.050 -> 0.050\n"
                        "about this run: a plumbing check, too short to learn\n"));
}

TEST(FormatTest, RunsListHasAHeaderAndTimes) {
  v1::Run run;
  run.set_run_id("run-20260101-000000-ab12");
  run.set_state(v1::RUN_STATE_SUCCEEDED);
  run.mutable_spec()->set_name("quickstart-addition");
  run.mutable_created_at()->set_seconds(1767225600);  // 2026-01-01 00:00:00 UTC
  run.mutable_summary()->set_wall_seconds(118.4);
  run.mutable_progress()->set_step(700);
  run.mutable_progress()->set_total_steps(700);
  const std::string header = FormatRunListHeader();
  const std::string line = FormatRunListLine(run);
  EXPECT_THAT(header, ::testing::StartsWith("RUN ID"));
  EXPECT_THAT(header, HasSubstr("CREATED (UTC)"));
  EXPECT_THAT(header, HasSubstr("WALL"));
  EXPECT_EQ(line,
            "run-20260101-000000-ab12    SUCCEEDED               quickstart-addition   "
            "2026-01-01 00:00:00  01:58      700/700");
  // Columns line up under the header.
  EXPECT_EQ(header.find("STATE"), line.find("SUCCEEDED"));
  EXPECT_EQ(header.find("CREATED"), line.find("2026-01-01"));
  EXPECT_EQ(header.find("WALL"), line.find("01:58"));
}

// What holds a run back (Run.conditions) shows on the progress line and in
// `sluice runs get`, with since when.
TEST(FormatTest, ConditionsShowWhatTheRunWaitsForAndSinceWhen) {
  v1::Run run;
  run.set_state(v1::RUN_STATE_TRAINING);
  EXPECT_EQ(FormatConditions(run, absl::Now()), "");
  EXPECT_THAT(FormatProgressLine(run), ::testing::Not(HasSubstr("waiting:")));
  v1::RunCondition* c = run.add_conditions();
  c->set_kind("no_worker");
  c->set_service("rollout_worker");
  c->set_message("no rollout worker serves the run (rollout.min_workers = 1) since 12:00:00");
  const absl::Time since = absl::Now() - absl::Seconds(42);
  c->mutable_since()->set_seconds(absl::ToUnixSeconds(since));
  EXPECT_THAT(FormatProgressLine(run), HasSubstr("| waiting: rollout_worker no_worker 4"));
  const std::string text = FormatConditions(run, since + absl::Seconds(42));
  EXPECT_THAT(text, HasSubstr("42s): no rollout worker serves the run"));
  EXPECT_THAT(text, HasSubstr("waiting (since "));
}

}  // namespace
}  // namespace sluice::cli
