#include "cli/supervisor.h"

#include <string.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::cli {

absl::Status RestartPolicyOptions::Validate() const {
  if (max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts must be >= 0, got ", max_restarts));
  }
  if (window <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("the restart window must be > 0, got ",
                                                   absl::FormatDuration(window)));
  }
  if (initial_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("initial_backoff must be >= 0, got ",
                                                   absl::FormatDuration(initial_backoff)));
  }
  if (max_backoff < initial_backoff) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_backoff (", absl::FormatDuration(max_backoff),
                     ") must be >= initial_backoff (", absl::FormatDuration(initial_backoff), ")"));
  }
  return absl::OkStatus();
}

RestartPolicy::RestartPolicy(RestartPolicyOptions options, Clock clock)
    : options_(std::move(options)), clock_(std::move(clock)) {}

RestartDecision RestartPolicy::OnFailure(const std::string& service, std::string description) {
  const absl::Time now = clock_();
  History& history = histories_[service];
  std::vector<ServiceFailure>& failures = history.failures;
  failures.erase(std::remove_if(failures.begin(), failures.end(),
                                [&](const ServiceFailure& failure) {
                                  return now - failure.at >= options_.window;
                                }),
                 failures.end());
  failures.push_back({now, std::move(description)});

  RestartDecision decision;
  decision.recent_failures = failures;
  const int in_window = static_cast<int>(failures.size());
  if (!options_.restart_on_failure) {
    decision.action = RestartDecision::Action::kGiveUp;
    decision.give_up_reason = "--restart never";
    return decision;
  }
  if (in_window > options_.max_restarts) {
    decision.action = RestartDecision::Action::kGiveUp;
    decision.give_up_reason = absl::StrFormat(
        "it failed %d times within %s, more than the %d restart%s allowed", in_window,
        absl::FormatDuration(options_.window), options_.max_restarts,
        options_.max_restarts == 1 ? "" : "s");
    return decision;
  }
  decision.action = RestartDecision::Action::kRestart;
  decision.restart_in_window = in_window;
  // initial * 2^(n-1), capped; doubling stops at the cap so it never overflows.
  absl::Duration delay = options_.initial_backoff;
  for (int i = 1; i < in_window && delay < options_.max_backoff; ++i) delay *= 2;
  decision.delay = std::min(delay, options_.max_backoff);
  return decision;
}

void RestartPolicy::OnRestarted(const std::string& service) { ++histories_[service].restarts; }

int RestartPolicy::restarts(const std::string& service) const {
  const auto it = histories_.find(service);
  return it == histories_.end() ? 0 : it->second.restarts;
}

std::string RestartPolicy::DescribeRestart(const RestartDecision& decision) const {
  return absl::StrFormat("restart %d of %d allowed in %s", decision.restart_in_window,
                         options_.max_restarts, absl::FormatDuration(options_.window));
}

absl::Status LivenessOptions::Validate() const {
  if (period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--liveness-period must be >= 0 (0 = off), got ",
                                                   absl::FormatDuration(period)));
  }
  if (!enabled()) return absl::OkStatus();
  if (timeout <= absl::ZeroDuration() || timeout > period) {
    return absl::InvalidArgumentError(
        absl::StrCat("--liveness-timeout must be > 0 and at most --liveness-period (",
                     absl::FormatDuration(period), "), got ", absl::FormatDuration(timeout)));
  }
  if (failures < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--liveness-failures must be >= 1, got ", failures));
  }
  return absl::OkStatus();
}

bool LivenessCount::OnProbe(bool answered, const std::string& error) {
  if (answered) {
    failures_ = 0;
    return false;
  }
  last_error_ = error;
  if (++failures_ < options_.failures) return false;
  last_run_ = failures_;
  failures_ = 0;
  return true;
}

std::string LivenessCount::Describe() const {
  return absl::StrCat("did not answer its health check within ",
                      absl::FormatDuration(options_.timeout), ", ", last_run_,
                      last_run_ == 1 ? " time" : " times in a row", " (last: ", last_error_, ")");
}

bool IsFailure(const ExitStatus& exit) { return !exit.success(); }

std::string DescribeExit(const ExitStatus& exit) {
  if (!exit.signaled) return absl::StrCat("exited with code ", exit.code);
  const char* abbreviation = sigabbrev_np(exit.signal);
  return absl::StrCat("was killed by signal ", exit.signal, " (",
                      abbreviation != nullptr ? absl::StrCat("SIG", abbreviation)
                                              : std::string(strsignal(exit.signal)),
                      ")");
}

}  // namespace sluice::cli
