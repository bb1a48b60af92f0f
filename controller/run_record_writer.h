#ifndef SLUICE_CONTROLLER_RUN_RECORD_WRITER_H_
#define SLUICE_CONTROLLER_RUN_RECORD_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "controller/run_files.h"

namespace sluice::controller {

struct RunRecordWriterOptions {
  // A failed write is logged at once (WARNING); while the record stays
  // unwritten, a reminder at most this often; its recovery once. > 0.
  absl::Duration warning_interval = absl::Seconds(30);
  // Lines of metrics.jsonl and evals.jsonl kept in memory while they cannot
  // be written. Past it, new lines are dropped (and counted): a run whose
  // record cannot be written is paused, so that few steps come meanwhile.
  int64_t max_owed_lines = 10000;
};

// Writes one run's record (RunFiles: state.json, metrics.jsonl, evals.jsonl,
// summary.json) and keeps what it could not write (a full or failing runs
// directory) until it can, so that the record on disk is never silently
// short:
//
//   - a write that fails is owed, not dropped: a line stays queued (every
//     later line behind it, in order), state.json and summary.json are kept
//     as the newest text to write;
//   - while anything is owed, new writes are queued without touching the
//     disk, and Retry (the run's driver, once a tick) writes what is owed,
//     oldest first: the lines, then state.json, then summary.json. So a
//     full disk costs one failed attempt per tick, not one per step;
//   - behind() says whether the record on disk is short of what was written
//     to it; the driver pauses the run while it is (no new prompts) and says
//     why in Run.conditions (record_not_durable), and fails it if it stays
//     so too long;
//   - the first failure is logged at once, then at most once per
//     warning_interval while it lasts ("still cannot write ..."), and the
//     recovery once: a full disk gives a few lines, not one per write.
//
// Writes made elsewhere that belong to the record (the prompt feed's
// journal) report their failures with NoteFailure, so that one place says
// whether the record is durable.
//
// Thread-safe: the driver's RPC handlers append, its thread retries. Calls
// block for the disk (they hold this writer's lock while writing).
class RunRecordWriter {
 public:
  explicit RunRecordWriter(RunFiles files, RunRecordWriterOptions options = {});

  RunRecordWriter(const RunRecordWriter&) = delete;
  RunRecordWriter& operator=(const RunRecordWriter&) = delete;

  // state.json (RunFiles::WriteState); `durable` as in WriteFileAtomically.
  // The text supersedes any owed one.
  void WriteState(std::string text, bool durable) ABSL_LOCKS_EXCLUDED(mu_);
  // One line of metrics.jsonl / evals.jsonl.
  void AppendMetrics(const google::protobuf::Message& step) ABSL_LOCKS_EXCLUDED(mu_);
  void AppendEval(const google::protobuf::Message& eval) ABSL_LOCKS_EXCLUDED(mu_);
  // summary.json (at the run's end).
  void WriteSummary(const google::protobuf::Message& summary) ABSL_LOCKS_EXCLUDED(mu_);

  // A write of the record made elsewhere failed: the record is behind()
  // until a Retry succeeds (the caller mends its own write before calling
  // Retry).
  void NoteFailure(absl::string_view path, const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes what is owed (see the class comment). OK when nothing is owed
  // any more; else the first error, and nothing after it was tried.
  // O(owed lines).
  absl::Status Retry() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the record on disk is short of what was written to it.
  bool behind() const ABSL_LOCKS_EXCLUDED(mu_);

  struct Health {
    bool behind = false;
    // The file whose write failed last, and the error.
    std::string path;
    absl::Status error;
    // When the record fell behind; InfiniteFuture while it is not.
    absl::Time since = absl::InfiniteFuture();
    // Writes that failed since then, and lines waiting or dropped.
    int64_t failed_writes = 0;
    int64_t owed_lines = 0;
    int64_t dropped_lines = 0;
  };
  Health health() const ABSL_LOCKS_EXCLUDED(mu_);

  const RunFiles& files() const { return files_; }

 private:
  struct Line {
    const char* file;  // RunFiles::kMetrics or kEvals
    std::string text;
  };

  void AppendLine(const char* file, std::string text) ABSL_LOCKS_EXCLUDED(mu_);
  // Records a failed write: owed from now on, logged (rate-limited).
  void FailedLocked(const std::string& path, absl::Status error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the owed items in order; stops at the first failure.
  absl::Status WriteOwedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RunFiles files_;
  const RunRecordWriterOptions options_;

  mutable absl::Mutex mu_;
  std::deque<Line> owed_lines_ ABSL_GUARDED_BY(mu_);
  std::optional<std::pair<std::string, bool>> owed_state_ ABSL_GUARDED_BY(mu_);  // text, durable
  std::optional<std::string> owed_summary_ ABSL_GUARDED_BY(mu_);
  Health health_ ABSL_GUARDED_BY(mu_);
  absl::Time last_warning_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_RECORD_WRITER_H_
