#include "replay_buffer/admission_gate.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::replay_buffer {
namespace {

std::string NewLeaseIdPrefix() {
  absl::BitGen random;
  return absl::StrFormat("lease-%012x-", absl::Uniform<uint64_t>(random) >> 16);
}

}  // namespace

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

AdmissionGate::AdmissionGate(Options options, int64_t initial_policy_version)
    : options_(std::move(options)),
      lease_id_prefix_(NewLeaseIdPrefix()),
      policy_version_(initial_policy_version),
      accepted_(initial_policy_version * options_.batch_size_groups) {}

// ---------------------------------------------------------------------------
// The rule
// ---------------------------------------------------------------------------

int64_t AdmissionGate::admission_limit() const {
  return (int64_t{options_.max_staleness} + policy_version_ + 1) * options_.batch_size_groups;
}

GateState AdmissionGate::state() const {
  return GateState{.policy_version = policy_version_,
                   .accepted = accepted_,
                   .running = running(),
                   .admission_limit = admission_limit()};
}

bool AdmissionGate::AdvanceVersion(int64_t policy_version) {
  if (policy_version <= policy_version_) return false;
  policy_version_ = policy_version;
  return true;
}

absl::Status AdmissionGate::CheckRequest(const AcquireRequest& request) {
  if (request.worker_id.empty()) return absl::InvalidArgumentError("worker_id: required");
  if (request.num_groups < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_groups: must be >= 0, got ", request.num_groups));
  }
  if (request.wait_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_timeout_ms: must be >= 0, got ", absl::ToInt64Milliseconds(request.wait_timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> AdmissionGate::IsNewIncarnation(const std::string& worker_id,
                                                     uint64_t incarnation) const {
  const auto known = worker_incarnations_.find(worker_id);
  if (known == worker_incarnations_.end()) return true;
  if (incarnation < known->second) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker_incarnation: worker ", worker_id, " incarnation ", incarnation,
                     " is older than incarnation ", known->second,
                     " already seen; a restarted worker must use a higher incarnation"));
  }
  return incarnation > known->second;
}

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

std::vector<std::string> AdmissionGate::NextLeaseIds(int64_t count) const {
  std::vector<std::string> ids;
  ids.reserve(static_cast<size_t>(std::max<int64_t>(0, count)));
  for (int64_t i = 0; i < count; ++i) {
    ids.push_back(absl::StrCat(lease_id_prefix_, next_lease_number_ + i));
  }
  return ids;
}

void AdmissionGate::Grant(const v1::storage::LeasesGranted& granted, absl::Time expires_at) {
  const std::string& worker = granted.worker_id();
  const uint64_t incarnation = granted.worker_incarnation();
  auto [known, first_call] = worker_incarnations_.try_emplace(worker, incarnation);
  if (!first_call && incarnation > known->second) {
    known->second = incarnation;
    // A restarted worker: its older incarnations' slots are over.
    for (auto it = leases_.begin(); it != leases_.end();) {
      auto current = it++;
      if (current->second.worker_id == worker && current->second.incarnation < incarnation) {
        Erase(current);
      }
    }
  }
  for (const std::string& id : granted.lease_ids()) {
    Add(id, worker, incarnation, expires_at);
    ++next_lease_number_;
  }
}

void AdmissionGate::Renew(const std::string& worker_id, const std::vector<std::string>& lease_ids,
                          std::vector<std::string>* not_renewed) {
  const absl::Time expires_at = FreshExpiry();
  for (const std::string& id : lease_ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.worker_id != worker_id) {
      if (not_renewed != nullptr) not_renewed->push_back(id);
      continue;
    }
    lease_expiry_.erase({it->second.expires_at, id});
    it->second.expires_at = expires_at;
    lease_expiry_.emplace(expires_at, id);
  }
}

void AdmissionGate::ExpireLeases() {
  const absl::Time now = options_.clock();
  while (!lease_expiry_.empty() && lease_expiry_.begin()->first <= now) {
    leases_.erase(lease_expiry_.begin()->second);
    lease_expiry_.erase(lease_expiry_.begin());
  }
}

bool AdmissionGate::Release(const std::string& lease_id) {
  if (lease_id.empty()) return false;
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return false;
  Erase(it);
  return true;
}

std::vector<std::string> AdmissionGate::LeasesToRelease(const ReleaseRequest& request) const {
  std::vector<std::string> ids;
  if (request.release_all) {
    for (const auto& [id, lease] : leases_) {
      if (lease.worker_id == request.worker_id) ids.push_back(id);
    }
    return ids;
  }
  for (const std::string& id : request.lease_ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.worker_id != request.worker_id) continue;
    ids.push_back(id);
  }
  return ids;
}

