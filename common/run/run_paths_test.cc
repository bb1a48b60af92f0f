#include "common/run/run_paths.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::run {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class RunPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("run-paths-" + std::to_string(getpid()));
    fs::create_directories(root_ / "models" / "qwen");
    root_ = fs::canonical(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  PathPolicy Policy() { return *PathPolicy::Create({root_.string()}); }

  fs::path root_;
};

TEST_F(RunPathsTest, PathsInsideTheRootsPassAndRelativeOnesBecomeAbsolute) {
  v1::RunSpec spec;
  spec.mutable_model()->set_hf_model_dir((root_ / "models" / "qwen").string());
  spec.mutable_model()->set_tokenizer_path("models/qwen/tokenizer.json");
  spec.mutable_task()->mutable_dataset()->set_path("data/train.jsonl");
  spec.mutable_checkpoint()->set_dir("checkpoints/run");
  ASSERT_TRUE(ConfineRunSpecPaths(Policy(), &spec).ok());
  EXPECT_EQ(spec.model().hf_model_dir(), (root_ / "models" / "qwen").string());
  EXPECT_EQ(spec.model().tokenizer_path(), (root_ / "models/qwen/tokenizer.json").string());
  EXPECT_EQ(spec.task().dataset().path(), (root_ / "data/train.jsonl").string());
  EXPECT_EQ(spec.checkpoint().dir(), (root_ / "checkpoints/run").string());
}

TEST_F(RunPathsTest, EveryPathFieldOutsideIsNamedOnItsOwnLineAndTheSpecIsLeftAlone) {
  v1::RunSpec spec;
  spec.mutable_model()->set_hf_model_dir("/etc/models");
  spec.mutable_model()->set_tokenizer_path("/etc/passwd");
  spec.mutable_task()->mutable_dataset()->set_path("../outside.jsonl");
  spec.mutable_checkpoint()->set_dir("/etc/sluice-evil");
  const v1::RunSpec before = spec;
  const absl::Status status = ConfineRunSpecPaths(Policy(), &spec);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string roots = "[" + root_.string() + "]";
  EXPECT_EQ(status.message(),
            "model.hf_model_dir '/etc/models' is outside the allowed roots " + roots +
                "; add its parent to --allowed-path-roots\n"
                "model.tokenizer_path '/etc/passwd' is outside the allowed roots " + roots +
                "; add its parent to --allowed-path-roots\n"
                "task.dataset.path '../outside.jsonl' is outside the allowed roots " + roots +
                "; add its parent to --allowed-path-roots\n"
                "checkpoint.dir '/etc/sluice-evil' is outside the allowed roots " + roots +
                "; add its parent to --allowed-path-roots");
  EXPECT_EQ(spec.SerializeAsString(), before.SerializeAsString());
}

TEST_F(RunPathsTest, UnsetFieldsAndBuiltinModelsNeedNoRoot) {
  v1::RunSpec spec;
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic();
  EXPECT_TRUE(ConfineRunSpecPaths(*PathPolicy::Create({}), &spec).ok());
  v1::RunSpec empty;
  EXPECT_TRUE(ConfineRunSpecPaths(Policy(), &empty).ok());
  EXPECT_FALSE(empty.has_model());  // Nothing written into a spec with nothing to confine.
  EXPECT_FALSE(empty.has_checkpoint());
}

TEST_F(RunPathsTest, AWorkerConfinesOnlyTheModelsPaths) {
  v1::RunSpec spec;
  spec.mutable_model()->set_hf_model_dir((root_ / "models" / "qwen").string());
  spec.mutable_task()->mutable_dataset()->set_path("/elsewhere/data.jsonl");
  spec.mutable_checkpoint()->set_dir("/on/the/trainers/host");
  const RunSpecPathUse model_only = {.model = true, .dataset = false, .checkpoint = false};
  EXPECT_TRUE(ConfineRunSpecPaths(Policy(), &spec, model_only).ok());
  EXPECT_EQ(spec.checkpoint().dir(), "/on/the/trainers/host");
  spec.mutable_model()->set_tokenizer_path("/etc/tokenizer.json");
  EXPECT_THAT(ConfineRunSpecPaths(Policy(), &spec, model_only).message(),
              HasSubstr("model.tokenizer_path '/etc/tokenizer.json' is outside"));
}

TEST_F(RunPathsTest, OnlyTheFieldsOutsideAreNamed) {
  v1::RunSpec spec;
  spec.mutable_model()->set_hf_model_dir((root_ / "models" / "qwen").string());
  spec.mutable_checkpoint()->set_dir((root_ / ".." / "elsewhere").string());
  const absl::Status status = ConfineRunSpecPaths(Policy(), &spec);
  EXPECT_THAT(status.message(), HasSubstr("checkpoint.dir"));
  EXPECT_THAT(status.message(), Not(HasSubstr("hf_model_dir")));
}

}  // namespace
}  // namespace sluice::run
