#include "services/clients/retrier.h"

#include <algorithm>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/retry_after.h"

namespace sluice::clients {
namespace {

// The absl::Status payload that marks IsRetriesExhausted.
constexpr absl::string_view kRetriesExhaustedUrl = "type.sluice.dev/sluice.RetriesExhausted";

std::string Format(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

void RetryCancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

bool RetryCancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool RetryCancellation::WaitFor(absl::Duration timeout, const std::atomic<bool>* also) const {
  absl::MutexLock lock(&mu_);
  // absl::Mutex re-evaluates the condition whenever the mutex is released,
  // so Cancel() and Wake() end the wait.
  const auto stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || (also != nullptr && also->load());
  };
  mu_.AwaitWithTimeout(absl::Condition(&stop), timeout);
  return stop();
}

void RetryCancellation::Wake() const { absl::MutexLock lock(&mu_); }

void CheckBackoff(absl::Duration initial_backoff, absl::Duration max_backoff,
                  double backoff_multiplier, double jitter, std::vector<std::string>& problems) {
  if (initial_backoff < absl::ZeroDuration()) {
    problems.push_back(
        absl::StrCat("initial_backoff: must be >= 0, got ", absl::FormatDuration(initial_backoff)));
  }
  if (max_backoff < initial_backoff) {
    problems.push_back(absl::StrCat("max_backoff: must be >= initial_backoff (",
                                    absl::FormatDuration(initial_backoff), "), got ",
                                    absl::FormatDuration(max_backoff)));
  }
  if (!(backoff_multiplier >= 1.0)) {
    problems.push_back(absl::StrCat("backoff_multiplier: must be >= 1, got ", backoff_multiplier));
  }
  if (!(jitter >= 0.0 && jitter <= 1.0)) {
    problems.push_back(absl::StrCat("jitter: must be in [0, 1], got ", jitter));
  }
}

absl::Status RetryOptions::Validate() const {
  std::vector<std::string> problems;
  CheckBackoff(initial_backoff, max_backoff, backoff_multiplier, jitter, problems);
  if (deadline < absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("deadline: must be >= 0, got ", absl::FormatDuration(deadline)));
  }
  if (max_ambiguous_retries < 0) {
    problems.push_back(
        absl::StrCat("max_ambiguous_retries: must be >= 0, got ", max_ambiguous_retries));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid retry options: ", absl::StrJoin(problems, "; ")));
}

bool IsRetryable(absl::StatusCode code, RetryOn on) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
      return true;
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kCancelled:
      return on == RetryOn::kTransient;
    default:
      return false;
  }
}

bool IsRetriesExhausted(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kRetriesExhaustedUrl).has_value();
}

absl::Status MarkRetriesExhausted(absl::Status status) {
  if (!status.ok()) status.SetPayload(kRetriesExhaustedUrl, absl::Cord("1"));
  return status;
}

absl::Status PrefixMessage(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  absl::Status prefixed(status.code(), absl::StrCat(prefix, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    prefixed.SetPayload(url, payload);
  });
  return prefixed;
}

Retrier::Retrier(std::string service, RetryOptions options)
    : service_(std::move(service)),
      options_(std::move(options)),
      valid_(options_.Validate()),
      cancellation_(options_.cancellation != nullptr ? options_.cancellation
                                                     : std::make_shared<RetryCancellation>()),
      rng_(options_.seed) {}

double Retrier::Jitter() {
  if (options_.jitter <= 0) return 0.0;
  absl::MutexLock lock(&mu_);
  return std::uniform_real_distribution<double>(0.0, options_.jitter)(rng_);
}

absl::Duration Retrier::Backoff(int retry) {
  absl::Duration backoff = options_.initial_backoff;
  for (int i = 1; i < retry && backoff < options_.max_backoff; ++i) {
    backoff *= options_.backoff_multiplier;
  }
  backoff = std::min(backoff, options_.max_backoff);
  return backoff * (1.0 - Jitter());
}

absl::Duration Retrier::HintedBackoff(absl::Duration hint) {
  // Lengthened, not shortened: the server asked for at least `hint`, and
  // clients it refused together should not all come back at its end.
  const absl::Duration at_least = std::max(hint, options_.initial_backoff);
  return at_least * (1.0 + Jitter());
}

absl::Status Retrier::Run(absl::string_view method, RetryOn on,
                          absl::FunctionRef<absl::Status()> attempt, const CallLimits& limits) {
  if (!valid_.ok()) return valid_;
  const absl::Duration deadline = limits.deadline.value_or(options_.deadline);
  const absl::Time start = Now();
  const auto stopped = [&] {
    return cancellation_->cancelled() || (limits.stop != nullptr && limits.stop->load());
  };
  const auto stopped_error = [&](const absl::Status& last) {
    return absl::CancelledError(absl::StrCat("retries of ", service_, " ", method,
                                             " stopped (the caller is stopping); last error: ",
                                             last.message()));
  };
  const auto notify = [&](RetryEvent::Kind kind, const absl::Status& error, int attempts,
                          absl::Duration backoff, absl::Duration failing_for) {
    if (!options_.observer) return;
    RetryEvent event;
    event.kind = kind;
    event.service = service_;
    event.method = method;
    event.error = error;
    event.attempts = attempts;
    event.backoff = backoff;
    event.failing_for = failing_for;
    options_.observer(event);
  };

  int attempts = 0;
  int ambiguous_retries = 0;
  while (true) {
    absl::Status status = attempt();
    ++attempts;
    if (status.ok()) return status;
    // The server refused the call unprocessed and said when to come back:
    // retried whatever `on` says, and not an ambiguous answer.
    const std::optional<absl::Duration> hint = RetryAfter(status);
    if (!hint.has_value() && !IsRetryable(status.code(), on)) return status;
    if (stopped()) return stopped_error(status);
    const absl::Duration failing_for = Now() - start;
    const bool unavailable = status.code() == absl::StatusCode::kUnavailable;
    const bool ambiguous = !unavailable && !hint.has_value();
    const bool out_of_time = failing_for >= deadline;
    if (out_of_time || (ambiguous && ambiguous_retries >= options_.max_ambiguous_retries)) {
      notify(RetryEvent::Kind::kGaveUp, status, attempts, absl::ZeroDuration(), failing_for);
      absl::Status gave_up = PrefixMessage(
          WithoutRetryAfter(status),
          absl::StrCat(service_,
                       hint.has_value() ? " busy"
                       : unavailable    ? " unreachable"
                                        : " failing",
                       " for ", Format(failing_for), " (", method, ": ", attempts, " attempts, ",
                       out_of_time ? absl::StrCat("retry deadline ", Format(deadline))
                                   : absl::StrCat(ambiguous_retries, " retries after ",
                                                  "answers that may not be transient"),
                       ")"));
      return limits.exhausted_is_final ? MarkRetriesExhausted(std::move(gave_up)) : gave_up;
    }
    if (ambiguous) ++ambiguous_retries;
    const absl::Duration backoff = std::min(
        hint.has_value() ? HintedBackoff(*hint) : Backoff(attempts), deadline - failing_for);
    notify(RetryEvent::Kind::kRetry, status, attempts, backoff, failing_for);
    if (cancellation_->WaitFor(backoff, limits.stop)) return stopped_error(status);
  }
}

}  // namespace sluice::clients
