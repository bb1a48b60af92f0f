// libFuzzer target for the dataset readers (task::ReadDataset): a run spec
// names a dataset file, and the controller, the trainer and every rollout
// worker read it. Its bytes are arbitrary: gzip or not, any line lengths,
// any JSON; none may crash, hang or allocate without bound, and each bad row
// gets an error naming its line.
//
// The input is the whole file, read through the real path (gzip-transparent
// line reading, then ParseDatasetRow) once per format; JSONL also with
// other column names and with answers marked as solutions. The readers'
// answer extraction (Gsm8kFinalAnswer, LastBoxedContent) sees every string
// of the input as well.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/fuzz/fuzz_files.h"
#include "common/task/datasets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace task = sluice::task;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string path = sluice::fuzz::WriteScratchFile("dataset.jsonl", input);
  for (const task::DatasetKind kind : {task::DatasetKind::kJsonl, task::DatasetKind::kGsm8k,
                                       task::DatasetKind::kMath, task::DatasetKind::kHumanEval}) {
    (void)task::ReadDataset(path, kind);
  }
  task::DatasetReadOptions options;
  options.question_field = "question";
  options.answer_field = "solution";
  options.answer_is_solution = true;
  options.max_records = 2;
  (void)task::ReadDataset(path, task::DatasetKind::kJsonl, options);
  (void)task::Gsm8kFinalAnswer(input);
  (void)task::LastBoxedContent(input);
  return 0;
}
