// Runs a fuzz target over its corpus without libFuzzer: the regression test
// that the g++ build (and ctest's *FuzzReplay tests) runs on every input the
// fuzzer has ever found interesting, crash reproducers included. Linked into
// every <name>_fuzz_replay binary (sluice_fuzz_target in
// cmake/SluiceHelpers.cmake) beside that target's LLVMFuzzerTestOneInput.
//
//   <name>_fuzz_replay [--jsonl_fields=a,b] PATH...
//
// Each PATH is a file (one input) or a directory (each regular file in it one
// input). After --jsonl_fields=a,b a PATH ending in .jsonl is read as JSON
// Lines instead: each row gives the string columns a and b as inputs, and
// them joined by NUL bytes (the math target's gold and prediction pairs).
// A crash is the process dying, which fails the test; it first names the
// input it died on. The report names the input count and the slowest input,
// so a regression to a slow path shows.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, for the crash handler (which may only call
// async-signal-safe functions, so no std::string).
char current_input[4096];

void NameInputAndDie(int signal_number) {
  constexpr char kPrefix[] = "\nfuzz replay: crashed on input ";
  (void)!write(STDERR_FILENO, kPrefix, sizeof(kPrefix) - 1);
  (void)!write(STDERR_FILENO, current_input, strnlen(current_input, sizeof(current_input)));
  (void)!write(STDERR_FILENO, "\n", 1);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

struct Replay {
  int64_t inputs = 0;
  double slowest_ms = 0;
  std::string slowest;

  void Run(const std::string& input, const std::string& name) {
    std::strncpy(current_input, name.c_str(), sizeof(current_input) - 1);
    const auto start = std::chrono::steady_clock::now();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ++inputs;
    if (ms > slowest_ms) {
      slowest_ms = ms;
      slowest = name;
    }
  }
};

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> SplitFields(const std::string& list) {
  std::vector<std::string> fields;
  std::stringstream in(list);
  for (std::string field; std::getline(in, field, ',');) {
    if (!field.empty()) fields.push_back(field);
  }
  return fields;
}

// Each row's `fields`, one input each, then all of them joined by NUL.
bool ReplayJsonl(const std::filesystem::path& path, const std::vector<std::string>& fields,
                 Replay& replay) {
  std::ifstream in(path);
  if (!in) return false;
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object()) continue;
    std::string joined;
    for (size_t i = 0; i < fields.size(); ++i) {
      const std::string value = row.value(fields[i], "");
      const std::string name = path.string() + ":" + std::to_string(number) + ":" + fields[i];
      replay.Run(value, name);
      if (i > 0) joined.push_back('\0');
      joined += value;
    }
    if (fields.size() > 1) replay.Run(joined, path.string() + ":" + std::to_string(number));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  const std::string kFieldsFlag = "--jsonl_fields=";
  std::vector<std::string> jsonl_fields;
  for (const int signal_number : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) {
    std::signal(signal_number, NameInputAndDie);
  }
  Replay replay;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(kFieldsFlag, 0) == 0) {
      jsonl_fields = SplitFields(arg.substr(kFieldsFlag.size()));
      continue;
    }
    const std::filesystem::path path(arg);
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) replay.Run(ReadFile(entry.path()), entry.path().string());
      }
    } else if (!jsonl_fields.empty() && path.extension() == ".jsonl") {
      if (!ReplayJsonl(path, jsonl_fields, replay)) {
        std::cerr << program << ": cannot open " << path << "\n";
        return 1;
      }
    } else if (std::filesystem::is_regular_file(path, error)) {
      replay.Run(ReadFile(path), path.string());
    } else {
      std::cerr << program << ": no such file or directory: " << path << "\n";
      return 1;
    }
  }
  if (replay.inputs == 0) {
    std::cerr << program << ": no inputs (an empty corpus replays nothing)\n";
    return 1;
  }
  std::cout << program << ": " << replay.inputs << " inputs, no crash; slowest " << replay.slowest
            << " (" << replay.slowest_ms << " ms)\n";
  return 0;
}
