#include "controller/run_record_writer.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/logging.h"

namespace sluice::controller {

RunRecordWriter::RunRecordWriter(RunFiles files, RunRecordWriterOptions options)
    : files_(std::move(files)), options_(std::move(options)) {}

void RunRecordWriter::WriteState(std::string text, bool durable) {
  absl::MutexLock lock(&mu_);
  if (health_.behind) {
    // Superseded: only the newest state matters.
    const bool was_durable = owed_state_.has_value() && owed_state_->second;
    owed_state_.emplace(std::move(text), durable || was_durable);
    return;
  }
  if (absl::Status written = files_.WriteState(text, durable); !written.ok()) {
    owed_state_.emplace(std::move(text), durable);
    FailedLocked(files_.Path(RunFiles::kState), std::move(written));
  }
}

void RunRecordWriter::AppendMetrics(const google::protobuf::Message& step) {
  AppendLine(RunFiles::kMetrics, ToJson(step, /*pretty=*/false));
}

void RunRecordWriter::AppendEval(const google::protobuf::Message& eval) {
  AppendLine(RunFiles::kEvals, ToJson(eval, /*pretty=*/false));
}

void RunRecordWriter::AppendLine(const char* file, std::string text) {
  absl::MutexLock lock(&mu_);
  if (!health_.behind) {
    absl::Status written = AppendLineToFile(files_.Path(file), text);
    if (written.ok()) return;
    FailedLocked(files_.Path(file), std::move(written));
  }
  // Behind the lines already owed, in order.
  if (static_cast<int64_t>(owed_lines_.size()) >= options_.max_owed_lines) {
    ++health_.dropped_lines;
    return;
  }
  owed_lines_.push_back({file, std::move(text)});
}

void RunRecordWriter::WriteSummary(const google::protobuf::Message& summary) {
  std::string text = ToJson(summary, /*pretty=*/true);
  absl::MutexLock lock(&mu_);
  if (health_.behind) {
    owed_summary_ = std::move(text);
    return;
  }
  if (absl::Status written = WriteFileAtomically(files_.Path(RunFiles::kSummary), text,
                                                 /*durable=*/true);
      !written.ok()) {
    owed_summary_ = std::move(text);
    FailedLocked(files_.Path(RunFiles::kSummary), std::move(written));
  }
}

void RunRecordWriter::NoteFailure(absl::string_view path, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  FailedLocked(std::string(path), error);
}

void RunRecordWriter::FailedLocked(const std::string& path, absl::Status error) {
  const absl::Time now = absl::Now();
  ++health_.failed_writes;
  health_.path = path;
  health_.error = std::move(error);
  if (health_.behind) {
    if (now - last_warning_ >= options_.warning_interval) {
      last_warning_ = now;
      log::Warning("still cannot write the run's record; the run stays paused",
                   {{"dir", files_.dir()},
                    {"file", health_.path},
                    {"for_s", absl::ToInt64Seconds(now - health_.since)},
                    {"failed_writes", health_.failed_writes},
                    {"owed_lines", static_cast<int64_t>(owed_lines_.size())},
                    {"dropped_lines", health_.dropped_lines},
                    {"error", std::string(health_.error.message())}});
    }
    return;
  }
  health_.behind = true;
  health_.since = now;
  last_warning_ = now;
  log::Warning(
      "cannot write the run's record; what it could not write is kept and written once "
      "the runs directory takes writes again, and the run is paused meanwhile",
      {{"dir", files_.dir()}, {"file", path}, {"error", std::string(health_.error.message())}});
}

absl::Status RunRecordWriter::WriteOwedLocked() {
  while (!owed_lines_.empty()) {
    const Line& line = owed_lines_.front();
    const std::string path = files_.Path(line.file);
    if (absl::Status written = AppendLineToFile(path, line.text); !written.ok()) {
      FailedLocked(path, written);
      return written;
    }
    owed_lines_.pop_front();
  }
  if (owed_state_.has_value()) {
    if (absl::Status written = files_.WriteState(owed_state_->first, owed_state_->second);
        !written.ok()) {
      FailedLocked(files_.Path(RunFiles::kState), written);
      return written;
    }
    owed_state_.reset();
  }
  if (owed_summary_.has_value()) {
    const std::string path = files_.Path(RunFiles::kSummary);
    if (absl::Status written = WriteFileAtomically(path, *owed_summary_, /*durable=*/true);
        !written.ok()) {
      FailedLocked(path, written);
      return written;
    }
    owed_summary_.reset();
  }
  return absl::OkStatus();
}

absl::Status RunRecordWriter::Retry() {
  absl::MutexLock lock(&mu_);
  if (!health_.behind) return absl::OkStatus();
  // A failure is logged (rate-limited) by FailedLocked.
  const absl::Status written = WriteOwedLocked();
  if (!written.ok()) return written;
  const absl::Time now = absl::Now();
  log::Info("the run's record is written again",
            {{"dir", files_.dir()},
             {"outage_ms", absl::ToInt64Milliseconds(now - health_.since)},
             {"failed_writes", health_.failed_writes},
             {"dropped_lines", health_.dropped_lines}});
  const int64_t dropped = health_.dropped_lines;
  health_ = Health();
  health_.dropped_lines = dropped;  // Lost for good: stays counted.
  return absl::OkStatus();
}

bool RunRecordWriter::behind() const {
  absl::MutexLock lock(&mu_);
  return health_.behind;
}

RunRecordWriter::Health RunRecordWriter::health() const {
  absl::MutexLock lock(&mu_);
  Health health = health_;
  health.owed_lines = static_cast<int64_t>(owed_lines_.size());
  return health;
}

}  // namespace sluice::controller
