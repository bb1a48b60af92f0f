#ifndef SLUICE_CONTROLLER_PROMPT_FEED_JOURNAL_H_
#define SLUICE_CONTROLLER_PROMPT_FEED_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace sluice::controller {

struct PromptFeedJournalOptions {
  // The journal file, normally <runs-dir>/<run-id>/prompt_feed.jsonl.
  std::string path;
  // Every event is written with one write(2) before the feed's call returns,
  // so it survives the controller being killed (kill -9, OOM, a crash): the
  // kernel has it. fdatasync, which makes it survive a machine crash too,
  // runs at most this often, after the event that finds the last one this
  // old, by the feed's caller once the feed's lock is released (BeginSync):
  // a sync that takes tens of milliseconds on a busy disk then delays one
  // call, not every worker's. Zero = after every event, under the lock;
  // absl::InfiniteDuration() = never.
  absl::Duration sync_interval = absl::Seconds(1);
  // Once this many events follow the last checkpoint, and the last rewrite
  // is min_compaction_interval old, the feed rewrites the journal as a
  // single checkpoint line, so that the file and the replay stay bounded by
  // the prompts outstanding and this interval's events rather than the
  // run's length. The rewrite (two fsyncs) holds the feed's lock: the
  // interval keeps a fleet of thousands of workers (thousands of events a
  // second) from paying it every few seconds.
  int64_t compact_after_events = 10000;
  absl::Duration min_compaction_interval = absl::Seconds(30);
};

// The append-only file behind a PromptFeed: one JSON object per line. The
// feed defines the events (prompt_feed.h); this class only writes, syncs,
// rewrites and reads lines. Not thread-safe: the feed calls it under its
// lock.
class PromptFeedJournal {
 public:
  // Opens `options.path` for appending, creating it if missing. Reads
  // nothing.
  static absl::StatusOr<std::unique_ptr<PromptFeedJournal>> Open(PromptFeedJournalOptions options);

  // The events of the file at `path`, in order. A partial last line (a
  // write cut short by kill -9) is left out and its size put in
  // `torn_tail_bytes`; any complete line that is not a JSON object is
  // DATA_LOSS naming its line number. NOT_FOUND when there is no file.
  static absl::StatusOr<std::vector<nlohmann::json>> Read(const std::string& path,
                                                          int64_t* torn_tail_bytes);

  PromptFeedJournal(const PromptFeedJournal&) = delete;
  PromptFeedJournal& operator=(const PromptFeedJournal&) = delete;
  ~PromptFeedJournal();

  // One line, one write(2); fdatasync here only with a zero
  // options.sync_interval (else see BeginSync). A write that fails (a full
  // disk) may leave part of a line at the end, which a restore leaves out:
  // the journal then refuses every later Append with the same error,
  // without writing, until a Rewrite succeeds (events in between are lost
  // from the file; the rewrite's checkpoint covers them).
  absl::Status Append(const nlohmann::json& event);
  // The error that stopped Append (OK while appends are written).
  const absl::Status& error() const { return error_; }
  // When an fdatasync is due (written since the last one, which is
  // options.sync_interval old): a duplicate of the file's descriptor for
  // the caller to fdatasync and close outside its lock, counted as done;
  // else -1. (A rewrite meanwhile syncs the new file itself; syncing the
  // replaced one is harmless.)
  int BeginSync();
  // Replaces the whole file by `checkpoint` (one line) atomically: a
  // temporary file, fsync, rename, directory fsync. A partial last line of
  // the old file goes with it. Resets events_since_checkpoint() and clears
  // error().
  absl::Status Rewrite(const nlohmann::json& checkpoint);
  // fdatasync now (a graceful shutdown).
  absl::Status Sync();

  int64_t events_since_checkpoint() const { return events_since_checkpoint_; }
  bool CompactionDue() const {
    return events_since_checkpoint_ >= options_.compact_after_events &&
           absl::Now() - last_rewrite_ >= options_.min_compaction_interval;
  }
  int64_t syncs() const { return syncs_; }

 private:
  PromptFeedJournal(PromptFeedJournalOptions options, int fd)
      : options_(std::move(options)), fd_(fd) {}

  const PromptFeedJournalOptions options_;
  int fd_ = -1;
  int64_t events_since_checkpoint_ = 0;
  int64_t syncs_ = 0;
  bool dirty_ = false;  // Written since the last fdatasync.
  absl::Status error_;  // Sticky until a Rewrite; see Append.
  absl::Time last_sync_ = absl::InfinitePast();
  absl::Time last_rewrite_ = absl::InfinitePast();
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_PROMPT_FEED_JOURNAL_H_
