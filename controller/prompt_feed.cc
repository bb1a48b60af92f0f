#include "controller/prompt_feed.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
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

// An integer field of a journal event; `fallback` when absent.
bool GetInt(const nlohmann::json& event, const char* key, int64_t* value, int64_t fallback = 0) {
  auto it = event.find(key);
  if (it == event.end()) {
    *value = fallback;
    return true;
  }
  if (!it->is_number_integer()) return false;
  *value = it->get<int64_t>();
  return true;
}

std::string GetType(const nlohmann::json& event) {
  auto it = event.find("t");
  return it != event.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

PromptFeed::PromptFeed(std::vector<v1::Prompt> prompts, uint64_t seed, absl::Duration lease_ttl)
    : pool_(std::move(prompts)), seed_(seed), lease_ttl_(lease_ttl) {
  absl::MutexLock lock(&mu_);
  StartEpoch();
}

absl::StatusOr<std::unique_ptr<PromptFeed>> PromptFeed::Open(std::vector<v1::Prompt> prompts,
                                                             uint64_t seed,
                                                             absl::Duration lease_ttl,
                                                             PromptFeedJournalOptions journal) {
  auto feed = std::make_unique<PromptFeed>(std::move(prompts), seed, lease_ttl);
  int64_t torn_tail_bytes = 0;
  absl::StatusOr<std::vector<nlohmann::json>> events =
      PromptFeedJournal::Read(journal.path, &torn_tail_bytes);
  if (!events.ok() && !absl::IsNotFound(events.status())) return events.status();
  const std::string path = journal.path;
  absl::StatusOr<std::unique_ptr<PromptFeedJournal>> opened =
      PromptFeedJournal::Open(std::move(journal));
  if (!opened.ok()) return opened.status();

  absl::MutexLock lock(&feed->mu_);
  feed->journal_ = std::move(*opened);
  if (!events.ok() || (events->empty() && torn_tail_bytes == 0)) return feed;
  if (absl::Status replayed = feed->ReplayLocked(*events, path); !replayed.ok()) return replayed;
  feed->restore_.restored = true;
  feed->restore_.events = static_cast<int64_t>(events->size());
  feed->restore_.reissue_queued = static_cast<int64_t>(feed->reissue_.size());
  feed->restore_.torn_tail_bytes = torn_tail_bytes;
  // One checkpoint line from here on: bounded replay next time, and no
  // partial line for the next append to run into.
  if (absl::Status written = feed->journal_->Rewrite(feed->CheckpointLocked()); !written.ok()) {
    return written;
  }
  return feed;
}

void PromptFeed::StartEpoch() {
  order_.resize(pool_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
  std::mt19937_64 rng(Mix(seed_ ^ Mix(static_cast<uint64_t>(epoch_))));
  task::Shuffle(order_, rng);
  position_ = 0;
  stats_.epoch = epoch_;
}

v1::Prompt PromptFeed::PromptFor(int64_t epoch, uint32_t pool_index) const {
  v1::Prompt prompt = pool_[pool_index];
  if (epoch > 0) prompt.set_prompt_id(absl::StrCat(prompt.prompt_id(), "-e", epoch));
  return prompt;
}

v1::Prompt PromptFeed::NextFresh(uint32_t* pool_index) {
  if (position_ >= order_.size()) {
    ++epoch_;
    StartEpoch();
  }
  *pool_index = order_[position_++];
  return PromptFor(epoch_, *pool_index);
}

PromptLease PromptFeed::Lease(const std::string& worker_id, uint64_t worker_incarnation,
                              int max_prompts, absl::Time now) {
  PromptLease lease;
  const SyncAfter sync{this};
  absl::MutexLock lock(&mu_);
  if (done_ || max_prompts <= 0 || pool_.empty()) return lease;
  ExpireLeases(now);
  const int64_t lease_number = next_lease_number_++;
  lease.lease_id = absl::StrCat("lease-", lease_number);
  lease.expires_at = now + lease_ttl_;
  LeaseRecord record{worker_id, worker_incarnation, lease.expires_at, {}};
  nlohmann::json reissued = nlohmann::json::array();
  while (static_cast<int>(lease.prompts.size()) < max_prompts && !reissue_.empty()) {
    const std::string id = std::move(reissue_.front());
    reissue_.pop_front();
    auto it = outstanding_.find(id);
    // Completed (late) or re-issued already: nothing to do.
    if (it == outstanding_.end() || !it->second.lease_id.empty()) continue;
    it->second.lease_id = lease.lease_id;
    lease.prompts.push_back(it->second.prompt);
    record.prompt_ids.push_back(id);
    reissued.push_back(id);
    ++stats_.reissued;
  }
  // [epoch, from, to) of the order, one per epoch the fresh prompts span.
  std::vector<std::array<int64_t, 3>> fresh;
  while (static_cast<int>(lease.prompts.size()) < max_prompts) {
    // Ids are unique across passes (see the class comment), so a fresh
    // prompt is never one that is still out.
    uint32_t pool_index = 0;
    v1::Prompt prompt = NextFresh(&pool_index);
    const int64_t position = static_cast<int64_t>(position_);
    if (fresh.empty() || fresh.back()[0] != epoch_) {
      fresh.push_back({epoch_, position - 1, position});
    } else {
      fresh.back()[2] = position;
    }
    record.prompt_ids.push_back(prompt.prompt_id());
    outstanding_[prompt.prompt_id()] =
        Outstanding{prompt, lease.lease_id, epoch_, pool_index, next_sequence_++};
    lease.prompts.push_back(std::move(prompt));
  }
  stats_.issued += static_cast<int64_t>(lease.prompts.size());
  if (lease.prompts.empty()) {
    lease.lease_id.clear();
    return lease;
  }
  nlohmann::json event = {{"t", "lease"}, {"n", lease_number}};
  if (!fresh.empty()) event["fresh"] = fresh;
  if (!reissued.empty()) event["reissued"] = std::move(reissued);
  JournalLocked(event);
  lease_expiry_.emplace(record.expires_at, lease.lease_id);
  leases_.emplace(lease.lease_id, std::move(record));
  return lease;
}

absl::StatusOr<absl::Time> PromptFeed::Renew(const std::string& lease_id, absl::Time now) {
  const SyncAfter sync{this};
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
    lease_expiry_.erase({it->second.expires_at, lease_id});
    leases_.erase(it);
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " has no prompts left"));
  }
  lease_expiry_.erase({it->second.expires_at, lease_id});
  it->second.expires_at = now + lease_ttl_;
  lease_expiry_.emplace(it->second.expires_at, lease_id);
  return it->second.expires_at;
}

