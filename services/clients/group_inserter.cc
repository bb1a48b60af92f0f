#include "services/clients/group_inserter.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "services/clients/retrier.h"

namespace sluice::clients {
namespace {

bool IsRefusal(v1::InsertStatus status) {
  return status == v1::INSERT_STATUS_REJECTED_STALE || status == v1::INSERT_STATUS_INVALID ||
         status == v1::INSERT_STATUS_UNKNOWN_RUN;
}

}  // namespace

bool IsRetryableInsertError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

absl::Status GroupInserterOptions::Validate() const {
  std::vector<std::string> problems;
  if (deadline <= absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("deadline: must be > 0, got ", absl::FormatDuration(deadline)));
  }
  if (max_attempts < 1) {
    problems.push_back(absl::StrCat("max_attempts: must be >= 1, got ", max_attempts));
  }
  CheckBackoff(initial_backoff, max_backoff, backoff_multiplier, jitter, problems);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

int64_t InsertOutcome::stored() const {
  return std::count_if(groups.begin(), groups.end(),
                       [](const GroupInsertResult& g) { return g.stored(); });
}

int64_t InsertOutcome::duplicates() const {
  return std::count_if(groups.begin(), groups.end(), [](const GroupInsertResult& g) {
    return g.status == v1::INSERT_STATUS_DUPLICATE;
  });
}

int64_t InsertOutcome::refused() const {
  return std::count_if(groups.begin(), groups.end(),
                       [](const GroupInsertResult& g) { return IsRefusal(g.status); });
}

int64_t InsertOutcome::unresolved() const {
  return std::count_if(groups.begin(), groups.end(),
                       [](const GroupInsertResult& g) { return !g.resolved(); });
}

absl::StatusOr<std::unique_ptr<GroupInserter>> GroupInserter::Create(ReplayBufferClient& client,
                                                                     GroupInserterOptions options) {
  if (absl::Status valid = options.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid GroupInserter options: ", valid.message()));
  }
  return std::unique_ptr<GroupInserter>(new GroupInserter(client, std::move(options)));
}

GroupInserter::GroupInserter(ReplayBufferClient& client, GroupInserterOptions options)
    : client_(client), options_(std::move(options)), rng_(options_.seed) {}

absl::Status GroupInserter::fatal_error() const {
  absl::MutexLock lock(&mu_);
  return fatal_error_;
}

absl::Duration GroupInserter::Backoff(int retry) {
  absl::Duration backoff = options_.initial_backoff;
  for (int i = 1; i < retry && backoff < options_.max_backoff; ++i) {
    backoff *= options_.backoff_multiplier;
  }
  backoff = std::min(backoff, options_.max_backoff);
  if (options_.jitter <= 0) return backoff;
  double fraction;
  {
    absl::MutexLock lock(&mu_);
    fraction = std::uniform_real_distribution<double>(0.0, options_.jitter)(rng_);
  }
  return backoff * (1.0 - fraction);
}

absl::StatusOr<InsertOutcome> GroupInserter::Insert(std::vector<v1::Group> groups) {
  if (absl::Status fatal = fatal_error(); !fatal.ok()) return fatal;
  InsertOutcome outcome;
  outcome.groups.resize(groups.size());
  absl::flat_hash_map<std::string, size_t> index_of_key;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string& key = groups[i].idempotency_key();
    if (key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", i, " (group_id \"", groups[i].group_id(),
          "\") has no idempotency_key; inserts are retried, so every group needs one"));
    }
    if (auto [it, inserted] = index_of_key.emplace(key, i); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat("groups ", it->second, " and ", i,
                                                     " share the idempotency_key \"", key,
                                                     "\"; the buffer would store only one"));
    }
    outcome.groups[i].idempotency_key = key;
    outcome.groups[i].group_id = groups[i].group_id();
  }
  if (groups.empty()) return outcome;

  const auto now = [this] { return options_.clock ? options_.clock() : absl::Now(); };
  const absl::Time deadline = now() + options_.deadline;
  // Indices into `groups` of the groups still to send, in input order.
  std::vector<size_t> pending(groups.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;

  while (true) {
    v1::InsertGroupsRequest request;
    absl::flat_hash_map<absl::string_view, size_t> slot_of_key;  // key -> index in `pending`
    for (size_t p = 0; p < pending.size(); ++p) {
      const v1::Group& group = groups[pending[p]];
      *request.add_groups() = group;
      slot_of_key.emplace(group.idempotency_key(), p);
      ++outcome.groups[pending[p]].sends;
    }
    ++outcome.attempts;
    absl::StatusOr<v1::InsertGroupsResponse> response = client_.InsertGroups(request);

    absl::Status why;  // why groups are still pending after this call
    // Whether the call failed as a whole (the buffer unreachable), rather
    // than answering RETRYABLE_ERROR for some groups.
    const bool call_failed = !response.ok();
    if (!response.ok()) {
      for (size_t i : pending) {
        GroupInsertResult& result = outcome.groups[i];
        result.status = v1::INSERT_STATUS_UNSPECIFIED;
        result.message = absl::StrCat("no answer: ", response.status().message());
      }
      if (!IsRetryableInsertError(response.status().code())) {
        const absl::Status fatal(response.status().code(),
                                 absl::StrCat("InsertGroups failed with a non-retryable error: ",
                                              response.status().message()));
        {
          absl::MutexLock lock(&mu_);
          if (fatal_error_.ok()) fatal_error_ = fatal;
        }
        outcome.status = fatal;
        return outcome;
      }
      why = response.status();
    } else {
      // A result names its group by key; one without a key is taken to be
      // for the group at its position in the request.
      std::vector<bool> answered(pending.size(), false);
      for (int r = 0; r < response->results_size(); ++r) {
        const v1::InsertGroupResult& answer = response->results(r);
        size_t slot = pending.size();
        if (answer.idempotency_key().empty()) {
          slot = std::min(static_cast<size_t>(r), pending.size());
        } else if (auto it = slot_of_key.find(answer.idempotency_key()); it != slot_of_key.end()) {
          slot = it->second;
        }
        if (slot == pending.size() || answered[slot]) continue;  // not one of ours
        answered[slot] = true;
        GroupInsertResult& result = outcome.groups[pending[slot]];
        result.status = answer.status();
        result.message = answer.message();
        result.buffer_sequence = result.stored() ? answer.buffer_sequence() : -1;
      }
      std::vector<size_t> still_pending;
      int retryable = 0;
      std::string first_message;
      for (size_t p = 0; p < pending.size(); ++p) {
        GroupInsertResult& result = outcome.groups[pending[p]];
        if (!answered[p]) {
          // Possibly stored; the resend will tell (DUPLICATE).
          result.status = v1::INSERT_STATUS_UNSPECIFIED;
          result.message = "the buffer's response had no result for this group";
        } else if (result.resolved()) {
          continue;
        } else {
          ++retryable;
          if (first_message.empty()) first_message = result.message;
        }
        still_pending.push_back(pending[p]);
      }
      pending = std::move(still_pending);
      if (pending.empty()) {
        outcome.status = absl::OkStatus();
        return outcome;
      }
      why = absl::UnavailableError(
          retryable > 0
              ? absl::StrCat(retryable, " group(s) answered RETRYABLE_ERROR: ", first_message)
              : absl::StrCat(pending.size(), " group(s) missing from the buffer's response"));
    }

    // Stops with `code`, saying where the Insert stood.
    const auto give_up = [&](absl::StatusCode code, absl::string_view what) {
      outcome.status = absl::Status(
          code, absl::StrCat(what, " after ", outcome.attempts, " InsertGroups call(s) with ",
                             pending.size(), " of ", groups.size(),
                             " group(s) unconfirmed; last error: ", why.message()));
      return outcome;
    };
    // The deadline passed. When the last call failed as a whole, the buffer
    // has been unreachable (or breaking calls) for the whole deadline: the
    // error is marked final (IsRetriesExhausted) for the caller.
    const auto deadline_passed = [&] {
      give_up(absl::StatusCode::kDeadlineExceeded,
              absl::StrCat("insert deadline of ", absl::FormatDuration(options_.deadline),
                           " passed"));
      if (call_failed) {
        outcome.status =
            MarkRetriesExhausted(PrefixMessage(outcome.status, "replay_buffer unreachable"));
      }
      return outcome;
    };
    // A client that retries by itself (retrier.h) already gave up.
    if (IsRetriesExhausted(why)) {
      give_up(why.code(), "gave up");
      outcome.status = MarkRetriesExhausted(outcome.status);
      return outcome;
    }
    if (outcome.attempts >= options_.max_attempts) return give_up(why.code(), "gave up");
    const absl::Duration left = deadline - now();
    if (left <= absl::ZeroDuration()) return deadline_passed();
    const absl::Duration backoff = std::min(Backoff(outcome.attempts), left);
    if (options_.on_retry) options_.on_retry(why, outcome.attempts, backoff);
    if (options_.sleep) {
      if (!options_.sleep(backoff)) {
        return give_up(absl::StatusCode::kCancelled, "insert abandoned by the caller");
      }
    } else {
      absl::SleepFor(backoff);
    }
    if (now() >= deadline) return deadline_passed();
  }
}

}  // namespace sluice::clients
