#include "common/model/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("safetensors_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }
  static void WriteAll(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  // A raw file: 8-byte length, `header` verbatim, `data`.
  static std::string RawFile(const std::string& header, const std::string& data) {
    std::string bytes(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
    return bytes + header + data;
  }
  absl::Status OpenRaw(const std::string& header, const std::string& data) {
    const std::string path = Path("raw.safetensors");
    WriteAll(path, RawFile(header, data));
    return SafetensorsFile::Open(path).status();
  }

  fs::path dir_;
};

std::string Floats(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

TEST_F(SafetensorsTest, WriteThenReadRoundTripsTensorsAndMetadata) {
  const std::string a = Floats({1, 2, 3, 4, 5, 6});
  const std::string b = Floats({-1.5f});
  const std::string c(4, '\x01');  // two BF16
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"b", DType::kF32, {1}, b},
                                {"a", DType::kF32, {2, 3}, a},
                                {"c", DType::kBF16, {2}, c},
                                {"empty", DType::kF32, {0, 4}, ""}},
                               {{"format", "pt"}})
                  .ok());
  const std::string bytes = ReadAll(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  // Tensors are stored in sorted-name order.
  EXPECT_EQ(bytes.substr(8 + header_size, a.size()), a);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->names(), ElementsAre("a", "b", "c", "empty"));
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const TensorView* view = (*file)->Find("a");
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->dtype, DType::kF32);
  EXPECT_THAT(view->shape, ElementsAre(2, 3));
  EXPECT_EQ(view->num_elements(), 6);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(view->data.data()), view->data.size()), a);
  EXPECT_EQ((*file)->Find("c")->dtype, DType::kBF16);
  EXPECT_EQ((*file)->Find("empty")->data.size(), 0u);
  EXPECT_EQ((*file)->Find("nope"), nullptr);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(getpid())));
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const std::string path = Path("bad.safetensors");
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"x", DType::kF32, {3}, Floats({1, 2})}})
                              .message()),
              HasSubstr("tensor \"x\": shape [3] of F32 needs 12 bytes, got 8"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"x", DType::kF32, {1}, Floats({1})},
                                                  {"x", DType::kF32, {1}, Floats({1})}})
                              .message()),
              HasSubstr("given twice"));
  EXPECT_FALSE(WriteSafetensors(path, {{"x", DType::kF32, {-1}, ""}}).ok());
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, OpenMissingFileIsNotFound) {
  EXPECT_EQ(SafetensorsFile::Open(Path("absent.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, EveryTruncationIsAnErrorNamingWhere) {
  const std::string path = Path("full.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w1", DType::kF32, {4, 4}, std::string(64, 'x')},
                                      {"w2", DType::kF32, {8}, std::string(32, 'y')}})
                  .ok());
  const std::string bytes = ReadAll(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const std::string cut = Path("cut.safetensors");
  for (size_t size = 0; size < bytes.size(); size += 3) {
    WriteAll(cut, bytes.substr(0, size));
    const absl::Status status = SafetensorsFile::Open(cut).status();
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "size " << size;
    const std::string message(status.message());
    if (size < 8) {
      EXPECT_THAT(message, HasSubstr("too short")) << size;
    } else if (size < 8 + header_size) {
      EXPECT_THAT(message, HasSubstr("runs past the end of the file at byte " + std::to_string(size)));
    } else if (size < 8 + header_size + 64) {
      EXPECT_THAT(message, HasSubstr("tensor \"w1\"")) << message;
      EXPECT_THAT(message, HasSubstr("truncated")) << message;
    } else {
      EXPECT_THAT(message, HasSubstr("tensor \"w2\"")) << message;
    }
  }
}

TEST_F(SafetensorsTest, CorruptHeadersAreErrorsNamingTheTensor) {
  const std::string data(16, '\0');
  auto message = [&](const std::string& header) {
    return std::string(OpenRaw(header, data).message());
  };
  EXPECT_THAT(message("{not json"), HasSubstr("is not valid JSON"));
  EXPECT_THAT(message("[1, 2]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(message(R"({"x": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})"),
              HasSubstr("tensor \"x\": unsupported dtype \"F64\""));
  EXPECT_THAT(message(R"({"q": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}})"),
              HasSubstr("tensor \"q\": unsupported dtype \"Q4\""));
  EXPECT_THAT(message(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"),
              HasSubstr("tensor \"x\": shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8"));
  EXPECT_THAT(message(R"({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})"),
              HasSubstr("tensor \"x\": \"shape\" must hold non-negative integers"));
  EXPECT_THAT(message(R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})"),
              HasSubstr("tensor \"x\": data_offsets [8, 24] run past the end of the data region"));
  EXPECT_THAT(message(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})"),
              HasSubstr("tensor \"x\": data_offsets [8, 0] end before they begin"));
  EXPECT_THAT(message(R"({"x": {"dtype": "F32", "shape": [2]}})"),
              HasSubstr("tensor \"x\": \"data_offsets\" missing"));
  EXPECT_THAT(message(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})"),
              HasSubstr("tensor \"b\" (data_offsets [4, 12]) overlaps tensor \"a\""));
  EXPECT_THAT(message(R"({"__metadata__": {"n": 3}})"), HasSubstr("\"__metadata__\" value of \"n\""));
  // A header length beyond the file.
  std::string bytes = RawFile("{}", "");
  bytes[0] = static_cast<char>(200);
  WriteAll(Path("long.safetensors"), bytes);
  EXPECT_THAT(std::string(SafetensorsFile::Open(Path("long.safetensors")).status().message()),
              HasSubstr("header length 200 (bytes 0..7) runs past the end of the file at byte 10"));
  // Huge length (all bits set) must not overflow the bounds check.
  bytes = RawFile("{}", "");
  for (int i = 0; i < 8; ++i) bytes[i] = '\xff';
  WriteAll(Path("huge.safetensors"), bytes);
  EXPECT_THAT(std::string(SafetensorsFile::Open(Path("huge.safetensors")).status().message()),
              HasSubstr("runs past the end of the file"));
}

