#include "reward_server/scorer.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace sluice::reward_server {
namespace {

bool BlocksComposite(VerifierErrorKind kind) {
  return kind == VerifierErrorKind::kUnknownVerifier || kind == VerifierErrorKind::kInvalidInput ||
         IsRetryable(kind);
}

// Fills what the scorer owns in a verifier's outcome and enforces the
// outcome's invariants whatever the verifier returned.
void SealOutcome(const Verifier& verifier, VerifyOutcome* outcome) {
  if (outcome->error_kind == VerifierErrorKind::kNone &&
      !(outcome->reward >= 0.0 && outcome->reward <= 1.0)) {
    *outcome = VerifyOutcome::Error(
        VerifierErrorKind::kInternal,
        absl::StrCat("verifier returned reward ", outcome->reward, " outside [0, 1]"));
  }
  if (outcome->error_kind != VerifierErrorKind::kNone) outcome->reward = 0.0;
  outcome->retryable = IsRetryable(outcome->error_kind);
  outcome->verifier_name = verifier.name();
  TruncateUtf8(&outcome->detail, kMaxDetailBytes);
  TruncateUtf8(&outcome->extracted_answer, kMaxExtractedAnswerBytes);
}

VerifyOutcome RunVerifier(const Verifier& verifier, const VerifyRequest& request) {
  const absl::Time start = absl::Now();
  VerifyOutcome outcome;
  try {
    outcome = verifier.Verify(request);
  } catch (const std::exception& e) {
    outcome =
        VerifyOutcome::Error(VerifierErrorKind::kCrash, absl::StrCat("verifier threw: ", e.what()));
  } catch (...) {
    outcome =
        VerifyOutcome::Error(VerifierErrorKind::kCrash, "verifier threw a non-standard exception");
  }
  outcome.duration = absl::Now() - start;
  SealOutcome(verifier, &outcome);
  return outcome;
}

}  // namespace

// ---------------------------------------------------------------------------
// Pool state. Everything mutable below is guarded by State::mu: one lock for
// the queue, the workers and every job, taken twice per job (take, finish),
// never while a verifier runs.

namespace {

struct Worker {
  std::thread thread;
  bool busy = false;       // Running a verifier.
  bool abandoned = false;  // Detached after its job overran the deadline.
};

// Jobs of one ScoreBatch still without an outcome.
struct BatchProgress {
  size_t remaining = 0;
};

struct Job {
  enum class Phase { kQueued, kRunning, kDone };

  // Immutable after creation.
  std::shared_ptr<const Verifier> verifier;
  std::shared_ptr<const VerifyRequest> request;
  std::shared_ptr<BatchProgress> batch;

  // Guarded by State::mu.
  Phase phase = Phase::kQueued;
  absl::Time started;
  std::shared_ptr<Worker> worker;  // While kRunning.
  VerifyOutcome outcome;           // Valid once kDone.
};

}  // namespace

struct Scorer::State {
  explicit State(ScorerOptions options) : options(options) {}

  const ScorerOptions options;
  mutable absl::Mutex mu;
  std::deque<std::shared_ptr<Job>> queue ABSL_GUARDED_BY(mu);
  // Live workers (joinable threads).
  std::vector<std::shared_ptr<Worker>> workers ABSL_GUARDED_BY(mu);
  // Detached threads still inside a verifier.
  int abandoned ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;

  // Gives `job` its outcome (first caller wins) and counts it done.
  void FinishLocked(Job& job, VerifyOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (job.phase == Job::Phase::kDone) return;
    job.phase = Job::Phase::kDone;
    job.outcome = std::move(outcome);
    job.worker = nullptr;
    --job.batch->remaining;
  }