absl::Time AdmissionGate::NextExpiryRealTime() const {
  if (lease_expiry_.empty()) return absl::InfiniteFuture();
  return absl::Now() + (lease_expiry_.begin()->first - options_.clock());
}

void AdmissionGate::Erase(absl::flat_hash_map<std::string, Lease>::iterator it) {
  lease_expiry_.erase({it->second.expires_at, it->first});
  leases_.erase(it);
}

void AdmissionGate::Add(const std::string& id, const std::string& worker_id, uint64_t incarnation,
                        absl::Time expires_at) {
  auto [it, inserted] = leases_.try_emplace(
      id, Lease{.worker_id = worker_id, .incarnation = incarnation, .expires_at = expires_at});
  if (!inserted) lease_expiry_.erase({it->second.expires_at, id});
  it->second.expires_at = expires_at;
  lease_expiry_.emplace(expires_at, id);
}

// ---------------------------------------------------------------------------
// Quarantine
// ---------------------------------------------------------------------------

absl::Status AdmissionGate::CheckNotQuarantined(const std::string& worker_id,
                                                const std::string& caller) const {
  if (quarantined_workers_.count(worker_id) > 0) {
    return absl::PermissionDeniedError(QuarantineMessage(options_.run_id, worker_id));
  }
  if (!caller.empty() && quarantined_connections_.count(caller) > 0) {
    return absl::PermissionDeniedError(ConnectionQuarantineMessage(options_.run_id, caller));
  }
  return absl::OkStatus();
}

absl::Status AdmissionGate::CheckGroupNotQuarantined(const v1::Group& group) const {
  if (!quarantined_workers_.empty()) {
    for (const v1::Trajectory& t : group.trajectories()) {
      if (quarantined_workers_.count(t.rollout_worker_id()) > 0) {
        return absl::PermissionDeniedError(
            QuarantineMessage(options_.run_id, t.rollout_worker_id()));
      }
    }
  }
  if (!group.inserted_by().empty() && quarantined_connections_.count(group.inserted_by()) > 0) {
    return absl::PermissionDeniedError(
        ConnectionQuarantineMessage(options_.run_id, group.inserted_by()));
  }
  return absl::OkStatus();
}

std::vector<std::string> AdmissionGate::NotQuarantined(
    const std::vector<std::string>& worker_ids) const {
  std::vector<std::string> added;
  for (const std::string& id : worker_ids) {
    if (id.empty() || quarantined_workers_.count(id) > 0) continue;
    if (std::find(added.begin(), added.end(), id) != added.end()) continue;
    added.push_back(id);
  }
  return added;
}

void AdmissionGate::QuarantineWorkers(const v1::storage::WorkersQuarantined& quarantined) {
  quarantined_workers_.insert(quarantined.worker_ids().begin(), quarantined.worker_ids().end());
  std::vector<std::string> dropped;
  for (const auto& [id, lease] : leases_) {
    if (quarantined_workers_.count(lease.worker_id) > 0) dropped.push_back(id);
  }
  for (const std::string& id : dropped) Release(id);
}

bool AdmissionGate::QuarantineConnection(const std::string& connection) {
  return !connection.empty() && quarantined_connections_.insert(connection).second;
}

// ---------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------

void AdmissionGate::ToSnapshot(v1::storage::TableSnapshot* table) const {
  table->set_policy_version(policy_version_);
  table->set_accepted(accepted_);
  for (const auto& [id, lease] : leases_) {
    v1::storage::SnapshotLease& entry = *table->add_leases();
    entry.set_lease_id(id);
    entry.set_worker_id(lease.worker_id);
    entry.set_worker_incarnation(lease.incarnation);
  }
  for (const auto& [worker, incarnation] : worker_incarnations_) {
    (*table->mutable_worker_incarnations())[worker] = incarnation;
  }
  table->set_next_lease_number(next_lease_number_);
  for (const std::string& worker : quarantined_workers_) table->add_quarantined_workers(worker);
}

void AdmissionGate::RestoreFromSnapshot(const v1::storage::TableSnapshot& table) {
  policy_version_ = table.policy_version();
  accepted_ = table.accepted();
  quarantined_workers_.insert(table.quarantined_workers().begin(),
                              table.quarantined_workers().end());
  for (const auto& [worker, incarnation] : table.worker_incarnations()) {
    worker_incarnations_[worker] = incarnation;
  }
  const absl::Time expires_at = FreshExpiry();
  for (const v1::storage::SnapshotLease& lease : table.leases()) {
    Add(lease.lease_id(), lease.worker_id(), lease.worker_incarnation(), expires_at);
  }
  next_lease_number_ = table.next_lease_number();
}

}  // namespace sluice::replay_buffer
