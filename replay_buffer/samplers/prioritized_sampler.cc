#include "replay_buffer/samplers/prioritized_sampler.h"

#include <algorithm>
#include <cmath>

namespace sluice::replay_buffer {

double PrioritizedSampler::WeightOf(double priority) const {
  if (alpha_ == 0.0) return 1.0;
  if (!(priority > 0.0)) return 0.0;  // also NaN
  const double weight = std::pow(priority, alpha_);
  return weight <= kMaxWeight ? weight : kMaxWeight;  // also +inf
}

void PrioritizedSampler::SetSlotWeight(size_t slot, double weight) {
  tree_.Set(slot, weight);
  if (weight != 0.0) {
    Unlist(slot);
  } else if (zero_position_[slot] == kNotZero) {
    zero_position_[slot] = zero_slots_.size();
    zero_slots_.push_back(slot);
  }
}

void PrioritizedSampler::Unlist(size_t slot) {
  const size_t position = zero_position_[slot];
  if (position == kNotZero) return;
  zero_slots_[position] = zero_slots_.back();
  zero_position_[zero_slots_[position]] = position;
  zero_slots_.pop_back();
  zero_position_[slot] = kNotZero;
}

void PrioritizedSampler::Insert(int64_t key, double priority) {
  const auto [it, inserted] = slot_of_.try_emplace(key, slot_keys_.size());
  if (!inserted) {
    SetSlotWeight(it->second, WeightOf(priority));
    return;
  }
  slot_keys_.push_back(key);
  zero_position_.push_back(kNotZero);
  SetSlotWeight(it->second, WeightOf(priority));
}

bool PrioritizedSampler::Update(int64_t key, double priority) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return false;
  SetSlotWeight(it->second, WeightOf(priority));
  return true;
}

void PrioritizedSampler::Delete(int64_t key) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return;
  const size_t hole = it->second;
  const size_t last = slot_keys_.size() - 1;
  slot_of_.erase(it);
  const double last_weight = tree_.Get(last);
  Unlist(hole);
  Unlist(last);
  tree_.Set(last, 0.0);
  if (hole != last) {  // the last key moves into the hole, with its weight
    slot_keys_[hole] = slot_keys_[last];
    slot_of_[slot_keys_[hole]] = hole;
    SetSlotWeight(hole, last_weight);
  }
  slot_keys_.pop_back();
  zero_position_.pop_back();
}

std::vector<int64_t> PrioritizedSampler::Select(int64_t count) {
  const size_t batch = static_cast<size_t>(std::clamp<int64_t>(count, 0, size()));
  std::vector<int64_t> selected;
  selected.reserve(batch);
  drawn_scratch_.clear();
  zero_swap_scratch_.clear();
  // zero_slots_[0, zero_drawn) are the zero-weight keys drawn so far.
  size_t zero_drawn = 0;
  for (size_t i = 0; i < batch; ++i) {
    size_t slot;
    const double total = tree_.Total();
    if (total > 0.0) {
      slot = tree_.Find(random_.Uniform() * total);
      if (i + 1 < batch) {  // the last draw need not be excluded
        drawn_scratch_.emplace_back(slot, tree_.Get(slot));
        tree_.Set(slot, 0.0);
      }
    } else {
      // Every key not drawn yet weighs 0 (a sum of non-negative doubles is 0
      // only if all are), so they are exactly zero_slots_[zero_drawn, end):
      // tree draws never return a zero-weight slot.
      const size_t swap_with =
          zero_drawn + static_cast<size_t>(random_.UniformInt(zero_slots_.size() - zero_drawn));
      std::swap(zero_slots_[zero_drawn], zero_slots_[swap_with]);
      zero_swap_scratch_.push_back(swap_with);
      slot = zero_slots_[zero_drawn++];
    }
    selected.push_back(slot_keys_[slot]);
  }
  for (const auto& [slot, weight] : drawn_scratch_) tree_.Set(slot, weight);
  for (size_t i = zero_drawn; i-- > 0;) {
    std::swap(zero_slots_[i], zero_slots_[zero_swap_scratch_[i]]);
  }
  return selected;
}

double PrioritizedSampler::Probability(int64_t key) const {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return 0.0;
  const double total = tree_.Total();
  if (total > 0.0) return tree_.Get(it->second) / total;
  return 1.0 / static_cast<double>(slot_keys_.size());
}

}  // namespace sluice::replay_buffer