  // Ends a job whose deadline passed (or the scorer stopped) before it
  // finished; a worker stuck in it is abandoned and replaced.
  static void ExpireLocked(const std::shared_ptr<State>& self, Job& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu) {
    if (job.phase == Job::Phase::kDone) return;
    VerifyOutcome outcome;
    if (job.phase == Job::Phase::kQueued) {
      outcome = VerifyOutcome::Error(
          VerifierErrorKind::kUnavailable,
          self->stopping
              ? std::string("the reward server is shutting down")
              : absl::StrCat("not started before the deadline: all ", self->options.num_workers,
                             " workers busy (server overloaded)"));
    } else if (self->stopping) {
      outcome = VerifyOutcome::Error(VerifierErrorKind::kUnavailable,
                                     "the reward server shut down while verifying");
      outcome.duration = now - job.started;
    } else {
      outcome = VerifyOutcome::Error(
          VerifierErrorKind::kTimeout,
          absl::StrCat("no result within the deadline (",
                       absl::FormatDuration(job.request->deadline - job.started),
                       " after the verifier started)"));
      outcome.duration = now - job.started;
      AbandonLocked(self, job.worker);
    }
    SealOutcome(*job.verifier, &outcome);
    self->FinishLocked(job, std::move(outcome));
  }

  static void AbandonLocked(const std::shared_ptr<State>& self,
                            const std::shared_ptr<Worker>& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu) {
    if (worker == nullptr || worker->abandoned) return;
    auto it = std::find(self->workers.begin(), self->workers.end(), worker);
    if (it != self->workers.end()) self->workers.erase(it);
    worker->abandoned = true;
    worker->thread.detach();
    ++self->abandoned;
    log::Warning("verifier overran its deadline; abandoning its thread",
                 {{"abandoned_threads", self->abandoned}});
    ReplenishLocked(self);
  }

  // Starts workers up to num_workers while the thread budget allows.
  static void ReplenishLocked(const std::shared_ptr<State>& self)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu) {
    if (self->stopping) return;
    const size_t target = static_cast<size_t>(self->options.num_workers);
    const size_t budget = target + static_cast<size_t>(self->options.max_abandoned_workers);
    while (self->workers.size() < target &&
           self->workers.size() + static_cast<size_t>(self->abandoned) < budget) {
      if (!SpawnLocked(self)) break;
    }
    if (self->workers.size() < target) {
      log::Warning("too many verifier threads stuck; running with fewer workers",
                   {{"workers", static_cast<int64_t>(self->workers.size())},
                    {"num_workers", self->options.num_workers},
                    {"abandoned_threads", self->abandoned}});
    }
  }

  static bool SpawnLocked(const std::shared_ptr<State>& self)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu) {
    auto worker = std::make_shared<Worker>();
    try {
      worker->thread = std::thread(&State::WorkerLoop, self, worker);
    } catch (const std::system_error& e) {
      log::Error("cannot start a verifier thread", {{"error", e.what()}});
      return false;
    }
    self->workers.push_back(std::move(worker));
    return true;
  }

  // Takes its references by value: the thread may outlive the Scorer.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  static void WorkerLoop(std::shared_ptr<State> self, std::shared_ptr<Worker> worker) {
    self->mu.Lock();
    const auto has_work = [&self]() {
      self->mu.AssertReaderHeld();
      return self->stopping || !self->queue.empty();
    };
    while (true) {
      self->mu.Await(absl::Condition(&has_work));
      if (self->stopping) break;
      std::shared_ptr<Job> job = std::move(self->queue.front());
      self->queue.pop_front();
      if (job->phase != Job::Phase::kQueued) continue;  // Expired while queued.
      const absl::Time now = absl::Now();
      if (now >= job->request->deadline) {
        ExpireLocked(self, *job, now);
        continue;
      }
      job->phase = Job::Phase::kRunning;
      job->started = now;
      job->worker = worker;
      worker->busy = true;
      self->mu.Unlock();

      VerifyOutcome outcome = RunVerifier(*job->verifier, *job->request);

      self->mu.Lock();
      worker->busy = false;
      if (job->phase == Job::Phase::kRunning) self->FinishLocked(*job, std::move(outcome));
      if (worker->abandoned) {
        // Its replacement already runs; this thread only frees its slot.
        --self->abandoned;
        ReplenishLocked(self);
        break;
      }
    }
    self->mu.Unlock();
  }
};

