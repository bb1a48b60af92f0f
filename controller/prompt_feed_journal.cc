#include "controller/prompt_feed_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/run_files.h"

namespace sluice::controller {
namespace {

absl::Status PosixError(absl::string_view what, const std::string& path) {
  return PosixFileError(errno, what, path);
}

int OpenForAppend(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PromptFeedJournal>> PromptFeedJournal::Open(
    PromptFeedJournalOptions options) {
  if (options.path.empty()) return absl::InvalidArgumentError("prompt feed journal: empty path");
  const int fd = OpenForAppend(options.path);
  if (fd < 0) return PosixError("open", options.path);
  return std::unique_ptr<PromptFeedJournal>(new PromptFeedJournal(std::move(options), fd));
}

PromptFeedJournal::~PromptFeedJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::vector<nlohmann::json>> PromptFeedJournal::Read(const std::string& path,
                                                                    int64_t* torn_tail_bytes) {
  absl::StatusOr<CompleteLines> lines = ReadCompleteLines(path);
  if (!lines.ok()) return lines.status();
  if (torn_tail_bytes != nullptr) *torn_tail_bytes = lines->torn_tail_bytes;
  std::vector<nlohmann::json> events;
  events.reserve(lines->lines.size());
  for (size_t i = 0; i < lines->lines.size(); ++i) {
    nlohmann::json event =
        nlohmann::json::parse(lines->lines[i], nullptr, /*allow_exceptions=*/false);
    if (event.is_discarded() || !event.is_object()) {
      return absl::DataLossError(
          absl::StrCat(path, " line ", i + 1, ": not a JSON object: \"",
                       lines->lines[i].substr(0, 80), "\""));
    }
    events.push_back(std::move(event));
  }
  return events;
}

absl::Status PromptFeedJournal::Append(const nlohmann::json& event) {
  // After a failed write the file may end in part of a line: another line
  // after it would make a line no restore can read.
  if (!error_.ok()) return error_;
  std::string line = event.dump();
  line.push_back('\n');
  absl::string_view rest = line;
  while (!rest.empty()) {
    const ssize_t written = ::write(fd_, rest.data(), rest.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      error_ = PosixError("append to", options_.path);
      return error_;
    }
    rest.remove_prefix(static_cast<size_t>(written));
  }
  ++events_since_checkpoint_;
  dirty_ = true;
  if (options_.sync_interval <= absl::ZeroDuration()) return Sync();
  return absl::OkStatus();
}

int PromptFeedJournal::BeginSync() {
  if (!dirty_ || options_.sync_interval == absl::InfiniteDuration() ||
      absl::Now() - last_sync_ < options_.sync_interval) {
    return -1;
  }
  const int fd = ::dup(fd_);
  if (fd < 0) return -1;  // Tried again after the next event.
  dirty_ = false;
  ++syncs_;
  last_sync_ = absl::Now();
  return fd;
}

absl::Status PromptFeedJournal::Sync() {
  if (!dirty_) return absl::OkStatus();
  if (::fdatasync(fd_) != 0) return PosixError("fdatasync", options_.path);
  dirty_ = false;
  ++syncs_;
  last_sync_ = absl::Now();
  return absl::OkStatus();
}

absl::Status PromptFeedJournal::Rewrite(const nlohmann::json& checkpoint) {
  if (absl::Status written =
          WriteFileAtomically(options_.path, checkpoint.dump(), /*durable=*/true);
      !written.ok()) {
    return written;
  }
  // The old descriptor points at the replaced file.
  const int fd = OpenForAppend(options_.path);
  if (fd < 0) return PosixError("reopen", options_.path);
  ::close(fd_);
  fd_ = fd;
  error_ = absl::OkStatus();
  events_since_checkpoint_ = 0;
  dirty_ = false;
  last_sync_ = absl::Now();
  last_rewrite_ = last_sync_;
  return absl::OkStatus();
}

}  // namespace sluice::controller
