#ifndef SLUICE_REPLAY_BUFFER_START_COUNT_H_
#define SLUICE_REPLAY_BUFFER_START_COUNT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sluice::replay_buffer {

// How many times a buffer process has started on a data directory, kept in
// <data_dir>/starts (one decimal number and a newline).
//
// The controller counts a run's buffer restarts (RecoveryStats.restarts) from
// what the buffer reports. An incarnation (the process's start time) tells a
// new process from the last one seen, but a buffer killed again before anyone
// asked for it is never seen: five kills in a row counted three. The count
// kept beside the write-ahead log is the buffer's own record of every start,
// so the difference between two reports counts the ones in between.
//
// Call once per process, after the data directory is locked (no other buffer
// counts at the same time). Reads the count, adds one and writes it through a
// temporary file, fsync and rename, so that a kill -9 leaves the old count or
// the new one. Returns the new count (1 on a fresh directory). A file that
// does not hold a number is counted from again (a warning's worth, not a
// reason to refuse to start): returns 1 and rewrites it. An error only when
// the file cannot be written. O(1).
absl::StatusOr<int64_t> CountStart(const std::string& data_dir);

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_START_COUNT_H_
