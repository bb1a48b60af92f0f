// Runs the fuzz target over a corpus without libFuzzer: the regression test
// that the g++ build (and ctest) runs on every input the fuzzer and the
// Math-Verify cases have ever found interesting.
//
//   math_fuzz_replay PATH...   each PATH a file (one input), a directory (each
//                              file one input) or a .jsonl file (each line's
//                              "gold", "prediction" and the pair joined by NUL)
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int64_t Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  return 1;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path path(argv[i]);
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) inputs += Run(ReadFile(entry.path()));
      }
    } else if (path.extension() == ".jsonl") {
      std::ifstream in(path);
      if (!in) {
        std::cerr << "math_fuzz_replay: cannot open " << path << "\n";
        return 1;
      }
      std::string line;
      while (std::getline(in, line)) {
        const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
        if (!row.is_object()) continue;
        const std::string gold = row.value("gold", "");
        const std::string prediction = row.value("prediction", "");
        inputs += Run(gold) + Run(prediction) + Run(gold + std::string(1, '\0') + prediction);
      }
    } else if (std::filesystem::is_regular_file(path, error)) {
      inputs += Run(ReadFile(path));
    } else {
      std::cerr << "math_fuzz_replay: no such file or directory: " << path << "\n";
      return 1;
    }
  }
  std::cout << "math_fuzz_replay: " << inputs << " inputs, no crash\n";
  return 0;
}