// ---------------------------------------------------------------------------

absl::Status ScorerOptions::Validate() const {
  if (num_workers < 1 || num_workers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be in [1, 1024], got ", num_workers));
  }
  if (max_abandoned_workers < 0 || max_abandoned_workers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_abandoned_workers must be in [0, 1024], got ", max_abandoned_workers));
  }
  return absl::OkStatus();
}

absl::Status ValidateComposition(const std::vector<WeightedVerifier>& composition) {
  if (composition.size() > static_cast<size_t>(kMaxCompositionSize)) {
    return absl::InvalidArgumentError(absl::StrCat("composition: at most ", kMaxCompositionSize,
                                                   " verifiers, got ", composition.size()));
  }
  for (size_t i = 0; i < composition.size(); ++i) {
    if (composition[i].name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("composition[", i, "].name: must not be empty"));
    }
    const double weight = composition[i].weight;
    if (!std::isfinite(weight) || weight < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("composition[", i, "].weight: must be >= 0 (0 means 1.0), got ", weight));
    }
  }
  return absl::OkStatus();
}

VerifyOutcome ComposeOutcomes(std::vector<VerifyOutcome> components) {
  VerifyOutcome composite;
  composite.verifier_name = "composite";
  double weight_sum = 0;
  double weighted_reward = 0;
  const VerifyOutcome* blocking = nullptr;
  bool all_failed = !components.empty();
  std::vector<std::string> parts;
  for (const VerifyOutcome& component : components) {
    weight_sum += component.weight;
    weighted_reward += component.weight * component.reward;
    composite.duration = std::max(composite.duration, component.duration);
    if (composite.extracted_answer.empty()) composite.extracted_answer = component.extracted_answer;
    if (component.error_kind == VerifierErrorKind::kNone) {
      all_failed = false;
      parts.push_back(
          absl::StrCat(component.verifier_name, "(w=", component.weight, ")=", component.reward));
    } else {
      if (blocking == nullptr && BlocksComposite(component.error_kind)) blocking = &component;
      parts.push_back(absl::StrCat(component.verifier_name, "(w=", component.weight,
                                   ")=", VerifierErrorKindName(component.error_kind)));
    }
  }
  const VerifyOutcome* failed = blocking != nullptr ? blocking
                                : all_failed        ? &components.front()
                                                    : nullptr;
  if (failed != nullptr) {
    composite.error_kind = failed->error_kind;
    composite.retryable = failed->retryable;
    composite.reward = 0;
    composite.detail = absl::StrCat(failed->verifier_name, ": ", failed->detail);
  } else {
    composite.reward = weight_sum > 0 ? std::clamp(weighted_reward / weight_sum, 0.0, 1.0) : 0.0;
    composite.detail = absl::StrJoin(parts, ", ");
  }
  TruncateUtf8(&composite.detail, kMaxDetailBytes);
  composite.components = std::move(components);
  return composite;
}

absl::StatusOr<std::unique_ptr<Scorer>> Scorer::Create(
    std::shared_ptr<const VerifierRegistry> registry, ScorerOptions options) {
  if (registry == nullptr) return absl::InvalidArgumentError("registry must not be null");
  if (absl::Status valid = options.Validate(); !valid.ok()) return valid;
  auto state = std::make_shared<State>(options);
  {
    absl::MutexLock lock(&state->mu);
    for (int i = 0; i < options.num_workers; ++i) {
      if (!State::SpawnLocked(state)) break;
    }
    if (state->workers.empty()) return absl::InternalError("cannot start any verifier thread");
  }
  return std::unique_ptr<Scorer>(new Scorer(std::move(registry), std::move(state)));
}

