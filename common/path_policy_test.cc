#include "common/path_policy.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory per test, resolved (the test's TMPDIR may itself be
// reached through a symlink).
class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::path(::testing::TempDir()) / ("path-policy-" + std::to_string(getpid()) + "-" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "root" / "models");
    fs::create_directories(dir_ / "outside");
    std::ofstream(dir_ / "outside" / "secret") << "x";
    dir_ = fs::canonical(dir_);
    root_ = (dir_ / "root").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  PathPolicy Policy(std::vector<std::string> roots) {
    absl::StatusOr<PathPolicy> policy = PathPolicy::Create(roots);
    EXPECT_TRUE(policy.ok()) << policy.status();
    return *std::move(policy);
  }

  fs::path dir_;
  std::string root_;
};

std::string Message(const absl::StatusOr<std::string>& confined) {
  return std::string(confined.status().message());
}

TEST_F(PathPolicyTest, PathsUnderARootComeBackUnchanged) {
  const PathPolicy policy = Policy({root_});
  EXPECT_EQ(*policy.Confine("model.hf_model_dir", root_ + "/models"), root_ + "/models");
  EXPECT_EQ(*policy.Confine("checkpoint.dir", root_), root_);  // The root itself.
}

TEST_F(PathPolicyTest, PathsOutsideEveryRootAreRefusedWithTheUniformMessage) {
  const PathPolicy policy = Policy({root_, dir_.string() + "/other"});
  const absl::StatusOr<std::string> confined = policy.Confine("checkpoint.dir", "/etc/sluice-evil");
  ASSERT_FALSE(confined.ok());
  EXPECT_EQ(confined.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(confined),
            "checkpoint.dir '/etc/sluice-evil' is outside the allowed roots [" + root_ + ", " +
                dir_.string() + "/other]; add its parent to --allowed-path-roots");
}

TEST_F(PathPolicyTest, TheMessageTellsNothingAboutWhatExistsOutside) {
  const PathPolicy policy = Policy({root_});
  const std::string outside = (dir_ / "outside").string();
  // An existing file, a missing one, a directory, and a path through a file.
  for (const std::string& path :
       {outside + "/secret", outside + "/missing", outside, outside + "/secret/below"}) {
    const absl::StatusOr<std::string> confined = policy.Confine("task.dataset.path", path);
    ASSERT_FALSE(confined.ok()) << path;
    EXPECT_EQ(Message(confined), "task.dataset.path '" + path + "' is outside the allowed roots [" +
                                     root_ + "]; add its parent to --allowed-path-roots");
  }
}

TEST_F(PathPolicyTest, DotDotEscapesAreCaught) {
  const PathPolicy policy = Policy({root_});
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/../outside/secret").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/models/../../outside").ok());
  // Through a directory that does not exist yet: resolved as it would be
  // created.
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/new/../../outside/x").ok());
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "/new/../models").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", "/../../" + root_ + "/../outside").ok());
}

TEST_F(PathPolicyTest, SymlinksInsideARootPointingOutsideAreCaught) {
  fs::create_directory_symlink(dir_ / "outside", dir_ / "root" / "escape");
  fs::create_symlink(dir_ / "outside" / "secret", dir_ / "root" / "secret-link");
  fs::create_directory_symlink(dir_ / "root" / "models", dir_ / "root" / "inner");
  const PathPolicy policy = Policy({root_});
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/escape").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/escape/new-dir").ok());
  EXPECT_FALSE(policy.Confine("task.dataset.path", root_ + "/secret-link").ok());
  // A symlink that stays inside is fine.
  EXPECT_TRUE(policy.Confine("model.hf_model_dir", root_ + "/inner").ok());
  // `..` after a symlink climbs from its target, as the kernel does:
  // root/inner/.. is root, root/escape/.. is dir_.
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "/inner/../ckpt").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/escape/../root-sibling").ok());
}

TEST_F(PathPolicyTest, SymlinkLoopsAreRefusedLikeAnyOutsidePathOrTakenLexicallyInside) {
  fs::create_symlink(dir_ / "root" / "loop", dir_ / "root" / "loop");
  const PathPolicy policy = Policy({root_});
  // Inside: the open fails later with its own message.
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "/loop/x").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "/loop/../../outside").ok());
}

TEST_F(PathPolicyTest, ANonExistentLeafUnderARootIsAllowed) {
  const PathPolicy policy = Policy({root_});
  EXPECT_EQ(*policy.Confine("checkpoint.dir", root_ + "/checkpoints/run-1"),
            root_ + "/checkpoints/run-1");
  EXPECT_FALSE(fs::exists(root_ + "/checkpoints"));  // Checked, not created.
}

