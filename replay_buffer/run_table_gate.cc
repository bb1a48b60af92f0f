// The run table's admission gate: leases of generation slots, their expiry
// and release (run_table.h says the rule).
#include "replay_buffer/run_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace sluice::replay_buffer {

// ---------------------------------------------------------------------------
// The admission gate
// ---------------------------------------------------------------------------

int64_t RunTable::AdmissionLimitLocked() const {
  return (int64_t{max_staleness_} + policy_version_ + 1) * batch_size_groups_;
}

int64_t RunTable::CapacityLocked() const {
  return AdmissionLimitLocked() - accepted_ - static_cast<int64_t>(leases_.size());
}

GateState RunTable::GateLocked() const {
  return GateState{.policy_version = policy_version_,
                   .accepted = accepted_,
                   .running = static_cast<int64_t>(leases_.size()),
                   .admission_limit = AdmissionLimitLocked()};
}

bool RunTable::CanGrantOrShutdown() const { return shutdown_ || CapacityLocked() > 0; }

void RunTable::ExpireLeasesLocked() {
  // Expiry is not journaled: a restored lease gets a fresh TTL and expires
  // again if its worker is gone.
  const absl::Time now = options_.clock();
  while (!lease_expiry_.empty() && lease_expiry_.begin()->first <= now) {
    leases_.erase(lease_expiry_.begin()->second);
    lease_expiry_.erase(lease_expiry_.begin());
  }
}

void RunTable::EraseLeaseLocked(absl::flat_hash_map<std::string, Lease>::iterator it) {
  lease_expiry_.erase({it->second.expires_at, it->first});
  leases_.erase(it);
}

bool RunTable::ReleaseLeaseLocked(const std::string& lease_id) {
  if (lease_id.empty()) return false;
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return false;
  EraseLeaseLocked(it);
  return true;
}

absl::Status RunTable::ReleaseLeasesLocked(const std::vector<std::string>& lease_ids) {
  if (lease_ids.empty()) return absl::OkStatus();
  v1::storage::WalRecord record;
  for (const std::string& id : lease_ids) record.mutable_leases_released()->add_lease_ids(id);
  RETURN_IF_ERROR(JournalLocked(record).status());
  for (const std::string& id : lease_ids) ReleaseLeaseLocked(id);
  return absl::OkStatus();
}

void RunTable::AddLeaseLocked(const std::string& id, const std::string& worker_id,
                              uint64_t incarnation, absl::Time expires_at) {
  auto [it, inserted] = leases_.try_emplace(
      id, Lease{.worker_id = worker_id, .incarnation = incarnation, .expires_at = expires_at});
  if (!inserted) lease_expiry_.erase({it->second.expires_at, id});
  it->second.expires_at = expires_at;
  lease_expiry_.emplace(expires_at, id);
}

void RunTable::ApplyLeasesGrantedLocked(const v1::storage::LeasesGranted& granted,
                                        absl::Time expires_at) {
  const std::string& worker = granted.worker_id();
  const uint64_t incarnation = granted.worker_incarnation();
  auto [known, first_call] = worker_incarnations_.try_emplace(worker, incarnation);
  if (!first_call && incarnation > known->second) {
    known->second = incarnation;
    // A restarted worker: its older incarnations' slots are over.
    for (auto it = leases_.begin(); it != leases_.end();) {
      auto current = it++;
      if (current->second.worker_id == worker && current->second.incarnation < incarnation) {
        EraseLeaseLocked(current);
      }
    }
  }
  for (const std::string& id : granted.lease_ids()) {
    AddLeaseLocked(id, worker, incarnation, expires_at);
    ++next_lease_number_;
  }
}

absl::Time RunTable::NextExpiryRealTimeLocked() const {
  if (lease_expiry_.empty()) return absl::InfiniteFuture();
  return absl::Now() + (lease_expiry_.begin()->first - options_.clock());
}