Scorer::Scorer(std::shared_ptr<const VerifierRegistry> registry, std::shared_ptr<State> state)
    : registry_(std::move(registry)), state_(std::move(state)) {}

Scorer::~Scorer() {
  Shutdown();
  std::vector<std::shared_ptr<Worker>> idle;
  {
    absl::MutexLock lock(&state_->mu);
    for (std::shared_ptr<Worker>& worker : state_->workers) {
      if (worker->busy) {
        // Inside a verifier: it exits by itself once the call returns.
        worker->abandoned = true;
        worker->thread.detach();
        ++state_->abandoned;
      } else {
        idle.push_back(std::move(worker));
      }
    }
    state_->workers.clear();
  }
  for (const std::shared_ptr<Worker>& worker : idle) worker->thread.join();
}

void Scorer::Shutdown() {
  absl::MutexLock lock(&state_->mu);
  if (state_->stopping) return;
  state_->stopping = true;
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<Job>& job : state_->queue) State::ExpireLocked(state_, *job, now);
  state_->queue.clear();
}

Scorer::Stats Scorer::GetStats() const {
  absl::MutexLock lock(&state_->mu);
  Stats stats;
  stats.workers = static_cast<int>(state_->workers.size());
  for (const auto& worker : state_->workers) stats.busy_workers += worker->busy ? 1 : 0;
  stats.abandoned_workers = state_->abandoned;
  stats.queued_jobs = state_->queue.size();
  return stats;
}

bool Scorer::AwaitNoAbandonedWorkers(absl::Duration timeout) const {
  absl::MutexLock lock(&state_->mu);
  const auto none = [this]() {
    state_->mu.AssertReaderHeld();
    return state_->abandoned == 0;
  };
  return state_->mu.AwaitWithTimeout(absl::Condition(&none), timeout);
}

