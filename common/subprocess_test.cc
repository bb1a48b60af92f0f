#include "common/subprocess.h"

#include <signal.h>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

TEST(SubprocessTest, ReportsExitCode) {
  auto child = Subprocess::Start({.argv = {"/bin/sh", "-c", "exit 3"}});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<ExitStatus> exit = (*child)->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_FALSE(exit->success());
  EXPECT_EQ(exit->code, 3);
  EXPECT_EQ(exit->ToString(), "exited with code 3");
}

TEST(SubprocessTest, MissingExecutableIsAnErrorNotAChild) {
  auto child = Subprocess::Start({.argv = {"/nonexistent/sluice-nothing"}});
  ASSERT_FALSE(child.ok());
  EXPECT_THAT(std::string(child.status().message()), HasSubstr("No such file"));
}

TEST(SubprocessTest, WaitReadyReturnsTheLineTheChildWrites) {
  auto child = Subprocess::Start({.argv = {"/bin/sh", "-c", "echo '{\"ok\":1}' >&3; sleep 30"},
                                  .ready_pipe = true});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<std::string> line = (*child)->WaitReady(Soon());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "{\"ok\":1}");
  const ExitStatus exit = (*child)->Stop(absl::Seconds(10));
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGTERM);
}

TEST(SubprocessTest, WaitReadyFailsWhenTheChildDiesFirst) {
  auto child = Subprocess::Start({.argv = {"/bin/sh", "-c", "exit 4"}, .ready_pipe = true});
  ASSERT_TRUE(child.ok());
  absl::StatusOr<std::string> line = (*child)->WaitReady(Soon());
  ASSERT_FALSE(line.ok());
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Two-sided: the wait must not return while the child runs, and must return
// once it is signalled.
TEST(SubprocessTest, WaitTimesOutWhileRunningAndReturnsAfterSignal) {
  auto child = Subprocess::Start({.argv = {"/bin/sleep", "30"}});
  ASSERT_TRUE(child.ok());
  absl::StatusOr<ExitStatus> early = (*child)->Wait(absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE((*child)->Signal(SIGKILL).ok());
  absl::StatusOr<ExitStatus> exit = (*child)->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->signaled);
  EXPECT_EQ(exit->signal, SIGKILL);
}

TEST(SubprocessTest, StopEscalatesToSigkillWhenSigtermIsIgnored) {
  auto child = Subprocess::Start(
      {.argv = {"/bin/sh", "-c", "trap '' TERM; echo up >&3; while :; do sleep 1; done"},
       .ready_pipe = true});
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE((*child)->WaitReady(Soon()).ok());
  const ExitStatus exit = (*child)->Stop(absl::Milliseconds(200));
  EXPECT_TRUE(exit.signaled);
  EXPECT_EQ(exit.signal, SIGKILL);
}

TEST(SubprocessTest, EnvironmentOverridesReachTheChild) {
  auto child = Subprocess::Start({.argv = {"/bin/sh", "-c", "test \"$SLUICE_X\" = 42"},
                                  .env = {{"SLUICE_X", "42"}}});
  ASSERT_TRUE(child.ok());
  EXPECT_TRUE((*child)->Wait(Soon())->success());
}

}  // namespace
}  // namespace sluice