absl::StatusOr<AcquireResult> RunTable::AcquireSlots(const AcquireRequest& request) {
  if (request.worker_id.empty()) return absl::InvalidArgumentError("worker_id: required");
  if (request.num_groups < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_groups: must be >= 0, got ", request.num_groups));
  }
  if (request.wait_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_timeout_ms: must be >= 0, got ", absl::ToInt64Milliseconds(request.wait_timeout)));
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + request.wait_timeout;

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError(kRunTableShuttingDown);
  if (quarantined_workers_.count(request.worker_id) > 0) {
    return absl::PermissionDeniedError(QuarantineMessage(run_id_, request.worker_id));
  }
  if (!request.caller.empty() && quarantined_connections_.count(request.caller) > 0) {
    return absl::PermissionDeniedError(ConnectionQuarantineMessage(run_id_, request.caller));
  }
  ExpireLeasesLocked();

  const auto known = worker_incarnations_.find(request.worker_id);
  if (known != worker_incarnations_.end() && request.worker_incarnation < known->second) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker_incarnation: worker ", request.worker_id, " incarnation ",
                     request.worker_incarnation, " is older than incarnation ", known->second,
                     " already seen; a restarted worker must use a higher incarnation"));
  }
  if (known == worker_incarnations_.end() || request.worker_incarnation > known->second) {
    // First call or a restart: recorded (and the older leases dropped) now.
    v1::storage::WalRecord record;
    record.mutable_leases_granted()->set_worker_id(request.worker_id);
    record.mutable_leases_granted()->set_worker_incarnation(request.worker_incarnation);
    RETURN_IF_ERROR(JournalLocked(record).status());
    ApplyLeasesGrantedLocked(record.leases_granted(), absl::InfinitePast());
  }

  AcquireResult result;
  // Renewing before a wait keeps the leases alive through it; renewing again
  // after makes lease_expires_at true for all of them.
  const auto renew = [&](std::vector<std::string>* unknown) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time expires_at = options_.clock() + options_.lease_ttl;
    for (const std::string& id : request.renew_lease_ids) {
      auto it = leases_.find(id);
      if (it == leases_.end() || it->second.worker_id != request.worker_id) {
        if (unknown != nullptr) unknown->push_back(id);
        continue;
      }
      lease_expiry_.erase({it->second.expires_at, id});
      it->second.expires_at = expires_at;
      lease_expiry_.emplace(expires_at, id);
    }
  };
  renew(&result.expired_lease_ids);

  if (request.num_groups > 0 && CapacityLocked() <= 0 &&
      request.wait_timeout > absl::ZeroDuration()) {
    while (!shutdown_) {
      ExpireLeasesLocked();
      if (CapacityLocked() > 0 || absl::Now() >= deadline) break;
      // Wakes on anything that frees capacity; expiries are timed, not signalled.
      mu_.AwaitWithDeadline(absl::Condition(this, &RunTable::CanGrantOrShutdown),
                            std::min(deadline, NextExpiryRealTimeLocked()));
    }
    result.waited = absl::Now() - start;
    admission_blocked_ += result.waited;
    if (shutdown_) return absl::UnavailableError(kRunTableShuttingDown);
    renew(nullptr);
  }

  const int64_t granted =
      std::min<int64_t>(request.num_groups, std::max<int64_t>(0, CapacityLocked()));
  const absl::Time expires_at = options_.clock() + options_.lease_ttl;
  if (granted > 0) {
    v1::storage::WalRecord record;
    v1::storage::LeasesGranted& leases = *record.mutable_leases_granted();
    leases.set_worker_id(request.worker_id);
    leases.set_worker_incarnation(request.worker_incarnation);
    for (int64_t i = 0; i < granted; ++i) {
      leases.add_lease_ids(absl::StrCat(lease_id_prefix_, next_lease_number_ + i));
    }
    RETURN_IF_ERROR(JournalLocked(record).status());
    ApplyLeasesGrantedLocked(leases, expires_at);
    result.lease_ids.assign(leases.lease_ids().begin(), leases.lease_ids().end());
  }
  result.lease_expires_at = expires_at;
  result.lease_ttl = options_.lease_ttl;
  result.gate = GateLocked();
  return result;
}

ReleaseResult RunTable::ReleaseSlots(const ReleaseRequest& request) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  std::vector<std::string> ids;
  if (request.release_all) {
    for (const auto& [id, lease] : leases_) {
      if (lease.worker_id == request.worker_id) ids.push_back(id);
    }
  } else {
    for (const std::string& id : request.lease_ids) {
      auto it = leases_.find(id);
      if (it == leases_.end() || it->second.worker_id != request.worker_id) continue;
      ids.push_back(id);
    }
  }
  ReleaseResult result;
  // A journal failure keeps the leases; they expire by TTL.
  if (ReleaseLeasesLocked(ids).ok()) result.released = static_cast<int32_t>(ids.size());
  result.running = static_cast<int64_t>(leases_.size());
  return result;
}

std::string QuarantineMessage(const std::string& run_id, const std::string& worker_id) {
  return absl::StrCat("rollout worker ", worker_id, " is quarantined for run ", run_id,
                      ": the trainer's rollout verification found its groups' log-probs, tokens "
                      "or versions forged; its generation slots and inserts are refused for the "
                      "rest of the run");
}

std::string ConnectionQuarantineMessage(const std::string& run_id, const std::string& connection) {
  return absl::StrCat("the connection ", connection, " is quarantined for run ", run_id,
                      ": groups it inserted failed the trainer's rollout verification; its "
                      "generation slots and inserts are refused for the rest of the run (it "
                      "proved no identity, so the worker id it named is not quarantined)");
}

std::vector<std::string> RunTable::QuarantineConnections(
    const std::vector<std::string>& connections) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> added;
  for (const std::string& connection : connections) {
    if (!connection.empty() && quarantined_connections_.insert(connection).second) {
      added.push_back(connection);
    }
  }
  return added;
}

absl::StatusOr<std::vector<std::string>> RunTable::QuarantineWorkers(
    const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  v1::storage::WalRecord record;
  for (const std::string& id : worker_ids) {
    if (id.empty() || quarantined_workers_.count(id) > 0) continue;
    if (std::find(record.quarantined().worker_ids().begin(),
                  record.quarantined().worker_ids().end(),
                  id) != record.quarantined().worker_ids().end()) {
      continue;
    }
    record.mutable_quarantined()->add_worker_ids(id);
  }
  std::vector<std::string> added(record.quarantined().worker_ids().begin(),
                                 record.quarantined().worker_ids().end());
  if (added.empty()) return added;
  RETURN_IF_ERROR(JournalLocked(record).status());
  ApplyQuarantineLocked(record.quarantined());
  return added;
}

std::vector<std::string> RunTable::QuarantinedWorkers() const {
  absl::MutexLock lock(&mu_);
  return std::vector<std::string>(quarantined_workers_.begin(), quarantined_workers_.end());
}

void RunTable::ApplyQuarantineLocked(const v1::storage::WorkersQuarantined& quarantined) {
  quarantined_workers_.insert(quarantined.worker_ids().begin(), quarantined.worker_ids().end());
  // Their slots give their capacity back at once, as a release would (the
  // leases are not journaled one by one: replaying this record drops them).
  std::vector<std::string> dropped;
  for (const auto& [id, lease] : leases_) {
    if (quarantined_workers_.count(lease.worker_id) > 0) dropped.push_back(id);
  }
  for (const std::string& id : dropped) ReleaseLeaseLocked(id);
}

}  // namespace sluice::replay_buffer
