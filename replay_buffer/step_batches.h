#ifndef SLUICE_REPLAY_BUFFER_STEP_BATCHES_H_
#define SLUICE_REPLAY_BUFFER_STEP_BATCHES_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer_storage.pb.h"

namespace sluice::replay_buffer {

// The batches a trainer's steps took (SampleRequest.step), kept until the
// trainer's checkpoint covers them (CommitTrainedSteps): the buffer's half of
// a lossless trainer resume. A trainer killed after its checkpoint of step k
// and restarted from it asks again for steps k+1, k+2, ...; each one it had
// already asked for is answered with exactly the groups it took then, so the
// redone steps train on the same data and land on the same weights.
//
//            committed_step          last_recorded_step
//   ... gone ......|<--- recorded, kept --->|  next_step() = last + 1
//
// A step is recorded at most once, in order (next_step() only); a commit
// lets go of every batch at or below it. A commit beyond the last recorded
// step moves the position there: a trainer resumed from a checkpoint on a
// buffer that lost its journal starts recording after its checkpoint.
//
// The groups themselves are shared with the table: a group a batch took
// stays here (and in the memory account, which the table keeps) after its
// last sample removed it from the sampleable groups, until no recorded batch
// refers to it.
//
// Not thread-safe: the RunTable owns one and uses it under its lock.
class StepBatches {
 public:
  struct Entry {
    int64_t sequence = 0;
    // Times sampled including this sample.
    int32_t times_sampled = 0;
    // This sample was the group's last (it left the sampleable groups).
    bool removed = false;
  };
  struct Batch {
    int64_t trainer_policy_version = 0;
    // The table's mutation counter when the batch was taken.
    int64_t buffer_version = 0;
    std::vector<Entry> entries;
  };
  struct RetainedGroup {
    std::shared_ptr<const v1::Group> group;
    int64_t size_bytes = 0;
    // Recorded batches that took it (a group sampled more than once may be
    // in several).
    int32_t batches = 0;
  };

  // Where a requested step stands.
  enum class Position {
    kRecorded,  // Find(step) has its batch
    kNext,      // the next step to record
    kGone,      // committed: its batch was let go
    kAhead,     // beyond next_step()
  };
  Position Locate(int64_t step) const;

  int64_t committed_step() const { return committed_step_; }
  int64_t last_recorded_step() const { return last_recorded_step_; }
  int64_t next_step() const { return std::max(committed_step_, last_recorded_step_) + 1; }
  // Distinct groups kept.
  int64_t retained_groups() const { return static_cast<int64_t>(retained_.size()); }
  const absl::btree_map<int64_t, Batch>& batches() const { return batches_; }
  const absl::flat_hash_map<int64_t, RetainedGroup>& retained() const { return retained_; }

  // Null when the step is not recorded. O(log steps).
  const Batch* Find(int64_t step) const;
  // Null when no recorded batch keeps the group. O(1).
  const RetainedGroup* Retained(int64_t sequence) const;
  bool Retains(int64_t sequence) const { return retained_.contains(sequence); }

  // Recording a step: Keep each group of its batch (before the table drops
  // it from the sampleable groups, so that its bytes stay charged), then
  // Add the batch. Add moves last_recorded_step up to `step`.
  void Keep(int64_t sequence, std::shared_ptr<const v1::Group> group, int64_t size_bytes);
  void Add(int64_t step, Batch batch);

  // Lets go of every batch at or below `step` and moves committed_step up to
  // it; returns the groups no batch keeps any more, for the table to release
  // (those it no longer holds). O(groups let go).
  std::vector<std::pair<int64_t, RetainedGroup>> Commit(int64_t step);

  // The recorded steps and the position, into a snapshot's table record.
  void ToSnapshot(v1::storage::TableSnapshot* table) const;
  // Sets the position read from a snapshot, before its batches are Kept and
  // Added again.
  void RestorePosition(int64_t committed_step, int64_t last_recorded_step) {
    committed_step_ = committed_step;
    last_recorded_step_ = last_recorded_step;
  }

 private:
  int64_t committed_step_ = 0;
  int64_t last_recorded_step_ = 0;
  absl::btree_map<int64_t, Batch> batches_;
  absl::flat_hash_map<int64_t, RetainedGroup> retained_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_STEP_BATCHES_H_