absl::StatusOr<BatchScores> Scorer::ScoreBatch(std::vector<ScoreItem> items,
                                               const std::vector<WeightedVerifier>& composition) {
  const absl::Time start = absl::Now();
  if (absl::Status valid = ValidateComposition(composition); !valid.ok()) return valid;

  // Plan: each item either has its outcome already (bad input) or becomes
  // one job per verifier; unknown components are decided here too.
  struct Component {
    std::shared_ptr<Job> job;  // Null when `decided` holds the outcome.
    std::optional<VerifyOutcome> decided;
    double weight = 0;
  };
  struct Plan {
    bool composite = false;
    std::optional<VerifyOutcome> decided;
    std::vector<Component> components;
  };
  auto progress = std::make_shared<BatchProgress>();
  std::vector<Plan> plans(items.size());
  std::vector<std::shared_ptr<Job>> jobs;
  BatchScores scores;
  scores.items.resize(items.size());

  for (size_t i = 0; i < items.size(); ++i) {
    ScoreItem& item = items[i];
    Plan& plan = plans[i];
    scores.items[i].item_id = std::move(item.item_id);
    if (item.timeout < absl::ZeroDuration()) {
      plan.decided = VerifyOutcome::Error(
          VerifierErrorKind::kInvalidInput,
          absl::StrCat("timeout must be >= 0, got ", absl::FormatDuration(item.timeout)));
      continue;
    }
    std::vector<WeightedVerifier> wanted;
    if (!item.verifier.empty()) {
      wanted.push_back({item.verifier, 1.0, {}});
    } else if (!composition.empty()) {
      plan.composite = true;
      wanted = composition;
    } else {
      plan.decided =
          VerifyOutcome::Error(VerifierErrorKind::kInvalidInput,
                               "the item names no verifier and the batch has no composition");
      continue;
    }

    std::vector<std::shared_ptr<const Verifier>> verifiers;
    absl::Duration default_timeout = absl::ZeroDuration();
    absl::Duration max_timeout = absl::ZeroDuration();
    for (const WeightedVerifier& want : wanted) {
      std::shared_ptr<const Verifier> verifier = registry_->Find(want.name);
      if (verifier != nullptr) {
        default_timeout = std::max(default_timeout, verifier->default_timeout());
        max_timeout = std::max(max_timeout, verifier->max_timeout());
      }
      verifiers.push_back(std::move(verifier));
    }
    const absl::Duration timeout = item.timeout == absl::ZeroDuration()
                                       ? default_timeout
                                       : std::min(item.timeout, max_timeout);
    item.request.deadline = start + timeout;
    auto request = std::make_shared<const VerifyRequest>(std::move(item.request));

    for (size_t c = 0; c < wanted.size(); ++c) {
      Component component;
      component.weight = wanted[c].weight > 0 ? wanted[c].weight : 1.0;
      std::shared_ptr<const VerifyRequest> component_request = request;
      if (!wanted[c].params.empty()) {
        // This component's run parameters fill the metadata keys the item
        // left unset; the other components keep sharing the item's request.
        auto with_params = std::make_shared<VerifyRequest>(*request);
        for (const auto& [key, value] : wanted[c].params) with_params->metadata.emplace(key, value);
        component_request = std::move(with_params);
      }
      if (verifiers[c] == nullptr) {
        component.decided = UnknownVerifierOutcome(wanted[c].name);
      } else if (std::optional<VerifyOutcome> invalid =
                     CheckRequiredFields(*verifiers[c], *component_request)) {
        component.decided = std::move(invalid);
      } else {
        component.job = std::make_shared<Job>();
        component.job->verifier = verifiers[c];
        component.job->request = std::move(component_request);
        component.job->batch = progress;
        jobs.push_back(component.job);
      }
      plan.components.push_back(std::move(component));
    }
  }

  {
    absl::MutexLock lock(&state_->mu);
    if (state_->stopping) return absl::UnavailableError("the reward server is shutting down");
    progress->remaining = jobs.size();
    for (const std::shared_ptr<Job>& job : jobs) state_->queue.push_back(job);

    const auto done_or_stopping = [this, &progress]() {
      state_->mu.AssertReaderHeld();
      return progress->remaining == 0 || state_->stopping;
    };
    while (progress->remaining > 0) {
      absl::Time next_deadline = absl::InfiniteFuture();
      for (const std::shared_ptr<Job>& job : jobs) {
        if (job->phase != Job::Phase::kDone) {
          next_deadline = std::min(next_deadline, job->request->deadline);
        }
      }
      state_->mu.AwaitWithDeadline(absl::Condition(&done_or_stopping), next_deadline);
      const absl::Time now = absl::Now();
      for (const std::shared_ptr<Job>& job : jobs) {
        if (job->phase != Job::Phase::kDone &&
            (state_->stopping || now >= job->request->deadline)) {
          State::ExpireLocked(state_, *job, now);
        }
      }
    }
    // Outcomes are final once kDone; move them out while holding the lock
    // that published them.
    for (Plan& plan : plans) {
      for (Component& component : plan.components) {
        if (component.job != nullptr) component.decided = std::move(component.job->outcome);
      }
    }
  }

  for (size_t i = 0; i < plans.size(); ++i) {
    Plan& plan = plans[i];
    VerifyOutcome& outcome = scores.items[i].outcome;
    if (plan.decided.has_value()) {
      outcome = *std::move(plan.decided);
    } else if (!plan.composite) {
      outcome = *std::move(plan.components.front().decided);
    } else {
      std::vector<VerifyOutcome> components;
      components.reserve(plan.components.size());
      for (Component& component : plan.components) {
        VerifyOutcome part = *std::move(component.decided);
        part.weight = component.weight;
        components.push_back(std::move(part));
      }
      outcome = ComposeOutcomes(std::move(components));
    }
  }
  scores.duration = absl::Now() - start;
  return scores;
}

}  // namespace sluice::reward_server
