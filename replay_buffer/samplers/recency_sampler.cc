#include "replay_buffer/samplers/recency_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sluice::replay_buffer {
namespace {

// e^-kMaxLogWeight: below this total the weights are recomputed around the
// heaviest eligible key.
const double kMinTotal = std::exp(-RecencySampler::kMaxLogWeight);

}  // namespace

RecencySampler::RecencySampler(double recency_probability, double beta, uint64_t seed)
    : recency_probability_(recency_probability), beta_(beta), random_(seed) {}

double RecencySampler::ExponentOf(double priority) const {
  if (beta_ == 0.0) return 0.0;
  const double exponent = beta_ * priority;
  if (std::isnan(exponent)) return -kMaxAbsExponent;
  return std::clamp(exponent, -kMaxAbsExponent, kMaxAbsExponent);
}

void RecencySampler::SetSlotExponent(size_t slot, double exponent) {
  exponents_[slot] = exponent;
  if (exponent - shift_ > kMaxLogWeight) {
    Reshift();
    return;
  }
  tree_.Set(slot, std::exp(exponent - shift_));
  if (tree_.Total() < kMinTotal) Reshift();
}

void RecencySampler::Reshift() {
  double max_exponent = -std::numeric_limits<double>::infinity();
  for (size_t slot = 0; slot < slot_keys_.size(); ++slot) {
    if (!Chosen(slot)) max_exponent = std::max(max_exponent, exponents_[slot]);
  }
  shift_ = std::isfinite(max_exponent) ? max_exponent : 0.0;
  tree_.Assign(slot_keys_.size(), [this](size_t slot) {
    return Chosen(slot) ? 0.0 : std::exp(exponents_[slot] - shift_);
  });
}

void RecencySampler::Insert(int64_t key, double priority) {
  const auto [it, inserted] = slot_of_.try_emplace(key, slot_keys_.size());
  const double exponent = ExponentOf(priority);
  if (!inserted) {
    SetSlotExponent(it->second, exponent);
    return;
  }
  if (slot_keys_.empty()) shift_ = exponent;  // weight 1; no reshift needed
  keys_.insert(key);
  slot_keys_.push_back(key);
  exponents_.push_back(exponent);
  chosen_in_batch_.push_back(0);
  SetSlotExponent(it->second, exponent);
}

bool RecencySampler::Update(int64_t key, double priority) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return false;
  SetSlotExponent(it->second, ExponentOf(priority));
  return true;
}

void RecencySampler::Delete(int64_t key) {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return;
  const size_t hole = it->second;
  const size_t last = slot_keys_.size() - 1;
  slot_of_.erase(it);
  keys_.erase(key);
  if (hole != last) {  // the last key moves into the hole, with its weight
    slot_keys_[hole] = slot_keys_[last];
    exponents_[hole] = exponents_[last];
    slot_of_[slot_keys_[hole]] = hole;
    tree_.Set(hole, tree_.Get(last));
  }
  tree_.Set(last, 0.0);
  slot_keys_.pop_back();
  exponents_.pop_back();
  chosen_in_batch_.pop_back();
  if (!slot_keys_.empty() && tree_.Total() < kMinTotal) Reshift();
}

std::vector<int64_t> RecencySampler::Select(int64_t count) {
  const size_t batch = static_cast<size_t>(std::clamp<int64_t>(count, 0, size()));
  std::vector<int64_t> selected;
  selected.reserve(batch);
  if (batch == 0) return selected;
  chosen_scratch_.clear();
  ++batch_;  // even: this batch's stamp
  auto newest = keys_.rbegin();
  bool reshifted = false;
  for (size_t i = 0; i < batch; ++i) {
    const bool take_newest =
        recency_probability_ >= 1.0 ||
        (recency_probability_ > 0.0 && random_.Uniform() < recency_probability_);
    size_t slot;
    if (take_newest) {
      // Fewer than size() keys are chosen, so an unchosen one exists.
      while (Chosen(slot = slot_of_.find(*newest)->second)) ++newest;
    } else {
      if (tree_.Total() < kMinTotal) {  // the batch took the heaviest keys
        Reshift();
        reshifted = true;
      }
      slot = tree_.Find(random_.Uniform() * tree_.Total());
    }
    chosen_in_batch_[slot] = batch_;
    chosen_scratch_.push_back(slot);
    if (i + 1 < batch) tree_.Set(slot, 0.0);  // the last draw need not be excluded
    selected.push_back(slot_keys_[slot]);
  }
  ++batch_;  // odd again: nothing counts as chosen
  // Restore the weights zeroed above: those of every chosen key but the last.
  // Without a reshift they get back the very values they had, so the tree is
  // bit for bit what it was. After one (the shift went down), they may exceed
  // e^kMaxLogWeight, and then all weights are recomputed around the new
  // maximum. (The last key's weight is current either way: if a reshift came
  // before its draw, it was unchosen then and got weight exp(x - shift) <= 1.)
  chosen_scratch_.pop_back();
  if (reshifted) {
    for (const size_t slot : chosen_scratch_) {
      if (exponents_[slot] - shift_ > kMaxLogWeight) {
        Reshift();
        return selected;
      }
    }
  }
  for (const size_t slot : chosen_scratch_) tree_.Set(slot, std::exp(exponents_[slot] - shift_));
  return selected;
}

double RecencySampler::Probability(int64_t key) const {
  const auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return 0.0;
  const double p = recency_probability_;
  const double recent = *keys_.rbegin() == key ? p : 0.0;
  if (p >= 1.0) return recent;
  return recent + (1.0 - p) * tree_.Get(it->second) / tree_.Total();
}

}  // namespace sluice::replay_buffer