int PromptFeed::Complete(const std::vector<std::string>& prompt_ids) {
  const SyncAfter sync{this};
  absl::MutexLock lock(&mu_);
  nlohmann::json completed = nlohmann::json::array();
  for (const std::string& id : prompt_ids) {
    auto it = outstanding_.find(id);
    if (it != outstanding_.end()) {
      const std::string lease_id = std::move(it->second.lease_id);
      outstanding_.erase(it);
      completed.push_back(id);
      // Without this a completed lease would stay until its TTL, and every
      // lease of the last lease_ttl would be kept (and looked at).
      if (!lease_id.empty()) CloseIfDoneLocked(lease_id);
    } else {
      ++stats_.completions_ignored;
    }
  }
  stats_.completed += static_cast<int64_t>(completed.size());
  const int newly = static_cast<int>(completed.size());
  if (newly > 0) JournalLocked({{"t", "done"}, {"ids", std::move(completed)}});
  return newly;
}

void PromptFeed::Abandon(const std::vector<std::string>& prompt_ids) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : prompt_ids) {
    auto it = outstanding_.find(id);
    if (it == outstanding_.end() || it->second.lease_id.empty()) continue;
    const std::string lease_id = std::move(it->second.lease_id);
    it->second.lease_id.clear();
    reissue_.push_back(id);
    CloseIfDoneLocked(lease_id);
  }
}

void PromptFeed::ObserveWorker(const std::string& worker_id, uint64_t worker_incarnation) {
  const SyncAfter sync{this};
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
  CountExpiredLocked(stale);
}

int PromptFeed::GiveBackWorker(const std::string& worker_id) {
  const SyncAfter sync{this};
  absl::MutexLock lock(&mu_);
  std::vector<std::string> held;
  for (const auto& [lease_id, lease] : leases_) {
    if (lease.worker_id == worker_id) held.push_back(lease_id);
  }
  const size_t waiting = reissue_.size();
  CountExpiredLocked(held);
  return static_cast<int>(reissue_.size() - waiting);
}

void PromptFeed::ExpireLeases(absl::Time now) {
  std::vector<std::string> expired;
  for (auto it = lease_expiry_.begin(); it != lease_expiry_.end() && it->first <= now; ++it) {
    expired.push_back(it->second);
  }
  CountExpiredLocked(expired);
}

void PromptFeed::CloseIfDoneLocked(const std::string& lease_id) {
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) return;
  for (const std::string& id : lease->second.prompt_ids) {
    auto it = outstanding_.find(id);
    if (it != outstanding_.end() && it->second.lease_id == lease_id) return;
  }
  lease_expiry_.erase({lease->second.expires_at, lease_id});
  leases_.erase(lease);
}

void PromptFeed::CountExpiredLocked(const std::vector<std::string>& lease_ids) {
  // A lease whose prompts were all completed just closes; one that gives
  // prompts back expired unreported.
  int64_t count = 0;
  for (const std::string& lease_id : lease_ids) {
    if (GiveBack(lease_id) > 0) ++count;
  }
  if (count == 0) return;
  stats_.leases_expired += count;
  JournalLocked({{"t", "expired"}, {"count", count}});
}

