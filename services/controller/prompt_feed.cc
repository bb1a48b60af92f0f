#include "services/controller/prompt_feed.h"

#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/task/shuffle.h"

namespace sluice::controller {
namespace {

// SplitMix64 finalizer: decorrelates (seed, epoch) pairs.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

PromptFeed::PromptFeed(std::vector<v1::Prompt> prompts, uint64_t seed, absl::Duration lease_ttl)
    : pool_(std::move(prompts)), seed_(seed), lease_ttl_(lease_ttl) {
  absl::MutexLock lock(&mu_);
  StartEpoch();
}

void PromptFeed::StartEpoch() {
  order_.resize(pool_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
  std::mt19937_64 rng(Mix(seed_ ^ Mix(static_cast<uint64_t>(epoch_))));
  task::Shuffle(order_, rng);
  position_ = 0;
  stats_.epoch = epoch_;
}

v1::Prompt PromptFeed::NextFresh() {
  if (position_ >= order_.size()) {
    ++epoch_;
    StartEpoch();
  }
  v1::Prompt prompt = pool_[order_[position_++]];
  if (epoch_ > 0) prompt.set_prompt_id(absl::StrCat(prompt.prompt_id(), "-e", epoch_));
  return prompt;
}

PromptLease PromptFeed::Lease(const std::string& worker_id, uint64_t worker_incarnation,
                              int max_prompts, absl::Time now) {
  PromptLease lease;
  absl::MutexLock lock(&mu_);
  if (done_ || max_prompts <= 0 || pool_.empty()) return lease;
  ExpireLeases(now);
  lease.lease_id = absl::StrCat("lease-", next_lease_number_++);
  lease.expires_at = now + lease_ttl_;
  LeaseRecord record{worker_id, worker_incarnation, lease.expires_at, {}};
  while (static_cast<int>(lease.prompts.size()) < max_prompts && !reissue_.empty()) {
    const std::string id = std::move(reissue_.front());
    reissue_.pop_front();
    auto it = outstanding_.find(id);
    // Completed (late) or re-issued already: nothing to do.
    if (it == outstanding_.end() || !it->second.lease_id.empty()) continue;
    it->second.lease_id = lease.lease_id;
    lease.prompts.push_back(it->second.prompt);
    record.prompt_ids.push_back(id);
    ++stats_.reissued;
  }
  while (static_cast<int>(lease.prompts.size()) < max_prompts) {
    // Ids are unique across passes (see the class comment), so a fresh
    // prompt is never one that is still out.
    v1::Prompt prompt = NextFresh();
    record.prompt_ids.push_back(prompt.prompt_id());
    outstanding_[prompt.prompt_id()] = Outstanding{prompt, lease.lease_id};
    lease.prompts.push_back(std::move(prompt));
  }
  stats_.issued += static_cast<int64_t>(lease.prompts.size());
  if (lease.prompts.empty()) {
    lease.lease_id.clear();
    return lease;
  }
  leases_.emplace(lease.lease_id, std::move(record));
  return lease;
}

absl::StatusOr<absl::Time> PromptFeed::Renew(const std::string& lease_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLeases(now);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
  }
  bool live = false;
  for (const std::string& id : it->second.prompt_ids) {
    auto prompt = outstanding_.find(id);
    if (prompt != outstanding_.end() && prompt->second.lease_id == lease_id) {
      live = true;
      break;
    }
  }
  if (!live) {
    leases_.erase(it);
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " has no prompts left"));
  }
  it->second.expires_at = now + lease_ttl_;
  return it->second.expires_at;
}

int PromptFeed::Complete(const std::vector<std::string>& prompt_ids) {
  absl::MutexLock lock(&mu_);
  int completed = 0;
  for (const std::string& id : prompt_ids) {
    if (outstanding_.erase(id) > 0) ++completed;
  }
  stats_.completed += completed;
  return completed;
}

void PromptFeed::Abandon(const std::vector<std::string>& prompt_ids) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : prompt_ids) {
    auto it = outstanding_.find(id);
    if (it == outstanding_.end() || it->second.lease_id.empty()) continue;
    it->second.lease_id.clear();
    reissue_.push_back(id);
  }
}

void PromptFeed::ObserveWorker(const std::string& worker_id, uint64_t worker_incarnation) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = incarnations_.try_emplace(worker_id, worker_incarnation);
  if (inserted || worker_incarnation <= it->second) return;
  it->second = worker_incarnation;
  std::vector<std::string> stale;
  for (const auto& [lease_id, lease] : leases_) {
    if (lease.worker_id == worker_id && lease.incarnation < worker_incarnation) {
      stale.push_back(lease_id);
    }
  }
  for (const std::string& lease_id : stale) GiveBack(lease_id);
}

int PromptFeed::GiveBackWorker(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> held;
  for (const auto& [lease_id, lease] : leases_) {
    if (lease.worker_id == worker_id) held.push_back(lease_id);
  }
  const size_t waiting = reissue_.size();
  for (const std::string& lease_id : held) GiveBack(lease_id);
  return static_cast<int>(reissue_.size() - waiting);
}

void PromptFeed::ExpireLeases(absl::Time now) {
  std::vector<std::string> expired;
  for (const auto& [lease_id, lease] : leases_) {
    if (lease.expires_at <= now) expired.push_back(lease_id);
  }
  for (const std::string& lease_id : expired) GiveBack(lease_id);
}

void PromptFeed::GiveBack(const std::string& lease_id) {
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) return;
  for (const std::string& id : lease->second.prompt_ids) {
    auto it = outstanding_.find(id);
    if (it == outstanding_.end() || it->second.lease_id != lease_id) continue;
    it->second.lease_id.clear();
    reissue_.push_back(id);
  }
  leases_.erase(lease);
}

void PromptFeed::MarkDone() {
  absl::MutexLock lock(&mu_);
  done_ = true;
}

bool PromptFeed::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

PromptFeedStats PromptFeed::stats() const {
  absl::MutexLock lock(&mu_);
  PromptFeedStats stats = stats_;
  stats.waiting_reissue = 0;
  for (const auto& [id, prompt] : outstanding_) {
    if (prompt.lease_id.empty()) ++stats.waiting_reissue;
  }
  stats.outstanding = static_cast<int64_t>(outstanding_.size()) - stats.waiting_reissue;
  return stats;
}

}  // namespace sluice::controller