TEST_F(SafetensorsTest, ShardedWriteSplitsAndReadsBack) {
  std::vector<std::string> data;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 5; ++i) data.push_back(std::string(40, static_cast<char>('a' + i)));
  for (int i = 0; i < 5; ++i) tensors.push_back({absl::StrCat("t", i), DType::kF32, {10}, data[i]});
  const std::string dir = Path("sharded");
  absl::StatusOr<std::vector<std::string>> written = WriteShardedSafetensors(dir, tensors, 100);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written, ElementsAre("model-00001-of-00003.safetensors",
                                    "model-00002-of-00003.safetensors",
                                    "model-00003-of-00003.safetensors",
                                    "model.safetensors.index.json"));
  const nlohmann::json index = nlohmann::json::parse(ReadAll(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 200);
  EXPECT_EQ(index["weight_map"]["t4"], "model-00003-of-00003.safetensors");

  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT((*checkpoint)->names(), ElementsAre("t0", "t1", "t2", "t3", "t4"));
  EXPECT_EQ((*checkpoint)->files().size(), 3u);
  const TensorView* t3 = (*checkpoint)->Find("t3");
  ASSERT_NE(t3, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t3->data.data()), t3->data.size()), data[3]);

  // Saving again unsharded replaces the shards with one file.
  written = WriteShardedSafetensors(dir, tensors, 0);
  ASSERT_TRUE(written.ok());
  EXPECT_THAT(*written, ElementsAre("model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00003.safetensors"));
  checkpoint = SafetensorsCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->files().size(), 1u);
  EXPECT_EQ((*checkpoint)->names().size(), 5u);
}

TEST_F(SafetensorsTest, ShardedIndexErrorsNameTheShardOrTensor) {
  const std::string one(4, 'a');
  const std::string dir = Path("bad");
  fs::create_directories(dir);
  ASSERT_TRUE(WriteSafetensors(dir + "/s1.safetensors", {{"x", DType::kF32, {1}, one}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/s2.safetensors",
                               {{"x", DType::kF32, {1}, one}, {"y", DType::kF32, {1}, one}})
                  .ok());
  auto open_with = [&](const std::string& weight_map) {
    WriteAll(dir + "/model.safetensors.index.json",
             R"({"metadata": {"total_size": 8}, "weight_map": )" + weight_map + "}");
    return std::string(SafetensorsCheckpoint::Open(dir).status().message());
  };
  EXPECT_THAT(open_with(R"({"x": "missing.safetensors"})"),
              HasSubstr("shard file missing.safetensors (of tensor \"x\") does not exist"));
  EXPECT_THAT(open_with(R"({"x": "s1.safetensors", "y": "s2.safetensors"})"),
              HasSubstr("tensor \"x\" is in two shards: s1.safetensors and s2.safetensors"));
  EXPECT_THAT(open_with(R"({"x": "../s1.safetensors"})"), HasSubstr("not a file name"));
  EXPECT_THAT(open_with(R"({"x": "s1.safetensors", "z": "s1.safetensors"})"),
              HasSubstr("maps tensor \"z\" to shard s1.safetensors, which does not hold it"));
  EXPECT_THAT(open_with(R"([1])"), HasSubstr("weight_map"));
  // Refused before it is read whole (sparse: takes no disk).
  fs::resize_file(dir + "/model.safetensors.index.json", (100u << 20) + 1);
  EXPECT_THAT(std::string(SafetensorsCheckpoint::Open(dir).status().message()),
              HasSubstr("model.safetensors.index.json: 104857601 bytes exceeds the limit"));
  fs::remove(dir + "/model.safetensors.index.json");
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice::model