int PromptFeed::GiveBack(const std::string& lease_id) {
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) return 0;
  int given_back = 0;
  for (const std::string& id : lease->second.prompt_ids) {
    auto it = outstanding_.find(id);
    if (it == outstanding_.end() || it->second.lease_id != lease_id) continue;
    it->second.lease_id.clear();
    reissue_.push_back(id);
    ++given_back;
  }
  lease_expiry_.erase({lease->second.expires_at, lease_id});
  leases_.erase(lease);
  return given_back;
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

absl::Status PromptFeed::SyncJournal() {
  absl::MutexLock lock(&mu_);
  return journal_ == nullptr ? absl::OkStatus() : journal_->Sync();
}

absl::Status PromptFeed::journal_error() const {
  absl::MutexLock lock(&mu_);
  return journal_ == nullptr ? absl::OkStatus() : journal_->error();
}

absl::Status PromptFeed::RepairJournal() {
  absl::MutexLock lock(&mu_);
  if (journal_ == nullptr || journal_->error().ok()) return absl::OkStatus();
  return journal_->Rewrite(CheckpointLocked());
}

void PromptFeed::SyncIfDue() {
  int fd = -1;
  {
    absl::MutexLock lock(&mu_);
    if (journal_ != nullptr) fd = journal_->BeginSync();
  }
  if (fd < 0) return;
  const bool synced = ::fdatasync(fd) == 0;
  const std::string error = synced ? "" : std::strerror(errno);
  ::close(fd);
  if (synced) return;
  absl::MutexLock lock(&mu_);
  ++stats_.journal_errors;
  if (stats_.journal_errors == 1 || stats_.journal_errors % 1000 == 0) {
    log::Warning("cannot fdatasync the prompt feed's journal; a machine crash may lose its "
                 "latest events",
                 {{"error", error}, {"journal_errors", stats_.journal_errors}});
  }
}

void PromptFeed::JournalLocked(const nlohmann::json& event) {
  if (journal_ == nullptr) return;
  absl::Status written = journal_->Append(event);
  if (written.ok() && journal_->CompactionDue()) written = journal_->Rewrite(CheckpointLocked());
  if (written.ok()) return;
  ++stats_.journal_errors;
  if (stats_.journal_errors == 1 || stats_.journal_errors % 1000 == 0) {
    log::Warning("cannot journal the prompt feed; prompts may be handed out again after a "
                 "controller restart",
                 {{"error", std::string(written.message())},
                  {"journal_errors", stats_.journal_errors}});
  }
}

nlohmann::json PromptFeed::CheckpointLocked() const {
  std::vector<const Outstanding*> out;
  out.reserve(outstanding_.size());
  for (const auto& [id, prompt] : outstanding_) out.push_back(&prompt);
  std::sort(out.begin(), out.end(),
            [](const Outstanding* a, const Outstanding* b) { return a->sequence < b->sequence; });
  nlohmann::json outstanding = nlohmann::json::array();
  for (const Outstanding* prompt : out) outstanding.push_back({prompt->epoch, prompt->pool_index});
  return {{"t", "checkpoint"},
          {"epoch", epoch_},
          {"position", position_},
          {"next_lease", next_lease_number_},
          {"issued", stats_.issued},
          {"reissued", stats_.reissued},
          {"completed", stats_.completed},
          {"leases_expired", stats_.leases_expired},
          {"completions_ignored", stats_.completions_ignored},
          {"outstanding", std::move(outstanding)}};
}

