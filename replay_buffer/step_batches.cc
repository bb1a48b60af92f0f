#include "replay_buffer/step_batches.h"

#include <algorithm>

namespace sluice::replay_buffer {

StepBatches::Position StepBatches::Locate(int64_t step) const {
  if (batches_.contains(step)) return Position::kRecorded;
  const int64_t next = next_step();
  if (step == next) return Position::kNext;
  return step < next ? Position::kGone : Position::kAhead;
}

const StepBatches::Batch* StepBatches::Find(int64_t step) const {
  auto it = batches_.find(step);
  return it == batches_.end() ? nullptr : &it->second;
}

const StepBatches::RetainedGroup* StepBatches::Retained(int64_t sequence) const {
  auto it = retained_.find(sequence);
  return it == retained_.end() ? nullptr : &it->second;
}

void StepBatches::Keep(int64_t sequence, std::shared_ptr<const v1::Group> group,
                       int64_t size_bytes) {
  RetainedGroup& kept = retained_[sequence];
  if (kept.group == nullptr) {
    kept.group = std::move(group);
    kept.size_bytes = size_bytes;
  }
  ++kept.batches;
}

void StepBatches::Add(int64_t step, Batch batch) {
  batches_.insert_or_assign(step, std::move(batch));
  last_recorded_step_ = std::max(last_recorded_step_, step);
}

std::vector<std::pair<int64_t, StepBatches::RetainedGroup>> StepBatches::Commit(int64_t step) {
  std::vector<std::pair<int64_t, RetainedGroup>> released;
  while (!batches_.empty() && batches_.begin()->first <= step) {
    for (const Entry& entry : batches_.begin()->second.entries) {
      auto it = retained_.find(entry.sequence);
      if (it == retained_.end()) continue;
      if (--it->second.batches > 0) continue;
      released.emplace_back(it->first, std::move(it->second));
      retained_.erase(it);
    }
    batches_.erase(batches_.begin());
  }
  committed_step_ = std::max(committed_step_, step);
  return released;
}

void StepBatches::ToSnapshot(v1::storage::TableSnapshot* table) const {
  table->set_committed_step(committed_step_);
  table->set_last_recorded_step(last_recorded_step_);
  for (const auto& [step, batch] : batches_) {
    v1::storage::RecordedStep& recorded = *table->add_recorded_steps();
    recorded.set_step(step);
    recorded.set_trainer_policy_version(batch.trainer_policy_version);
    recorded.set_buffer_version(batch.buffer_version);
    for (const Entry& entry : batch.entries) {
      v1::storage::RecordedStep::Entry& out = *recorded.add_entries();
      out.set_sequence(entry.sequence);
      out.set_times_sampled(entry.times_sampled);
      out.set_removed(entry.removed);
    }
  }
}

}  // namespace sluice::replay_buffer
