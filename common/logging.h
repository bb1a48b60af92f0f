#ifndef SLUICE_COMMON_LOGGING_H_
#define SLUICE_COMMON_LOGGING_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include "absl/strings/string_view.h"
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::log {

// Structured logging shared by every Sluice process.
//
// A record is a message plus typed key/value fields, written as one line to
// stderr, either for humans (text) or for log shippers (JSON lines):
//
//   text: 2026-11-22T10:00:00.123Z INFO  replay_buffer server started address=127.0.0.1:50054
//   json: {"ts":"2026-11-22T10:00:00.123Z","level":"info","component":"replay_buffer",
//          "msg":"server started","address":"127.0.0.1:50054"}
//
// Thread-safe: records from concurrent threads never interleave within a line.

enum class Level { kDebug, kInfo, kWarning, kError };
enum class Format { kText, kJson };

absl::StatusOr<Level> ParseLevel(absl::string_view name);
absl::StatusOr<Format> ParseFormat(absl::string_view name);

// One key/value pair of a record. Strings are quoted in text output when they
// contain spaces or quotes; numbers and booleans are never quoted.
struct Field {
  using Value = std::variant<std::string, int64_t, uint64_t, double, bool>;
  Field(absl::string_view k, absl::string_view v) : key(k), value(std::string(v)) {}
  Field(absl::string_view k, const std::string& v) : key(k), value(v) {}
  Field(absl::string_view k, const char* v) : key(k), value(std::string(v)) {}
  Field(absl::string_view k, int v) : key(k), value(int64_t{v}) {}
  Field(absl::string_view k, long v) : key(k), value(int64_t{v}) {}
  Field(absl::string_view k, long long v) : key(k), value(int64_t{v}) {}
  Field(absl::string_view k, unsigned v) : key(k), value(uint64_t{v}) {}
  Field(absl::string_view k, unsigned long v) : key(k), value(uint64_t{v}) {}
  Field(absl::string_view k, unsigned long long v) : key(k), value(uint64_t{v}) {}
  Field(absl::string_view k, double v) : key(k), value(v) {}
  Field(absl::string_view k, bool v) : key(k), value(v) {}
  absl::string_view key;
  Value value;
};

using Fields = std::initializer_list<Field>;

// Sets the process-wide logger. Call once from main before any thread logs;
// until then records go to stderr as text at level info with component "sluice".
void Init(absl::string_view component, Level level, Format format);

void Write(Level level, absl::string_view message, Fields fields = {});

inline void Debug(absl::string_view m, Fields f = {}) { Write(Level::kDebug, m, f); }
inline void Info(absl::string_view m, Fields f = {}) { Write(Level::kInfo, m, f); }
inline void Warning(absl::string_view m, Fields f = {}) { Write(Level::kWarning, m, f); }
inline void Error(absl::string_view m, Fields f = {}) { Write(Level::kError, m, f); }

// Formats a record without writing it; exposed for tests.
std::string FormatRecord(Format format, absl::string_view component, Level level,
                         absl::string_view timestamp, absl::string_view message,
                         Fields fields);

}  // namespace sluice::log

#endif  // SLUICE_COMMON_LOGGING_H_
