#include "common/model/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
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
using ::testing::HasSubstr;

// README.md of testdata/model_oracle: llama.cpp (float32) logits; two
// independent float32 codes agree within 2.5e-5, so 1e-4 has 4x headroom.
constexpr double kOracleTolerance = 1e-4;
constexpr int64_t kVocab = 258;
constexpr int kGreedySteps = 16;

std::string OracleDir(const std::string& model) {
  return absl::StrCat(SLUICE_TESTDATA_DIR, "/model_oracle/", model);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

struct OracleCase {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> argmax;
  std::vector<int64_t> greedy;
  torch::Tensor logits;         // [T, V]
  torch::Tensor greedy_logits;  // [16, V]
};

torch::Tensor Rows(const std::string& path, int64_t offset, int64_t rows) {
  const std::string bytes = ReadAll(path);
  EXPECT_GE(bytes.size(), static_cast<size_t>((offset + rows) * kVocab * 4));
  torch::Tensor out = torch::empty({rows, kVocab}, torch::kFloat32);
  std::memcpy(out.data_ptr<float>(), bytes.data() + offset * kVocab * 4, rows * kVocab * 4);
  return out;
}

std::vector<OracleCase> LoadCases(const std::string& model) {
  const std::string dir = OracleDir(model);
  std::vector<OracleCase> cases;
  std::ifstream in(dir + "/cases.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json json = nlohmann::json::parse(line);
    OracleCase c;
    c.input_ids = json["input_ids"].get<std::vector<int64_t>>();
    c.argmax = json["argmax_per_position"].get<std::vector<int64_t>>();
    c.greedy = json["greedy_16"].get<std::vector<int64_t>>();
    c.logits = Rows(dir + "/" + json["logits_file"].get<std::string>(),
                    json["logits_row_offset"].get<int64_t>(), c.input_ids.size());
    c.greedy_logits = Rows(dir + "/" + json["greedy_logits_file"].get<std::string>(),
                           json["greedy_logits_row_offset"].get<int64_t>(), kGreedySteps);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), 4u);
  return cases;
}

torch::Tensor Ids(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::kInt64).unsqueeze(0);
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Full-sequence logits [T, V] of `ids`.
torch::Tensor FullLogits(const Transformer& model, const std::vector<int64_t>& ids) {
  torch::NoGradGuard no_grad;
  return model.Forward(Ids(ids))[0];
}

class OracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleTest, FullForwardMatchesLlamaCppLogits) {
  absl::StatusOr<HfModel> loaded = LoadHfModel(OracleDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  double worst = 0;
  for (const OracleCase& c : LoadCases(GetParam())) {
    torch::Tensor logits = FullLogits(*loaded->model, c.input_ids);
    ASSERT_EQ(logits.sizes(), c.logits.sizes());
    const double diff = MaxAbsDiff(logits, c.logits);
    worst = std::max(worst, diff);
    EXPECT_LE(diff, kOracleTolerance) << "T=" << c.input_ids.size();
    const torch::Tensor argmax = logits.argmax(-1);
    for (size_t t = 0; t < c.argmax.size(); ++t) {
      EXPECT_EQ(argmax[t].item<int64_t>(), c.argmax[t]) << "T=" << c.input_ids.size() << " t=" << t;
    }
  }
  std::cout << GetParam() << " full forward: max |logit - llama.cpp| = " << worst << "\n";
}

TEST_P(OracleTest, GreedyByFullForwardMatchesLlamaCpp) {
  absl::StatusOr<HfModel> loaded = LoadHfModel(OracleDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  double worst = 0;
  for (const OracleCase& c : LoadCases(GetParam())) {
    std::vector<int64_t> sequence = c.input_ids;
    for (int j = 0; j < kGreedySteps; ++j) {
      const torch::Tensor last = FullLogits(*loaded->model, sequence)[-1];
      const double diff = MaxAbsDiff(last, c.greedy_logits[j]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, kOracleTolerance) << "step " << j;
      const int64_t token = last.argmax().item<int64_t>();
      ASSERT_EQ(token, c.greedy[j]) << "T=" << c.input_ids.size() << " step " << j;
      sequence.push_back(token);
    }
  }
  std::cout << GetParam() << " greedy (full forward): max |logit - llama.cpp| = " << worst << "\n";
}

TEST_P(OracleTest, GreedyThroughKvCacheMatchesLlamaCpp) {
  absl::StatusOr<HfModel> loaded = LoadHfModel(OracleDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Transformer& model = *loaded->model;
  torch::NoGradGuard no_grad;
  double worst = 0;
  for (const OracleCase& c : LoadCases(GetParam())) {
    const int64_t prompt = c.input_ids.size();
    KVCache cache = model.NewCache(1, prompt + kGreedySteps);
    torch::Tensor logits =
        model.ForwardCached(Ids(c.input_ids), torch::arange(prompt, torch::kInt64).unsqueeze(0),
                            torch::ones({1, prompt}, torch::kInt64), cache)[0];
    // The cached prefill gives the prompt logits too.
    worst = std::max(worst, MaxAbsDiff(logits, c.logits));
    EXPECT_LE(MaxAbsDiff(logits, c.logits), kOracleTolerance);
    torch::Tensor last = logits[-1];
    for (int j = 0; j < kGreedySteps; ++j) {
      const double diff = MaxAbsDiff(last, c.greedy_logits[j]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, kOracleTolerance) << "step " << j;
      const int64_t token = last.argmax().item<int64_t>();
      ASSERT_EQ(token, c.greedy[j]) << "T=" << prompt << " step " << j;
      const int64_t position = prompt + j;
      last = model.ForwardCached(Ids({token}), torch::full({1, 1}, position, torch::kInt64),
                                 torch::ones({1, position + 1}, torch::kInt64), cache)[0][-1];
    }
  }
  std::cout << GetParam() << " greedy (KV cache): max |logit - llama.cpp| = " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Models, OracleTest, ::testing::Values("qwen2_tiny", "llama_tiny"));

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("hf_checkpoint_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A copy of an oracle model directory to corrupt.
  std::string CopyOf(const std::string& model) {
    const fs::path target = dir_ / model;
    fs::create_directories(target);
    for (const char* name : {"config.json", "model.safetensors"}) {
      fs::copy_file(fs::path(OracleDir(model)) / name, target / name);
    }
    return target.string();
  }

  // Rewrites dir/model.safetensors with `edit` applied to its tensor list.
  void EditWeights(const std::string& dir,
                   const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<TensorToWrite> tensors;
    for (const TensorView& view : (*file)->tensors()) {
      tensors.push_back({view.name, view.dtype, view.shape,
                         absl::string_view(reinterpret_cast<const char*>(view.data.data()),
                                           view.data.size())});
    }
    edit(tensors);
    // Write beside, then replace: `tensors` points into the open mapping.
    ASSERT_TRUE(WriteSafetensors(dir + "/edited.safetensors", tensors).ok());
    file->reset();
    fs::rename(dir + "/edited.safetensors", dir + "/model.safetensors");
  }

  std::string LoadError(const std::string& dir) {
    absl::StatusOr<HfModel> loaded = LoadHfModel(dir);
    EXPECT_FALSE(loaded.ok());
    return std::string(loaded.status().message());
  }

  fs::path dir_;
};

TEST_F(HfCheckpointTest, F32SaveLoadIsExactSingleAndSharded) {
  for (const std::string model : {"qwen2_tiny", "llama_tiny"}) {
    absl::StatusOr<HfModel> original = LoadHfModel(OracleDir(model));
    ASSERT_TRUE(original.ok()) << original.status();
    const std::vector<int64_t> ids = LoadCases(model)[2].input_ids;
    const torch::Tensor expected = FullLogits(*original->model, ids);
    for (int64_t max_shard_bytes : {int64_t{0}, int64_t{64} << 10}) {
      const std::string out = (dir_ / absl::StrCat(model, "_", max_shard_bytes)).string();
      WriteAll(dir_.string() + "/tokenizer.json", "{\"fake\": true}");
      SaveHfOptions options;
      options.max_shard_bytes = max_shard_bytes;
      options.extra_files = {dir_.string() + "/tokenizer.json"};
      ASSERT_TRUE(SaveHfModel(out, *original->model, options).ok());
      EXPECT_EQ(fs::exists(out + "/model.safetensors.index.json"), max_shard_bytes > 0);
      EXPECT_EQ(ReadAll(out + "/tokenizer.json"), "{\"fake\": true}");
      if (max_shard_bytes > 0) {
        std::set<std::string> shards;
        const nlohmann::json index =
            nlohmann::json::parse(ReadAll(out + "/model.safetensors.index.json"));
        for (const auto& [name, shard] : index["weight_map"].items()) {
          shards.insert(shard.get<std::string>());
        }
        EXPECT_GT(shards.size(), 2u);
      }
      absl::StatusOr<HfModel> reloaded = LoadHfModel(out);
      ASSERT_TRUE(reloaded.ok()) << reloaded.status();
      EXPECT_EQ(reloaded->config.ToJson(), original->config.ToJson());
      EXPECT_TRUE(torch::equal(FullLogits(*reloaded->model, ids), expected)) << model;
      // A tied model is saved without lm_head, as transformers does.
      auto checkpoint = SafetensorsCheckpoint::Open(out);
      ASSERT_TRUE(checkpoint.ok());
      EXPECT_EQ((*checkpoint)->Find("lm_head.weight") == nullptr,
                original->config.tie_word_embeddings);
    }
  }
}

// bf16 keeps 8 mantissa bits: each weight moves by up to 2^-9 relative, and
// the logits of these deliberately large-scale models (|logit| up to 28) move
// by up to 0.021 * max|logit| (measured: 0.32 of 15.7, llama T=100). The
// bound 0.05 * max|logit| leaves ~2.4x headroom while a wrong conversion
// (bytes read as f16, a swapped tensor) moves logits by O(max|logit|).
// Argmax is compared where the float32 top-2 margin exceeds that bound, so a
// near-tie cannot flip the test.
TEST_F(HfCheckpointTest, Bf16SaveLoadKeepsLogitsClose) {
  for (const std::string model : {"qwen2_tiny", "llama_tiny"}) {
    absl::StatusOr<HfModel> original = LoadHfModel(OracleDir(model));
    ASSERT_TRUE(original.ok()) << original.status();
    const std::string out = (dir_ / model).string();
    SaveHfOptions options;
    options.dtype = DType::kBF16;
    ASSERT_TRUE(SaveHfModel(out, *original->model, options).ok());
    auto file = SafetensorsFile::Open(out + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    EXPECT_EQ((*file)->Find("model.norm.weight")->dtype, DType::kBF16);
    EXPECT_THAT(ReadAll(out + "/config.json"), HasSubstr("\"torch_dtype\": \"bfloat16\""));

    absl::StatusOr<HfModel> reloaded = LoadHfModel(out);
    ASSERT_TRUE(reloaded.ok()) << reloaded.status();
    for (const OracleCase& c : LoadCases(model)) {
      const torch::Tensor expected = FullLogits(*original->model, c.input_ids);
      const torch::Tensor actual = FullLogits(*reloaded->model, c.input_ids);
      const double scale = expected.abs().max().item<double>();
      const double bound = 0.05 * scale;
      EXPECT_LE(MaxAbsDiff(actual, expected), bound) << model << " T=" << c.input_ids.size();
      std::cout << model << " bf16 T=" << c.input_ids.size()
                << ": max |logit diff| = " << MaxAbsDiff(actual, expected)
                << " (max |logit| " << scale << ")\n";
      EXPECT_GT(MaxAbsDiff(actual, expected), 0.0);  // it really went through bf16
      const auto top2 = expected.topk(2, -1);
      const torch::Tensor margin = std::get<0>(top2).select(-1, 0) - std::get<0>(top2).select(-1, 1);
      const torch::Tensor clear = margin > bound;
      const torch::Tensor same = expected.argmax(-1) == actual.argmax(-1);
      EXPECT_TRUE((same | ~clear).all().item<bool>()) << model << " T=" << c.input_ids.size();
    }
  }
}

TEST_F(HfCheckpointTest, MissingUnknownMisshapedAndWrongDtypeTensorsAreNamed) {
  std::string dir = CopyOf("qwen2_tiny");
  EditWeights(dir, [](std::vector<TensorToWrite>& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const TensorToWrite& x) { return x.name == "model.norm.weight"; }),
            t.end());
  });
  EXPECT_THAT(LoadError(dir), HasSubstr("missing tensor \"model.norm.weight\""));

  static const std::string extra(16, '\0');
  dir = CopyOf("llama_tiny");
  EditWeights(dir, [](std::vector<TensorToWrite>& t) {
    t.push_back({"model.layers.0.mlp.extra.weight", DType::kF32, {4}, extra});
  });
  EXPECT_THAT(LoadError(dir), HasSubstr("unknown tensor \"model.layers.0.mlp.extra.weight\""));

  fs::remove_all(dir_ / "qwen2_tiny");
  dir = CopyOf("qwen2_tiny");
  EditWeights(dir, [](std::vector<TensorToWrite>& t) {
    for (TensorToWrite& x : t) {
      if (x.name == "model.norm.weight") {
        x.shape = {32};
        x.data = x.data.substr(0, 128);
      }
    }
  });
  EXPECT_THAT(LoadError(dir), HasSubstr("tensor \"model.norm.weight\" has shape [32]"));

  fs::remove_all(dir_ / "qwen2_tiny");
  dir = CopyOf("qwen2_tiny");
  EditWeights(dir, [](std::vector<TensorToWrite>& t) {
    for (TensorToWrite& x : t) {
      if (x.name == "model.norm.weight") {
        x.dtype = DType::kI32;  // same byte size
      }
    }
  });
  EXPECT_THAT(LoadError(dir), HasSubstr("tensor \"model.norm.weight\" is not floating point"));
}

TEST_F(HfCheckpointTest, CorruptWeightsAndConfigsAreClearErrors) {
  std::string dir = CopyOf("llama_tiny");
  // Truncated weights file.
  const std::string bytes = ReadAll(dir + "/model.safetensors");
  WriteAll(dir + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  EXPECT_THAT(LoadError(dir), HasSubstr("run past the end of the data region"));
  fs::remove(dir + "/model.safetensors");
  EXPECT_THAT(LoadError(dir), HasSubstr("no model.safetensors or model.safetensors.index.json"));

  fs::remove_all(dir);
  dir = CopyOf("llama_tiny");
  nlohmann::json config = nlohmann::json::parse(ReadAll(dir + "/config.json"));
  config["architectures"] = {"MistralForCausalLM"};
  WriteAll(dir + "/config.json", config.dump());
  EXPECT_THAT(LoadError(dir), HasSubstr("unsupported \"MistralForCausalLM\""));
  config["architectures"] = {"LlamaForCausalLM"};
  config.erase("num_hidden_layers");
  WriteAll(dir + "/config.json", config.dump());
  EXPECT_THAT(LoadError(dir), HasSubstr("num_hidden_layers: missing"));
  config["num_hidden_layers"] = 3;  // the weights have 2 layers
  WriteAll(dir + "/config.json", config.dump());
  EXPECT_THAT(LoadError(dir), HasSubstr("missing tensor \"model.layers.2."));
  config["num_hidden_layers"] = 2;
  config["torch_dtype"] = "int8";
  WriteAll(dir + "/config.json", config.dump());
  EXPECT_THAT(LoadError(dir), HasSubstr("torch_dtype"));
  fs::remove(dir + "/config.json");
  EXPECT_EQ(LoadHfModel(dir).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HfCheckpointTest, ShardedCheckpointErrorsAreNamed) {
  absl::StatusOr<HfModel> original = LoadHfModel(OracleDir("qwen2_tiny"));
  ASSERT_TRUE(original.ok());
  const std::string out = (dir_ / "sharded").string();
  SaveHfOptions options;
  options.max_shard_bytes = 64 << 10;
  ASSERT_TRUE(SaveHfModel(out, *original->model, options).ok());
  const std::string shard = nlohmann::json::parse(ReadAll(out + "/model.safetensors.index.json"))
                                ["weight_map"]["model.norm.weight"];
  fs::remove(out + "/" + shard);
  EXPECT_THAT(LoadError(out), HasSubstr("shard file " + shard));
}

TEST_F(HfCheckpointTest, SaveRejectsUnsupportedDtypeAndMissingExtraFile) {
  absl::StatusOr<HfModel> original = LoadHfModel(OracleDir("llama_tiny"));
  ASSERT_TRUE(original.ok());
  SaveHfOptions options;
  options.dtype = DType::kI32;
  EXPECT_EQ(SaveHfModel((dir_ / "a").string(), *original->model, options).code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.extra_files = {(dir_ / "absent.json").string()};
  EXPECT_EQ(SaveHfModel((dir_ / "b").string(), *original->model, options).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice::model
