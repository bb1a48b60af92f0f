#include "common/logging.h"

#include <memory>
#include <mutex>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace sluice::log {
namespace {

struct LoggerState {
  std::string component = "sluice";
  Level level = Level::kInfo;
  Format format = Format::kText;
  std::shared_ptr<spdlog::logger> sink;
};

// Leaked on purpose: logging must keep working while static destructors run.
LoggerState& State() {
  static LoggerState* state = [] {
    auto* s = new LoggerState;
    // spdlog owns the stderr sink and its lock; records are formatted by us
    // so the pattern is the bare payload.
    s->sink = std::make_shared<spdlog::logger>(
        "sluice", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    s->sink->set_pattern("%v");
    s->sink->set_level(spdlog::level::trace);
    s->sink->flush_on(spdlog::level::trace);
    return s;
  }();
  return *state;
}

std::mutex& InitMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarning: return "warning";
    case Level::kError: return "error";
  }
  return "info";
}

const char* LevelTag(Level level) {
  switch (level) {
    case Level::kDebug: return "DEBUG";
    case Level::kInfo: return "INFO ";
    case Level::kWarning: return "WARN ";
    case Level::kError: return "ERROR";
  }
  return "INFO ";
}

std::string TextValue(const Field::Value& value) {
  struct Visitor {
    std::string operator()(const std::string& s) const {
      bool needs_quotes = s.empty();
      for (char c : s) {
        if (c == ' ' || c == '"' || c == '=' || c == '\n' || c == '\t') {
          needs_quotes = true;
          break;
        }
      }
      if (!needs_quotes) return s;
      return nlohmann::json(s).dump(-1, ' ', false,
                                    nlohmann::json::error_handler_t::replace);
    }
    std::string operator()(int64_t v) const { return absl::StrCat(v); }
    std::string operator()(uint64_t v) const { return absl::StrCat(v); }
    std::string operator()(double v) const { return absl::StrCat(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
  };
  return std::visit(Visitor{}, value);
}

nlohmann::json JsonValue(const Field::Value& value) {
  return std::visit([](const auto& v) { return nlohmann::json(v); }, value);
}

}  // namespace

absl::StatusOr<Level> ParseLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower == "debug") return Level::kDebug;
  if (lower == "info") return Level::kInfo;
  if (lower == "warning" || lower == "warn") return Level::kWarning;
  if (lower == "error") return Level::kError;
  return absl::InvalidArgumentError(absl::StrCat(
      "log level must be one of debug, info, warning, error; got '", name, "'"));
}

absl::StatusOr<Format> ParseFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower == "text") return Format::kText;
  if (lower == "json") return Format::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("log format must be 'text' or 'json'; got '", name, "'"));
}

void Init(absl::string_view component, Level level, Format format) {
  std::lock_guard<std::mutex> lock(InitMutex());
  LoggerState& state = State();
  state.component = std::string(component);
  state.level = level;
  state.format = format;
}

std::string FormatRecord(Format format, absl::string_view component, Level level,
                         absl::string_view timestamp, absl::string_view message,
                         Fields fields) {
  if (format == Format::kJson) {
    nlohmann::ordered_json record;
    record["ts"] = std::string(timestamp);
    record["level"] = LevelName(level);
    record["component"] = std::string(component);
    record["msg"] = std::string(message);
    for (const Field& field : fields) {
      record[std::string(field.key)] = JsonValue(field.value);
    }
    return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = absl::StrCat(timestamp, " ", LevelTag(level), " ",
                                  component, " ", message);
  for (const Field& field : fields) {
    absl::StrAppend(&line, " ", field.key, "=", TextValue(field.value));
  }
  return line;
}

void Write(Level level, absl::string_view message, Fields fields) {
  LoggerState& state = State();
  if (level < state.level) return;
  const std::string timestamp =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  state.sink->info(
      FormatRecord(state.format, state.component, level, timestamp, message, fields));
}

}  // namespace sluice::log
