// `sluice up`'s liveness check, as a user meets it: each service of the stack
// in turn is stopped with SIGSTOP (alive, holding its port, answering
// nothing). Restarting on exit alone would leave it so for good; the stack
// asks every service's health, and one that does not answer a few times in a
// row is killed and restarted like a dead one, its death saying why.
#include <signal.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct Service {
  pid_t pid = 0;
  std::string grpc;
  std::string last_exit;
  int64_t restarts = 0;
};

class LivenessProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("liveness");
    SubprocessOptions up;
    up.argv = {testing::BinDir() + "/sluice", "up", "--state-dir=" + dir_ + "/stack",
               "--runs-dir=" + dir_ + "/runs", "--rollout-workers=1",
               // Asked every second; no answer within a second, three times
               // in a row, and it is killed.
               "--liveness-period=1s", "--liveness-timeout=1s", "--liveness-failures=3",
               absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
    up.log_path = dir_ + "/up.log";
    up.ready_pipe = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(up);
    ASSERT_TRUE(started.ok()) << started.status();
    up_ = std::move(*started);
    absl::StatusOr<std::string> ready = up_->WaitReady(absl::Now() + absl::Minutes(2));
    ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(dir_ + "/up.log");
    endpoints_path_ = *ready;
  }

  void TearDown() override {
    if (up_ == nullptr) return;
    up_->Signal(SIGTERM).IgnoreError();
    EXPECT_TRUE(up_->Wait(absl::Now() + absl::Seconds(60)).ok());
  }

  // `pid` exists and is neither a zombie nor dead (/proc/PID/stat's state).
  static bool ProcessRunning(pid_t pid) {
    const char state = ProcessState(pid);
    return state != '\0' && state != 'Z' && state != 'X';
  }
  // /proc/PID/stat's state ('R', 'S', 'T' stopped, 'Z', ...); '\0' when gone.
  static char ProcessState(pid_t pid) {
    const std::string stat = testing::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) return '\0';
    return stat[paren + 2];
  }

  std::map<std::string, Service> Endpoints() const {
    std::map<std::string, Service> services;
    const nlohmann::json document =
        nlohmann::json::parse(testing::ReadFile(endpoints_path_), nullptr, false);
    if (!document.is_object() || !document.contains("services")) return services;
    for (const auto& [name, entry] : document["services"].items()) {
      Service& service = services[name];
      if (entry.contains("pid") && entry["pid"].is_number()) service.pid = entry["pid"];
      service.grpc = entry.value("grpc", "");
      service.last_exit = entry.value("last_exit", "");
      service.restarts = entry.value("restarts", int64_t{0});
    }
    return services;
  }

  std::string dir_;
  std::string endpoints_path_;
  std::unique_ptr<Subprocess> up_;
};

TEST_F(LivenessProcessTest, EachServiceStoppedWithSigstopIsKilledAndRestarted) {
  for (const std::string name :
       {"rollout_worker-0", "reward_server", "replay_buffer", "trainer", "controller"}) {
    SCOPED_TRACE(name);
    // The entry of a process that runs and answers: on a loaded machine the
    // stack may be restarting a service that was slow to answer (its pid in
    // endpoints.json then names a process that is gone, and its port a new
    // one); wait for that to settle rather than stop the wrong process.
    Service before;
    const absl::Time settle = absl::Now() + absl::Seconds(60);
    while (true) {
      before = Endpoints()[name];
      if (before.pid != 0 && ProcessRunning(before.pid) &&
          runtime::CheckHealth(before.grpc, "", absl::Seconds(5)).ok() &&
          Endpoints()[name].pid == before.pid) {
        break;
      }
      ASSERT_LT(absl::Now(), settle) << testing::ReadFile(endpoints_path_);
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_EQ(kill(before.pid, SIGSTOP), 0);
    // Stopped (gRPC listens with SO_REUSEPORT, so a health check of the port
    // is not a check of this process: its state is)...
    const absl::Time stop_deadline = absl::Now() + absl::Seconds(10);
    while (ProcessState(before.pid) != 'T' && absl::Now() < stop_deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(ProcessState(before.pid), 'T');
    // ...until the stack has killed it (SIGKILL ends a stopped process) and
    // started it again, serving.
    ASSERT_TRUE(testing::WaitForPidExit(before.pid, absl::Now() + absl::Seconds(60)))
        << "still alive (stopped) after 60s\n"
        << testing::ReadFile(dir_ + "/up.log");
    Service after;
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (absl::Now() < deadline) {
      after = Endpoints()[name];
      if (after.pid != 0 && after.pid != before.pid) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_NE(after.pid, 0) << testing::ReadFile(dir_ + "/up.log");
    ASSERT_NE(after.pid, before.pid);
    // At least this kill (a loaded machine may have added a slow answer's).
    EXPECT_GE(after.restarts, before.restarts + 1);
    EXPECT_THAT(after.last_exit,
                ::testing::AllOf(HasSubstr("did not answer its health check within 1s, 3 times "
                                           "in a row"),
                                 HasSubstr("killed (SIGKILL) by sluice up")));
    absl::StatusOr<std::string> health = runtime::CheckHealth(after.grpc, "", absl::Seconds(30));
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, "SERVING");
  }
  EXPECT_THAT(testing::ReadFile(dir_ + "/up.log"), HasSubstr("killing it (liveness check)"));
}

}  // namespace
}  // namespace sluice