absl::Status PromptFeed::ReplayLocked(const std::vector<nlohmann::json>& events,
                                      const std::string& path) {
  const int64_t pool_size = static_cast<int64_t>(pool_.size());
  size_t line = 0;
  const auto bad = [&](absl::string_view problem) {
    return absl::DataLossError(absl::StrCat(path, " line ", line, ": ", problem));
  };
  // Adds a handed-out prompt (epoch, pool index) to the outstanding set.
  const auto hand_out = [&](int64_t epoch, int64_t pool_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::Prompt prompt = PromptFor(epoch, static_cast<uint32_t>(pool_index));
    std::string id = prompt.prompt_id();
    outstanding_[id] = Outstanding{std::move(prompt), "", epoch,
                                   static_cast<uint32_t>(pool_index), next_sequence_++};
  };
  for (const nlohmann::json& event : events) {
    ++line;
    const std::string type = GetType(event);
    if (type == "lease") {
      int64_t number = 0;
      if (!GetInt(event, "n", &number) || number < 1) return bad("lease without a number");
      next_lease_number_ = std::max(next_lease_number_, number + 1);
      const nlohmann::json fresh = event.value("fresh", nlohmann::json::array());
      if (!fresh.is_array()) return bad("\"fresh\" is not a list");
      for (const nlohmann::json& range : fresh) {
        if (!range.is_array() || range.size() != 3 || !range[0].is_number_integer() ||
            !range[1].is_number_integer() || !range[2].is_number_integer()) {
          return bad("a fresh range is not [epoch, from, to]");
        }
        const int64_t epoch = range[0].get<int64_t>();
        const int64_t from = range[1].get<int64_t>();
        const int64_t to = range[2].get<int64_t>();
        // The order is handed out without gaps: a range continues where the
        // last one ended, or starts the next epoch once this one is through.
        if (epoch == epoch_ + 1 && static_cast<int64_t>(position_) == pool_size) {
          ++epoch_;
          StartEpoch();
        }
        if (epoch != epoch_ || from != static_cast<int64_t>(position_) || to <= from ||
            to > pool_size) {
          return bad(absl::StrCat("fresh range [", epoch, ", ", from, ", ", to,
                                  ") does not continue the feed at epoch ", epoch_, " position ",
                                  position_, " of ", pool_size, " prompts"));
        }
        for (int64_t position = from; position < to; ++position) {
          hand_out(epoch, order_[static_cast<size_t>(position)]);
        }
        position_ = static_cast<size_t>(to);
        stats_.issued += to - from;
      }
      const nlohmann::json reissued = event.value("reissued", nlohmann::json::array());
      if (!reissued.is_array()) return bad("\"reissued\" is not a list");
      stats_.issued += static_cast<int64_t>(reissued.size());
      stats_.reissued += static_cast<int64_t>(reissued.size());
    } else if (type == "done") {
      const nlohmann::json ids = event.value("ids", nlohmann::json::array());
      if (!ids.is_array()) return bad("\"ids\" is not a list");
      for (const nlohmann::json& id : ids) {
        if (!id.is_string()) return bad("a completed id is not a string");
        if (outstanding_.erase(id.get<std::string>()) > 0) {
          ++stats_.completed;
        } else {
          ++stats_.completions_ignored;
        }
      }
    } else if (type == "expired") {
      int64_t count = 0;
      if (!GetInt(event, "count", &count) || count < 0) return bad("bad expired count");
      stats_.leases_expired += count;
    } else if (type == "checkpoint") {
      int64_t epoch = 0;
      int64_t position = 0;
      int64_t next_lease = 1;
      PromptFeedStats counts;
      if (!GetInt(event, "epoch", &epoch) || !GetInt(event, "position", &position) ||
          !GetInt(event, "next_lease", &next_lease, 1) ||
          !GetInt(event, "issued", &counts.issued) ||
          !GetInt(event, "reissued", &counts.reissued) ||
          !GetInt(event, "completed", &counts.completed) ||
          !GetInt(event, "leases_expired", &counts.leases_expired) ||
          !GetInt(event, "completions_ignored", &counts.completions_ignored) || epoch < 0 ||
          position < 0 || position > pool_size) {
        return bad("a checkpoint field is missing or out of range");
      }
      outstanding_.clear();
      epoch_ = epoch;
      StartEpoch();
      position_ = static_cast<size_t>(position);
      next_lease_number_ = std::max<int64_t>(1, next_lease);
      stats_.issued = counts.issued;
      stats_.reissued = counts.reissued;
      stats_.completed = counts.completed;
      stats_.leases_expired = counts.leases_expired;
      stats_.completions_ignored = counts.completions_ignored;
      const nlohmann::json out = event.value("outstanding", nlohmann::json::array());
      if (!out.is_array()) return bad("\"outstanding\" is not a list");
      for (const nlohmann::json& item : out) {
        if (!item.is_array() || item.size() != 2 || !item[0].is_number_integer() ||
            !item[1].is_number_integer() || item[0].get<int64_t>() < 0 ||
            item[0].get<int64_t>() > epoch_ || item[1].get<int64_t>() < 0 ||
            item[1].get<int64_t>() >= pool_size) {
          return bad("an outstanding prompt is not [epoch, pool index] of this feed");
        }
        hand_out(item[0].get<int64_t>(), item[1].get<int64_t>());
      }
    } else {
      return bad(absl::StrCat("unknown event \"", type, "\""));
    }
  }
  // Their leases died with the old controller: handed out again first, in
  // the order they were first handed out.
  std::vector<std::pair<int64_t, std::string>> out;
  out.reserve(outstanding_.size());
  for (const auto& [id, prompt] : outstanding_) out.emplace_back(prompt.sequence, id);
  std::sort(out.begin(), out.end());
  for (auto& [sequence, id] : out) reissue_.push_back(std::move(id));
  return absl::OkStatus();
}

}  // namespace sluice::controller