TEST_F(PathPolicyTest, TrailingSlashesOnPathsAndRootsDoNotMatter) {
  const PathPolicy policy = Policy({root_ + "/"});
  EXPECT_EQ(policy.roots(), std::vector<std::string>{root_});
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "/").ok());
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "/models/").ok());
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "//models//x/").ok());
}

TEST_F(PathPolicyTest, ARootIsAWholeComponentNotAStringPrefix) {
  fs::create_directories(dir_ / "root2");
  const PathPolicy policy = Policy({root_});
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "2").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_ + "2/x").ok());
}

TEST_F(PathPolicyTest, ARootThatIsASymlinkAdmitsPathsThroughItAndUnderItsTarget) {
  fs::create_directory_symlink(dir_ / "root", dir_ / "root-link");
  const PathPolicy policy = Policy({(dir_ / "root-link").string()});
  EXPECT_EQ(policy.DescribeRoots(), "[" + (dir_ / "root-link").string() + "]");
  EXPECT_TRUE(policy.Confine("model.hf_model_dir", (dir_ / "root-link" / "models").string()).ok());
  EXPECT_TRUE(policy.Confine("model.hf_model_dir", root_ + "/models").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", (dir_ / "root-link" / ".." / "outside").string())
                   .ok());
}

TEST_F(PathPolicyTest, RelativePathsResolveAgainstTheFirstRoot) {
  fs::create_directories(dir_ / "second");
  const PathPolicy policy = Policy({root_, (dir_ / "second").string()});
  EXPECT_EQ(*policy.Confine("model.hf_model_dir", "models"), root_ + "/models");
  EXPECT_EQ(*policy.Confine("checkpoint.dir", "./checkpoints/a/"), root_ + "/checkpoints/a");
  EXPECT_EQ(*policy.Confine("checkpoint.dir", "../second/x"), (dir_ / "second" / "x").string());
  const absl::StatusOr<std::string> escape = policy.Confine("checkpoint.dir", "../outside");
  ASSERT_FALSE(escape.ok());
  EXPECT_THAT(Message(escape), HasSubstr("checkpoint.dir '../outside' is outside the allowed"));
}

TEST_F(PathPolicyTest, RelativeRootsAreMadeAbsoluteAgainstTheWorkingDirectory) {
  const fs::path before = fs::current_path();
  fs::current_path(dir_);
  const PathPolicy policy = Policy({"root"});
  fs::current_path(before);
  EXPECT_EQ(policy.roots(), std::vector<std::string>{root_});
  EXPECT_TRUE(policy.Confine("checkpoint.dir", root_ + "/x").ok());
}

TEST_F(PathPolicyTest, AnEmptyListOfRootsAdmitsNothing) {
  const PathPolicy policy = Policy({});
  EXPECT_EQ(policy.DescribeRoots(), "[]");
  EXPECT_FALSE(policy.Confine("checkpoint.dir", root_).ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", "relative").ok());
  EXPECT_FALSE(policy.Confine("checkpoint.dir", "/").ok());
}

TEST_F(PathPolicyTest, SlashAsARootAdmitsEverything) {
  const PathPolicy policy = Policy({"/"});
  EXPECT_TRUE(policy.Confine("checkpoint.dir", "/etc/sluice-evil").ok());
}

TEST_F(PathPolicyTest, BadPathsAndRootsAreRefused) {
  const PathPolicy policy = Policy({root_});
  EXPECT_THAT(Message(policy.Confine("checkpoint.dir", "")), HasSubstr("must not be empty"));
  EXPECT_THAT(Message(policy.Confine("checkpoint.dir", root_ + std::string("/a\0/../../x", 11))),
              HasSubstr("NUL"));
  EXPECT_THAT(Message(policy.Confine("checkpoint.dir", root_ + "/" + std::string(PATH_MAX, 'a'))),
              HasSubstr("must be shorter than"));
  EXPECT_FALSE(PathPolicy::Create({""}).ok());
}

TEST_F(PathPolicyTest, UnrestrictedReturnsEveryPathUnchanged) {
  const PathPolicy policy = PathPolicy::Unrestricted();
  EXPECT_TRUE(policy.unrestricted());
  EXPECT_EQ(*policy.Confine("checkpoint.dir", "/etc/x"), "/etc/x");
  EXPECT_EQ(*policy.Confine("checkpoint.dir", "relative/x"), "relative/x");
  EXPECT_EQ(policy.DescribeRoots(), "any path");
}

TEST(ResolveExistingPrefixTest, NormalisesWhatDoesNotExist) {
  EXPECT_EQ(ResolveExistingPrefix("/"), "/");
  EXPECT_EQ(ResolveExistingPrefix("/.."), "/");
  EXPECT_EQ(ResolveExistingPrefix("/no-such-dir-sluice/a/../b/"), "/no-such-dir-sluice/b");
}

}  // namespace
}  // namespace sluice
