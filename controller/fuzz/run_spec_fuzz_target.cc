// libFuzzer target for what a client sends the controller as a run: a YAML
// run spec (`sluice submit spec.yaml`) and a binary SubmitRunRequest (any
// gRPC client). Both go through the whole of SubmitRun's checking, as
// `sluice submit --validate-only` does it offline: ParseRunSpecYaml, then
// ResolveDefaults, ValidateRunSpec, the verifier names and the memory
// estimate (ValidateSpecOffline). None may crash, hang or allocate without
// bound; each bad input gets an error.
//
// The input is read both ways: as YAML text and, when it parses as one, as a
// serialized SubmitRunRequest (YAML text rarely does; the corpus holds
// binary seeds). A spec's files are replaced by fixtures written once to a
// scratch directory (a small Llama model directory, a dataset whose row suits
// every format), so that validation reads files the fuzzer controls the
// choice of but not the path: the fuzzer must not read /dev/zero or the
// machine's files. The dataset and model file parsers have their own targets.
//
// Checked on the way: ResolveDefaults is idempotent (run_spec.h), and every
// spec that parses prints as JSON (spec.json).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/fuzz/fuzz_files.h"
#include "common/task/char_tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "controller/proto_json.h"
#include "controller/run_spec.h"
#include "controller/spec_yaml.h"
#include "sluice/v1/controller.pb.h"

namespace {

namespace controller = sluice::controller;
namespace v1 = sluice::v1;

struct Fixtures {
  std::string model_dir;
  std::string tokenizer;
  std::string dataset;
};

const Fixtures& GetFixtures() {
  static const Fixtures* const fixtures = [] {
    using sluice::fuzz::WriteScratchFile;
    auto* made = new Fixtures();
    // A Llama model directory over the builtin character tokenizer.
    const std::string tokenizer = sluice::task::CharTokenizer().ToHfTokenizerJson();
    made->tokenizer = WriteScratchFile("tokenizer.json", tokenizer);
    made->model_dir = sluice::fuzz::ScratchDir();
    WriteScratchFile("config.json", R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 258,
  "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": 1,
  "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32"})");
    // One row with the columns of every format (GSM8K, MATH, HumanEval and
    // JSONL's default prompt / answer).
    made->dataset = WriteScratchFile("dataset.jsonl", R"({"question": "What is 2 + 2?", )"
        R"("answer": "2 + 2 = 4\n#### 4", "problem": "Compute $2+2$.", )"
        R"("solution": "It is $\\boxed{4}$.", "prompt": "def add(a, b):\n", )"
        R"("task_id": "Fuzz/0", "test": "assert add(2, 2) == 4\n", "entry_point": "add", )"
        R"("unique_id": "fuzz/0.json"})"
        "\n");
    return made;
  }();
  return *fixtures;
}

// Points every file a spec names at a fixture; an empty path stays empty
// (validation reports it).
void UseFixtures(v1::RunSpec& spec) {
  const Fixtures& fixtures = GetFixtures();
  v1::ModelConfig& model = *spec.mutable_model();
  if (model.has_hf_model_dir() && !model.hf_model_dir().empty()) {
    model.set_hf_model_dir(fixtures.model_dir);
  }
  if (!model.tokenizer_path().empty()) model.set_tokenizer_path(fixtures.tokenizer);
  if (spec.task().has_dataset() && !spec.task().dataset().path().empty()) {
    spec.mutable_task()->mutable_dataset()->set_path(fixtures.dataset);
  }
}

void Check(v1::RunSpec spec) {
  UseFixtures(spec);
  (void)controller::ProtoToJson(spec, /*pretty=*/true);
  const v1::RunSpec resolved = controller::ResolveDefaults(spec);
  if (!google::protobuf::util::MessageDifferencer::Equals(
          controller::ResolveDefaults(resolved), resolved)) {
    __builtin_trap();  // ResolveDefaults is documented idempotent.
  }
  (void)controller::ValidateSpecOffline(spec);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf logs every string field that is not UTF-8; the fuzzer makes
  // thousands a second.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  if (absl::StatusOr<v1::RunSpec> spec = controller::ParseRunSpecYaml(input, "fuzz.yaml");
      spec.ok()) {
    Check(*std::move(spec));
  }
  v1::SubmitRunRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) Check(request.spec());
  return 0;
}
