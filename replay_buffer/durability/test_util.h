#ifndef SLUICE_REPLAY_BUFFER_DURABILITY_TEST_UTIL_H_
#define SLUICE_REPLAY_BUFFER_DURABILITY_TEST_UTIL_H_

// Helpers for the durability tests: a fresh directory per test and blunt
// tools to damage files the way crashes and bad disks do.

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::replay_buffer::durability::testing_util {

// A new empty directory under testing::TempDir(), removed with its content.
class TempDirectory {
 public:
  TempDirectory() {
    std::string pattern = ::testing::TempDir();
    if (pattern.empty() || pattern.back() != '/') pattern += '/';
    pattern += "durability_test_XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = buffer.data();
  }
  ~TempDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteFileOrDie(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  EXPECT_TRUE(out.good()) << path;
}

inline void FlipByte(const std::string& path, uint64_t offset) {
  std::string content = ReadFileOrDie(path);
  ASSERT_LT(offset, content.size()) << path;
  content[offset] = static_cast<char>(content[offset] ^ 0x40);
  WriteFileOrDie(path, content);
}

inline void TruncateTo(const std::string& path, uint64_t size) {
  std::filesystem::resize_file(path, size);
}

inline uint64_t SizeOf(const std::string& path) { return std::filesystem::file_size(path); }

// Names in `dir`, sorted.
inline std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace sluice::replay_buffer::durability::testing_util

#endif  // SLUICE_REPLAY_BUFFER_DURABILITY_TEST_UTIL_H_
