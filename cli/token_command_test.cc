#include "cli/token_command.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/runtime/auth.h"

namespace sluice::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TokenCreateTest, PrintsTheTokenOnceAndAppendsOnlyItsHash) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/token-create-", getpid());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/tokens.yaml";
  std::ostringstream out1, out2, err;
  ASSERT_EQ(RunTokenCreate({"operator", "alice", file, ""}, out1, err), 0) << err.str();
  ASSERT_EQ(RunTokenCreate({"worker", "worker-7", file, "12h"}, out2, err), 0) << err.str();
  const std::string alice = std::string(absl::StripTrailingAsciiWhitespace(out1.str()));
  const std::string worker = std::string(absl::StripTrailingAsciiWhitespace(out2.str()));
  std::stringstream text;
  text << std::ifstream(file).rdbuf();
  EXPECT_THAT(text.str(), Not(HasSubstr(alice)));
  EXPECT_THAT(text.str(), HasSubstr(runtime::TokenHash(alice)));
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  absl::StatusOr<std::unique_ptr<runtime::TokenStore>> store = runtime::TokenStore::Load(file);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->size(), 2u);
  absl::StatusOr<runtime::Principal> a = (*store)->Authenticate(alice, absl::Now());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->role, runtime::Role::kOperator);
  // The worker's token expires in 12 hours.
  EXPECT_TRUE((*store)->Authenticate(worker, absl::Now()).ok());
  EXPECT_FALSE((*store)->Authenticate(worker, absl::Now() + absl::Hours(13)).ok());

  std::ostringstream out3, bad;
  EXPECT_EQ(RunTokenCreate({"root", "x", file, ""}, out3, bad), 2);
  EXPECT_THAT(bad.str(), HasSubstr("unknown role 'root'"));
  EXPECT_EQ(RunTokenCreate({"viewer", "x", file, "soon"}, out3, bad), 2);
  EXPECT_EQ(RunTokenCreate({"viewer", "a:b", file, ""}, out3, bad), 1);  // ':' in identity
  EXPECT_TRUE(out3.str().empty());  // No token printed for a refused create.
}

}  // namespace
}  // namespace sluice::cli
