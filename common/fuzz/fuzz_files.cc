#include "common/fuzz/fuzz_files.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace sluice::fuzz {

const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                       "/sluice-fuzz-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz: cannot make a scratch directory");
      std::abort();
    }
    std::atexit([] {
      std::error_code error;
      std::filesystem::remove_all(ScratchDir(), error);
    });
    return new std::string(pattern);
  }();
  return *dir;
}

std::string WriteScratchFile(absl::string_view name, absl::string_view data) {
  const std::string path = absl::StrCat(ScratchDir(), "/", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) {
    std::perror(absl::StrCat("fuzz: cannot write ", path).c_str());
    std::abort();
  }
  return path;
}

}  // namespace sluice::fuzz
