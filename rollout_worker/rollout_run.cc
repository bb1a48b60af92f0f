#include "rollout_worker/rollout_run.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/model/engine.h"
#include "common/model/generation.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/status_macros.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "google/protobuf/util/time_util.h"
#include "rollout_worker/generation_budget.h"
#include "services/clients/group_inserter.h"
#include "services/clients/score_batches.h"

namespace sluice::rollout_worker {
namespace {

using google::protobuf::util::TimeUtil;

constexpr int64_t kAcquireWaitMs = 1000;
// Flushed batches waiting for the finisher at most; past this the loop waits
// for it (scoring or inserting has fallen behind generation).
constexpr size_t kMaxQueuedFlushes = 2;

// Sample i of a group whose samples start at `seed` draws from this stream.
uint64_t SampleSeed(uint64_t seed, int64_t i) {
  return seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(i + 1);
}

v1::FinishReason ToFinishReason(model::Finish finish) {
  switch (finish) {
    case model::Finish::kStop:
      return v1::FINISH_REASON_STOP;
    case model::Finish::kLength:
      return v1::FINISH_REASON_LENGTH;
    case model::Finish::kAborted:
    case model::Finish::kPartial:  // the worker does not cut by budget
      return v1::FINISH_REASON_ABORTED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

class RolloutRun::Impl {
 public:
  Impl(std::string run_id, v1::RunSpec spec, RolloutRunDeps deps)
      : run_id_(std::move(run_id)), spec_(std::move(spec)), deps_(std::move(deps)) {
    status_.set_run_id(run_id_);
    status_.set_policy_version(-1);
  }

  ~Impl() {
    Stop(/*abort=*/true);
    StopFinisher();
    if (follower_.joinable()) follower_.join();
  }

  absl::Status Run() {
    RETURN_IF_ERROR(Init());
    // The model's config and tokenizer; its weights come from the trainer.
    ASSIGN_OR_RETURN(config_, run::LoadRunModelConfig(spec_.model()));
    ASSIGN_OR_RETURN(tokenizer_, run::LoadRunTokenizer(spec_.model()));
    stop_token_ids_ = run::StopTokenIds(config_, *tokenizer_);
    generation_budget_.config = config_;
    generation_budget_.context_tokens = run::ContextTokens(spec_, config_);
    generation_budget_.budget_bytes = deps_.memory_budget_bytes;
    sampling_ = RunSampling();
    follower_ = std::thread([this] { FollowWeights(); });
    finisher_ = std::thread([this] { Finisher(); });
    absl::Status status = Loop();
    Stop(/*abort=*/false);
    StopFinisher();
    if (follower_.joinable()) follower_.join();
    const v1::RolloutRunStatus done = Status();
    log::Info("rollouts over: where the generation loop's time went",
              {{"run_id", run_id_},
               {"decode_seconds", done.decode_seconds()},
               {"idle_seconds", done.idle_seconds()},
               {"finish_seconds", done.finish_seconds()},
               {"groups_inserted", done.groups_inserted()},
               {"tokens_generated", done.tokens_generated()}});
    if (!status.ok()) {
      log::Error("rollouts failed", {{"run_id", run_id_}, {"error", std::string(status.message())}});
    }
    return status;
  }

  void Stop(bool abort) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (abort) aborting_ = true;
    }
    if (deps_.retry_cancellation != nullptr) deps_.retry_cancellation->Cancel();
  }

  v1::RolloutRunStatus Status() const {
    absl::MutexLock lock(&mu_);
    v1::RolloutRunStatus status = status_;
    status.set_draining(stopping_);
    status.set_policy_version(latest_.model ? latest_.version : -1);
    return status;
  }

 private:
  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }
  bool aborting() const {
    absl::MutexLock lock(&mu_);
    return aborting_;
  }
  // Sleeps up to `d`, waking early when the run stops.
  void Pause(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  }

  // Builds what Run needs beyond the constructor.
  absl::Status Init() {
    if (deps_.buffer == nullptr) return absl::InvalidArgumentError("no replay buffer client");
    clients::GroupInserterOptions options;
    // The groups are generated and scored: waiting is cheaper than making
    // them again. So the deadline, not an attempt count, ends the retries:
    // the clients' retry deadline, long enough to ride out a buffer restart
    // and the buffer's rate limiter (which holds an insert up to 30 s, then
    // answers RETRYABLE_ERROR). A stopping run gives up at its next backoff.
    // (The buffer client does not retry InsertGroups itself: see
    // retrying_clients.h.)
    options.deadline = std::max(deps_.retry_deadline, absl::Milliseconds(1));
    options.max_attempts = 1000;
    options.initial_backoff = absl::Milliseconds(200);
    options.max_backoff = absl::Seconds(5);
    options.seed = absl::HashOf(deps_.worker_id, deps_.incarnation);
    options.sleep = [this](absl::Duration d) {
      Pause(d);
      return !stopping();
    };
    options.on_retry = [this](const absl::Status& why, int attempts, absl::Duration backoff) {
      log::Warning("insert failed; retrying", {{"run_id", run_id_},
                                               {"attempts", attempts},
                                               {"backoff", absl::FormatDuration(backoff)},
                                               {"error", std::string(why.message())}});
    };
    ASSIGN_OR_RETURN(inserter_, clients::GroupInserter::Create(*deps_.buffer, std::move(options)));
    return absl::OkStatus();
  }

  // ---- weights -----------------------------------------------------------

  void FollowWeights() {
    int64_t have = -1;
    while (!stopping()) {
      auto announced = deps_.trainer->WaitForVersionAfter(run_id_, have, absl::Milliseconds(500));
      if (!announced.ok()) {
        if (!absl::IsDeadlineExceeded(announced.status())) Pause(absl::Milliseconds(200));
        continue;
      }
      const absl::Time start = absl::Now();
      // Ask for the latest, not the announced one: a slow worker skips
      // versions rather than falling further behind.
      auto fetched = Download();
      if (!fetched.ok()) {
        log::Warning("weight download failed", {{"run_id", run_id_},
                                                {"error", std::string(fetched.status().message())}});
        Pause(absl::Milliseconds(200));
        continue;
      }
      const int64_t version = fetched->manifest.version().version();
      auto model = BuildModel(*fetched);
      if (!model.ok()) {
        // Sampling from it would fail (or train on garbage): keep the
        // version we have, and wait for the next one rather than fetching
        // this one again.
        log::Error("refused a weight version; generating on with the one held",
                   {{"run_id", run_id_},
                    {"version", version},
                    {"held_version", Latest().model ? Latest().version : -1},
                    {"error", std::string(model.status().message())}});
        {
          absl::MutexLock lock(&mu_);
          newest_refused_version_ = std::max(newest_refused_version_, version);
          status_.set_weight_versions_refused(status_.weight_versions_refused() + 1);
        }
        if (deps_.on_weights_refused) deps_.on_weights_refused(version);
        have = std::max(have, version);
        continue;
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      {
        absl::MutexLock lock(&mu_);
        latest_ = model::PolicySnapshot{std::move(*model), version};
        status_.set_weight_syncs(status_.weight_syncs() + 1);
        status_.set_last_weight_sync_ms(static_cast<int64_t>(seconds * 1000));
      }
      have = version;
      if (deps_.on_weights_loaded) deps_.on_weights_loaded(version, seconds);
    }
  }

  // The latest version: through the relay tree when the worker has a
  // fetcher and the trainer places workers, else straight from the trainer.
  absl::StatusOr<clients::FetchedWeights> Download() {
    if (deps_.weight_fetcher != nullptr && !relay_unsupported_) {
      auto relayed = deps_.weight_fetcher->FetchLatest(run_id_);
      if (relayed.ok()) {
        if (relayed->depth > 1 || relayed->attempts > 1) {
          log::Debug("weights relayed", {{"run_id", run_id_},
                                         {"version", relayed->version},
                                         {"depth", relayed->depth},
                                         {"source", relayed->source},
                                         {"attempts", relayed->attempts}});
        }
        return std::move(relayed->weights);
      }
      if (!absl::IsUnimplemented(relayed.status())) return relayed.status();
      log::Info("the trainer does not place weight downloads; fetching from it directly",
                {{"run_id", run_id_}});
      relay_unsupported_ = true;
    }
    return deps_.trainer->FetchWeights(run_id_, /*version=*/-1);
  }

  absl::StatusOr<std::shared_ptr<const model::Transformer>> BuildModel(
      const clients::FetchedWeights& fetched) {
    torch::NoGradGuard no_grad;
    std::vector<model::NamedTensor> tensors;
    for (int i = 0; i < fetched.manifest.tensors_size(); ++i) {
      const v1::TensorSpec& spec = fetched.manifest.tensors(i);
      if (spec.dtype() != v1::DTYPE_FLOAT32) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", spec.name(), ": dtype ", v1::DType_Name(spec.dtype()),
                         " is not supported (float32 only in this release)"));
      }
      // Views over the received bytes: LoadWeights copies them once, into
      // the parameters (fetched outlives this function's use of them).
      ASSIGN_OR_RETURN(torch::Tensor t,
                       model::Float32TensorView(
                           std::vector<int64_t>(spec.shape().begin(), spec.shape().end()),
                           fetched.tensor_bytes[i]));
      if (!torch::isfinite(t).all().item<bool>()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", spec.name(), " holds ", (~torch::isfinite(t)).sum().item<int64_t>(),
            " non-finite values (NaN or infinity)"));
      }
      tensors.push_back({spec.name(), std::move(t)});
    }
    ASSIGN_OR_RETURN(std::unique_ptr<model::Transformer> model,
                     model::Transformer::CreateUninitialized(config_));
    RETURN_IF_ERROR(model->LoadWeights(tensors));
    return std::shared_ptr<const model::Transformer>(std::move(model));
  }

  // The trainer answered GetWeightSource with UNIMPLEMENTED (follower thread only).
  bool relay_unsupported_ = false;

  model::PolicySnapshot Latest() const {
    absl::MutexLock lock(&mu_);
    return latest_;
  }

  // Blocks until the worker holds weights of at least `version`, or holds
  // some weights and refused `version` or a newer one (nothing better is
  // coming until the trainer publishes again); false if the run stops first.
  bool AwaitVersion(int64_t version) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (latest_.model != nullptr && (latest_.version >= version ||
                                                        newest_refused_version_ >= version));
    };
    mu_.Await(absl::Condition(&ready));
    return !stopping_;
  }

  // ---- generation loop ---------------------------------------------------

  // A leased prompt's group on its way through the engine.
  struct InFlightGroup {
    v1::Prompt prompt;
    std::string slot_lease;
    std::vector<int32_t> ids;
    uint64_t batch = 0;  // the lease it came in (names the group)
    int index = 0;       // its prompt's place in that lease
    uint64_t seed = 0;   // sample g draws from SampleSeed(seed, g)
    google::protobuf::Timestamp started_at;
    absl::Time start;
    int64_t initial_version = 0;
    std::vector<model::Completion> completions;
    int finished = 0;
  };

  // The generation loop: keeps the engine's rows busy with the groups of
  // the prompts it leases, within the staleness gate (a slot per group),
  // and hands the groups that are done to the finisher (score, insert,
  // report, on its own thread) in batches, decoding on meanwhile. Holds up
  // to max_groups groups (those without rows wait in the engine's queue) and
  // leases more once a quarter of them are done. A stop, or the controller
  // saying the run is done, lets the engine finish what it holds and the
  // finisher what it was handed; an abort cuts both short and abandons what
  // they hold.
  absl::Status Loop() {
    const int group_size = spec_.algorithm().group_size();
    const int max_groups = MaxGroups();
    // Groups handed to the finisher at once: half a training batch, or
    // fewer when they have waited (the trainer wants them fresh).
    const size_t flush_groups = static_cast<size_t>(
        std::max(1, std::min(max_groups, spec_.algorithm().batch_size_groups()) / 2));
    const absl::Duration flush_after = absl::Milliseconds(100);
    absl::Time ready_since = absl::InfinitePast();
    const auto cleanup = absl::MakeCleanup([this] { SetGroupsInFlight(0); });
    const auto failed = [this](const absl::Status& error, const std::string& reason) {
      AbandonAll(reason);
      return error;
    };
    while (true) {
      if (aborting()) {
        AbandonAll("aborted");
        return absl::OkStatus();
      }
      if (absl::Status finishing = FinisherError(); !finishing.ok()) {
        return failed(finishing, "run failing");
      }
      // Time not spent decoding is idle: leasing, waiting for slots, weights
      // or the finisher.
      const absl::Time idle_start = absl::Now();
      auto count_idle = absl::MakeCleanup([&] { AddIdleSeconds(idle_start); });
      if (!deferred_.empty() && engine_ != nullptr && engine_->idle()) {
        std::vector<InFlightGroup> deferred = std::move(deferred_);
        deferred_.clear();
        if (absl::Status added = AddToEngine(std::move(deferred), group_size); !added.ok()) {
          return failed(added, "generation failed");
        }
      }
      const bool busy = engine_ != nullptr && !engine_->idle();
      if (!stopping() && !run_done_ && deferred_.empty()) {
        // Up to max_groups held (rollout.max_concurrent_groups_per_worker);
        // those the engine has no rows for yet wait in its queue.
        const int64_t free_groups = max_groups - static_cast<int64_t>(in_flight_.size());
        if (!busy || free_groups >= std::max(1, max_groups / 4)) {
          absl::Status topped = TopUp(static_cast<int>(std::max<int64_t>(free_groups, 0)),
                                      group_size, busy);
          if (!topped.ok()) return failed(topped, "generation failed");
          SetGroupsInFlight(LoopGroups());
        }
      }
      if (engine_ == nullptr || engine_->idle()) {
        if (!ready_.empty()) HandOver();
        // Stopping, or the controller needs no more: what was in flight is
        // finished and handed over (as a batch in progress always was), and
        // the finisher has inserted it.
        if (stopping() || run_done_) {
          if (absl::Status finished = AwaitFinisher(); !finished.ok()) {
            return failed(finished, "run failing");
          }
          return absl::OkStatus();
        }
        continue;  // TopUp waited for slots (not busy)
      }
      std::move(count_idle).Invoke();
      const absl::Time step_start = absl::Now();
      absl::StatusOr<std::vector<model::FinishedSample>> finished = engine_->Step(Latest());
      if (!finished.ok()) {
        // E.g. a policy whose logits went non-finite.
        return failed(clients::PrefixMessage(finished.status(), "generating"), "generating");
      }
      // Tokens sampled this step (decoded rows, and the first token of each
      // sample that joined, from its prompt's prefill).
      const int64_t tokens = engine_->stats().sampled_tokens - sampled_tokens_seen_;
      sampled_tokens_seen_ = engine_->stats().sampled_tokens;
      decoded_ = true;
      for (model::FinishedSample& sample : *finished) {
        auto it = in_flight_.find(sample.group);
        if (it == in_flight_.end()) continue;
        InFlightGroup& group = it->second;
        group.completions[static_cast<size_t>(sample.sample)] = std::move(sample.completion);
        if (++group.finished == group_size) {
          if (ready_.empty()) ready_since = absl::Now();
          ready_.push_back(std::move(group));
          in_flight_.erase(it);
        }
      }
      RecordStep(tokens, absl::ToDoubleSeconds(absl::Now() - step_start));
      if (!ready_.empty() && (ready_.size() >= flush_groups || engine_->idle() ||
                              absl::Now() - ready_since >= flush_after)) {
        HandOver();
      }
    }
  }

  // Idle time counts from the loop's first decoding step: before it the
  // run is in its warm start, or waits for its first weights.
  void AddIdleSeconds(absl::Time since) {
    if (!decoded_) return;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - since);
    absl::MutexLock lock(&mu_);
    status_.set_idle_seconds(status_.idle_seconds() + seconds);
  }

  // Groups the loop holds: in the engine, done, or waiting for room.
  int32_t LoopGroups() const {
    return static_cast<int32_t>(in_flight_.size() + ready_.size() + deferred_.size());
  }

  // ---- the finisher ------------------------------------------------------
  //
  // Scoring (a reward server round trip), inserting (the buffer's, durable)
  // and reporting (the controller's) take as long as many decoding steps of
  // a small model: done on the generation thread they leave the engine's
  // rows idle. So the loop hands each flushed batch over (HandOver) and
  // decodes on, and this thread finishes the batches in the order they were
  // handed over. At most kMaxQueuedFlushes wait: a finisher that falls
  // behind (a slow reward server) holds the loop back rather than letting
  // done groups pile up and go stale. Its first error ends the run: the
  // loop sees it (FinisherError) and gives back what it and the queue hold;
  // FinishGroups gave back the batch that failed.

  // Hands ready_ (in lease order) to the finisher; waits while its queue is
  // full (idle time).
  void HandOver() {
    std::vector<InFlightGroup> groups = std::move(ready_);
    ready_.clear();
    // In lease order, whatever order their samples finished in.
    std::sort(groups.begin(), groups.end(), [](const InFlightGroup& a, const InFlightGroup& b) {
      return std::tie(a.batch, a.index) < std::tie(b.batch, b.index);
    });
    const absl::Time wait_start = absl::Now();
    {
      absl::MutexLock lock(&finish_mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(finish_mu_) {
        return finish_queue_.size() < kMaxQueuedFlushes || !finish_error_.ok();
      };
      finish_mu_.Await(absl::Condition(&room));
      groups_finishing_ += static_cast<int64_t>(groups.size());
      finish_queue_.push_back(std::move(groups));
    }
    AddIdleSeconds(wait_start);
    SetGroupsInFlight(LoopGroups());
  }

  // The finisher's thread: until StopFinisher, and then until its queue is
  // empty.
  void Finisher() {
    while (true) {
      std::vector<InFlightGroup> groups;
      {
        absl::MutexLock lock(&finish_mu_);
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(finish_mu_) {
          return !finish_queue_.empty() || finisher_exit_;
        };
        finish_mu_.Await(absl::Condition(&work));
        if (finish_queue_.empty()) return;
        groups = std::move(finish_queue_.front());
        finish_queue_.pop_front();
      }
      const absl::Time start = absl::Now();
      // After an error the run ends: what was queued behind it goes back.
      absl::Status status;
      if (FinisherError().ok()) {
        status = FinishGroups(groups);
      } else {
        GiveBack(Pointers(groups, 0), "run failing");
      }
      {
        const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
        absl::MutexLock lock(&mu_);
        status_.set_finish_seconds(status_.finish_seconds() + seconds);
      }
      {
        absl::MutexLock lock(&finish_mu_);
        groups_finishing_ -= static_cast<int64_t>(groups.size());
        if (!status.ok() && finish_error_.ok()) finish_error_ = status;
      }
      SetGroupsInFlight(loop_groups_.load());
    }
  }

  absl::Status FinisherError() const {
    absl::MutexLock lock(&finish_mu_);
    return finish_error_;
  }

  // Waits until the finisher has finished everything handed to it (idle
  // time), or failed; its error.
  absl::Status AwaitFinisher() {
    const absl::Time wait_start = absl::Now();
    absl::Status error;
    {
      absl::MutexLock lock(&finish_mu_);
      auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(finish_mu_) {
        // Batches are never empty: none queued or being finished.
        return groups_finishing_ == 0 || !finish_error_.ok();
      };
      finish_mu_.Await(absl::Condition(&done));
      error = finish_error_;
    }
    AddIdleSeconds(wait_start);
    return error;
  }

  // Tells the finisher to finish what it was handed and exit; joins it.
  void StopFinisher() {
    {
      absl::MutexLock lock(&finish_mu_);
      finisher_exit_ = true;
    }
    if (finisher_.joinable()) finisher_.join();
  }

  // Groups in flight: those the loop holds (`loop_groups`) and those handed
  // to the finisher and not yet inserted or given back.
  void SetGroupsInFlight(int32_t loop_groups) {
    loop_groups_.store(loop_groups);
    int64_t finishing = 0;
    {
      absl::MutexLock lock(&finish_mu_);
      finishing = groups_finishing_;
    }
    absl::MutexLock lock(&mu_);
    status_.set_groups_in_flight(static_cast<int32_t>(loop_groups + finishing));
  }

  void Release(const std::vector<std::string>& leases, const std::string& reason) {
    if (leases.empty()) return;
    v1::ReleaseGenerationSlotsRequest release;
    release.set_run_id(run_id_);
    release.set_worker_id(deps_.worker_id);
    release.set_worker_incarnation(deps_.incarnation);
    for (const auto& id : leases) release.add_lease_ids(id);
    release.set_reason(reason);
    auto released = deps_.buffer->ReleaseGenerationSlots(release);
    if (!released.ok()) {
      log::Warning("could not release slots (they expire on their own)",
                   {{"run_id", run_id_}, {"error", std::string(released.status().message())}});
    }
  }

  // Admission, weights and prompts for up to `groups` more groups, added to
  // the engine. `busy`: the engine has work, so nothing here may block (no
  // waiting for slots or weights: slots granted at a version the worker
  // does not hold yet go back, to be asked for again after a step). The
  // error ends the run (a service away for the whole retry deadline, a
  // group that cannot fit the memory budget).
  absl::Status TopUp(int groups, int group_size, bool busy) {
    if (groups < 1) return absl::OkStatus();
    // 1. Admission: slots under the staleness gate.
    v1::AcquireGenerationSlotsRequest acquire;
    acquire.set_run_id(run_id_);
    acquire.set_worker_id(deps_.worker_id);
    acquire.set_worker_incarnation(deps_.incarnation);
    acquire.set_num_groups(groups);
    acquire.set_wait_timeout_ms(busy ? 0 : kAcquireWaitMs);
    auto slots = deps_.buffer->AcquireGenerationSlots(acquire);
    if (!slots.ok()) {
      // The buffer away for the whole retry deadline: the run cannot go on.
      if (clients::IsRetriesExhausted(slots.status())) {
        return clients::PrefixMessage(slots.status(), "acquiring generation slots");
      }
      if (stopping()) return absl::OkStatus();
      // Busy, the engine steps on and this is tried again at its next step:
      // warn once a second at most rather than at every step.
      if (!busy || absl::Now() - last_acquire_warning_ >= absl::Seconds(1)) {
        last_acquire_warning_ = absl::Now();
        log::Warning("could not acquire generation slots",
                     {{"run_id", run_id_}, {"error", std::string(slots.status().message())}});
      }
      if (!busy) Pause(absl::Milliseconds(500));
      return absl::OkStatus();
    }
    if (slots->granted() == 0) return absl::OkStatus();
    std::vector<std::string> leases(slots->lease_ids().begin(), slots->lease_ids().end());
    // In flight from their slots until they are inserted or given back:
    // what the controller waits on before it starts another run here.
    SetGroupsInFlight(LoopGroups() + static_cast<int32_t>(leases.size()));
    // 2. Weights at least as new as the version the slots were granted at.
    if (busy) {
      const model::PolicySnapshot held = Latest();
      if (held.model == nullptr || (held.version < slots->policy_version() &&
                                    NewestRefused() < slots->policy_version())) {
        Release(leases, "weights not here yet");
        return absl::OkStatus();
      }
    } else if (!AwaitVersion(slots->policy_version())) {
      Release(leases, "worker stopping");
      return absl::OkStatus();
    }
    // 3. Prompts.
    v1::LeasePromptsRequest lease;
    lease.set_run_id(run_id_);
    lease.set_worker_id(deps_.worker_id);
    lease.set_worker_incarnation(deps_.incarnation);
    lease.set_max_prompts(static_cast<int32_t>(leases.size()));
    auto prompts = deps_.controller->LeasePrompts(lease);
    if (!prompts.ok()) {
      Release(leases, "controller unavailable");
      if (clients::IsRetriesExhausted(prompts.status())) {
        return clients::PrefixMessage(prompts.status(), "leasing prompts");
      }
      if (stopping()) return absl::OkStatus();
      if (busy && absl::Now() - last_lease_warning_ < absl::Seconds(1)) return absl::OkStatus();
      last_lease_warning_ = absl::Now();
      log::Warning("could not lease prompts",
                   {{"run_id", run_id_}, {"error", std::string(prompts.status().message())}});
      if (!busy) Pause(absl::Milliseconds(500));
      return absl::OkStatus();
    }
    if (prompts->run_done()) {
      Release(leases, "run done");
      log::Info("controller says the run is done", {{"run_id", run_id_}});
      run_done_ = true;
      return absl::OkStatus();
    }
    if (prompts->prompts_size() == 0) {
      Release(leases, "no prompts");
      if (!busy) Pause(absl::Milliseconds(std::max<int64_t>(50, prompts->retry_after_ms())));
      return absl::OkStatus();
    }
    if (prompts->prompts_size() < static_cast<int>(leases.size())) {
      Release(std::vector<std::string>(leases.begin() + prompts->prompts_size(), leases.end()),
              "fewer prompts than slots");
      leases.resize(prompts->prompts_size());
    }
    // 4. Into the engine.
    ++batch_counter_;
    const uint64_t seed = BatchSeed();
    std::vector<InFlightGroup> groups_in;
    for (int p = 0; p < prompts->prompts_size(); ++p) {
      InFlightGroup group;
      group.prompt = prompts->prompts(p);
      group.slot_lease = leases[static_cast<size_t>(p)];
      group.ids.assign(group.prompt.token_ids().begin(), group.prompt.token_ids().end());
      if (group.ids.empty()) group.ids = run::EncodePrompt(*tokenizer_, group.prompt.text());
      group.batch = batch_counter_;
      group.index = p;
      group.seed = seed + static_cast<uint64_t>(p) * static_cast<uint64_t>(group_size);
      group.started_at = TimeUtil::GetCurrentTime();
      group.start = absl::Now();
      group.initial_version = Latest().version;
      group.completions.resize(static_cast<size_t>(group_size));
      groups_in.push_back(std::move(group));
    }
    return AddToEngine(std::move(groups_in), group_size);
  }

  // Adds the groups to the engine, made (or remade, once idle) with rows
  // that fit the memory budget for prompts as long as theirs. Groups whose
  // prompts need more room than a busy engine was made for wait in
  // deferred_ until it is idle (Loop leases nothing meanwhile).
  absl::Status AddToEngine(std::vector<InFlightGroup> groups_in, int group_size) {
    int64_t longest = 0;
    for (const InFlightGroup& group : groups_in) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(group.ids.size()));
    }
    const int64_t needed = std::min(ContextTokens(), longest + sampling_.max_new_tokens);
    if (engine_ != nullptr && needed > engine_->options().capacity) {
      if (!engine_->idle()) {
        for (InFlightGroup& group : groups_in) deferred_.push_back(std::move(group));
        return absl::OkStatus();
      }
      engine_.reset();
    }
    if (engine_ == nullptr) {
      absl::Status made = MakeEngine(longest, group_size);
      if (!made.ok()) {
        GiveBack(Pointers(groups_in, 0), "generating");
        return clients::PrefixMessage(made, "generating");
      }
    }
    for (size_t i = 0; i < groups_in.size(); ++i) {
      InFlightGroup& group = groups_in[i];
      std::vector<model::SampleRequest> samples(static_cast<size_t>(group_size));
      for (int g = 0; g < group_size; ++g) samples[static_cast<size_t>(g)].seed = SampleSeed(group.seed, g);
      absl::StatusOr<int64_t> handle = engine_->AddGroup(group.ids, std::move(samples));
      if (!handle.ok()) {
        // A prompt the model cannot take (e.g. longer than its context):
        // the run cannot learn from it. This group and the rest go back
        // here, those already placed with the engine's (the caller's
        // AbandonAll).
        const absl::Status error = absl::Status(
            handle.status().code(),
            absl::StrCat("prompt ", group.prompt.prompt_id(), ": ", handle.status().message()));
        GiveBack(Pointers(groups_in, i), "generating");
        return clients::PrefixMessage(error, "generating");
      }
      in_flight_.emplace(*handle, std::move(group));
    }
    return absl::OkStatus();
  }

  // Groups a worker holds at most: rollout.max_concurrent_groups_per_worker,
  // else a training batch.
  int MaxGroups() const {
    return spec_.rollout().max_concurrent_groups_per_worker() > 0
               ? spec_.rollout().max_concurrent_groups_per_worker()
               : spec_.algorithm().batch_size_groups();
  }

  int64_t ContextTokens() const {
    return generation_budget_.context_tokens > 0 ? generation_budget_.context_tokens
                                                 : config_.max_position_embeddings;
  }

  // The engine, its rows as many as the memory budget holds for prompts of
  // `longest` tokens and the run's max_new_tokens (run::GenerationBatchBytes).
  absl::Status MakeEngine(int64_t longest, int group_size) {
    const int max_groups = MaxGroups();
    ASSIGN_OR_RETURN(std::vector<size_t> chunks,
                     PlanGenerationChunks(generation_budget_,
                                          std::vector<int64_t>(static_cast<size_t>(max_groups), longest),
                                          group_size, sampling_.max_new_tokens));
    if (chunks.size() > 1 && !logged_chunking_) {
      logged_chunking_ = true;
      log::Warning("the memory budget holds fewer groups than a worker may lease at once; the "
                   "engine decodes fewer rows (logged once per run)",
                   {{"run_id", run_id_},
                    {"groups", max_groups},
                    {"groups_at_once", static_cast<int64_t>(chunks.front())},
                    {"memory_budget_bytes", generation_budget_.budget_bytes}});
    }
    model::EngineOptions options;
    options.max_rows = static_cast<int64_t>(chunks.front()) * group_size;
    options.capacity = std::min<int64_t>(ContextTokens(), longest + sampling_.max_new_tokens);
    options.swap_mode = spec_.rollout().weight_swap_mode() == v1::WEIGHT_SWAP_MODE_RECOMPUTE
                            ? model::SwapMode::kRecompute
                            : model::SwapMode::kKeepCache;
    const auto& stops = spec_.rollout().sampling().stop_strings();
    options.stop_strings.assign(stops.begin(), stops.end());
    if (!options.stop_strings.empty()) {
      options.detokenize = [this](const std::vector<int32_t>& ids) {
        absl::StatusOr<std::string> text = tokenizer_->Decode(ids, /*skip_special=*/true);
        return text.ok() ? *text : std::string();
      };
    }
    ASSIGN_OR_RETURN(engine_, model::Engine::Create(config_, options, sampling_));
    sampled_tokens_seen_ = 0;
    return absl::OkStatus();
  }

  // The run's sampling options (the seed is per batch: BatchSeed).
  model::SamplingOptions RunSampling() const {
    const auto& sampling_spec = spec_.rollout().sampling();
    model::SamplingOptions sampling;
    sampling.temperature = sampling_spec.has_temperature() ? sampling_spec.temperature() : 1.0;
    sampling.top_p = sampling_spec.has_top_p() ? sampling_spec.top_p() : 1.0;
    sampling.top_k = sampling_spec.top_k();
    sampling.max_new_tokens = sampling_spec.max_new_tokens() > 0 ? sampling_spec.max_new_tokens()
                              : spec_.model().max_context_tokens() > 0
                                  ? spec_.model().max_context_tokens()
                                  : config_.max_position_embeddings;
    sampling.stop_token_ids.assign(sampling_spec.stop_token_ids().begin(),
                                   sampling_spec.stop_token_ids().end());
    if (sampling.stop_token_ids.empty()) {
      sampling.stop_token_ids.assign(stop_token_ids_.begin(), stop_token_ids_.end());
    }
    return sampling;
  }

  uint64_t BatchSeed() const {
    const auto& sampling_spec = spec_.rollout().sampling();
    return sampling_spec.has_seed()
               ? sampling_spec.seed() + batch_counter_
               : absl::HashOf(spec_.seed(), deps_.worker_id, deps_.incarnation, batch_counter_);
  }

  int64_t NewestRefused() const {
    absl::MutexLock lock(&mu_);
    return newest_refused_version_;
  }

  // A decoding step: its seconds, and the tokens it sampled.
  void RecordStep(int64_t tokens, double seconds) {
    if (tokens > 0 && deps_.on_batch_generated) deps_.on_batch_generated(tokens, seconds);
    absl::MutexLock lock(&mu_);
    status_.set_decode_seconds(status_.decode_seconds() + seconds);
    if (tokens > 0) status_.set_tokens_generated(status_.tokens_generated() + tokens);
  }

  static std::vector<const InFlightGroup*> Pointers(const std::vector<InFlightGroup>& groups,
                                                    size_t from) {
    std::vector<const InFlightGroup*> pointers;
    for (size_t i = from; i < groups.size(); ++i) pointers.push_back(&groups[i]);
    return pointers;
  }

  // Gives the groups' slots and prompts back: one release, one report.
  void GiveBack(const std::vector<const InFlightGroup*>& groups, const std::string& reason) {
    if (groups.empty()) return;
    std::vector<std::string> leases, prompts;
    for (const InFlightGroup* group : groups) {
      leases.push_back(group->slot_lease);
      prompts.push_back(group->prompt.prompt_id());
    }
    Release(leases, reason);
    Report({}, prompts, 0).IgnoreError();  // the leases expire otherwise
  }

  // Everything in flight, ready and deferred given back (stop with abort,
  // an error).
  void AbandonAll(const std::string& reason) {
    if (engine_ != nullptr) engine_->Drain(model::Finish::kAborted);
    std::deque<std::vector<InFlightGroup>> queued;
    {
      absl::MutexLock lock(&finish_mu_);
      queued.swap(finish_queue_);
      for (const auto& groups : queued) groups_finishing_ -= static_cast<int64_t>(groups.size());
    }
    std::vector<const InFlightGroup*> held = Pointers(ready_, 0);
    for (const InFlightGroup* group : Pointers(deferred_, 0)) held.push_back(group);
    for (const auto& [handle, group] : in_flight_) held.push_back(&group);
    for (const auto& groups : queued) {
      for (const InFlightGroup* group : Pointers(groups, 0)) held.push_back(group);
    }
    GiveBack(held, reason);
    in_flight_.clear();
    ready_.clear();
    deferred_.clear();
  }

  // Scores the groups' completions, inserts the groups and reports them.
  absl::Status FinishGroups(std::vector<InFlightGroup>& groups) {
    const int group_size = spec_.algorithm().group_size();
    const auto finished_at = TimeUtil::GetCurrentTime();
    int64_t swaps = 0;
    int64_t tokens = 0;
    for (const InFlightGroup& group : groups) {
      for (const model::Completion& c : group.completions) {
        swaps += c.weight_swaps;
        tokens += static_cast<int64_t>(c.tokens.size());
      }
    }
    if (swaps > 0 && deps_.on_mid_generation_swaps) deps_.on_mid_generation_swaps(swaps);
    tokens_since_report_ += tokens;

    const auto give_back = [&](const std::string& reason) { GiveBack(Pointers(groups, 0), reason); };
    // Score every completion on the reward server.
    std::vector<std::string> texts;
    for (const InFlightGroup& group : groups) {
      for (const model::Completion& c : group.completions) {
        // As vLLM and transformers give completions: without special tokens
        // (the stop token), so verifiers see only what the model wrote.
        absl::StatusOr<std::string> text = tokenizer_->Decode(c.tokens, /*skip_special=*/true);
        if (!text.ok()) {
          give_back("decoding failed");
          return text.status();
        }
        texts.push_back(*std::move(text));
      }
    }
    v1::ScoreBatchRequest score;
    for (const auto& v : spec_.reward().verifiers()) *score.add_composition() = v;
    for (size_t i = 0; i < texts.size(); ++i) {
      const InFlightGroup& group = groups[i / group_size];
      const v1::Prompt& prompt = group.prompt;
      v1::ScoreItem* item = score.add_items();
      item->set_item_id(absl::StrCat(i));
      item->set_verifier(prompt.verifier());
      item->set_response(texts[i]);
      item->set_reference_answer(prompt.reference_answer());
      item->set_reference_is_solution(prompt.reference_is_solution());
      item->set_prompt(prompt.text());
      item->set_timeout_ms(spec_.reward().item_timeout_ms());
      *item->mutable_metadata() = prompt.metadata();
      // For the "length" verifier: the completion's length in the run's own
      // tokens, which the reward server cannot count from the text.
      (*item->mutable_metadata())["completion_tokens"] =
          absl::StrCat(group.completions[i % group_size].tokens.size());
    }
    const absl::Time score_start = absl::Now();
    // In batches within the reward server's limit, each call retried by the
    // client (a reward server restarting is waited for, up to the retry
    // deadline); an abort is seen between batches.
    clients::ScoreBatchesOptions score_options;
    score_options.before_call = [this](int) { return !aborting(); };
    absl::StatusOr<v1::ScoreBatchResponse> scored =
        clients::ScoreInBatches(*deps_.reward, score, score_options);
    if (!scored.ok()) {
      give_back(absl::IsCancelled(scored.status()) ? "aborted" : "reward server unavailable");
      // Cut short by a stop (between batches, or the client's retries
      // cancelled): the run ends as asked, not with an error.
      if (absl::IsCancelled(scored.status()) && stopping()) return absl::OkStatus();
      return clients::PrefixMessage(scored.status(), "scoring rollouts");
    }
    const int64_t reward_ms = absl::ToInt64Milliseconds(absl::Now() - score_start);

    // Build and insert the groups.
    std::vector<std::string> abandoned;
    v1::InsertGroupsRequest insert;
    std::vector<std::string> completed;
    for (size_t p = 0; p < groups.size(); ++p) {
      const InFlightGroup& in = groups[p];
      const v1::Prompt& prompt = in.prompt;
      bool retryable_failure = false;
      v1::Group group;
      group.set_group_id(absl::StrCat(prompt.prompt_id(), "@", deps_.worker_id, ".",
                                      deps_.incarnation, ".", in.batch));
      group.set_prompt_id(prompt.prompt_id());
      group.set_run_id(run_id_);
      // From the prompt, not the generation: one group per prompt is stored,
      // whichever worker or incarnation finishes it first.
      group.set_idempotency_key(absl::StrCat(run_id_, "/", prompt.prompt_id()));
      group.set_slot_lease_id(in.slot_lease);
      int64_t min_version = INT64_MAX;
      int64_t max_version = -1;
      const double generation_seconds = absl::ToDoubleSeconds(absl::Now() - in.start);
      for (int g = 0; g < group_size; ++g) {
        const size_t i = p * group_size + g;
        const model::Completion& c = in.completions[static_cast<size_t>(g)];
        const v1::VerifierResult& verdict = scored->results(static_cast<int>(i)).result();
        if (verdict.retryable()) retryable_failure = true;
        v1::Trajectory* t = group.add_trajectories();
        t->set_trajectory_id(absl::StrCat(group.group_id(), "/", g));
        t->set_prompt_id(prompt.prompt_id());
        t->set_group_id(group.group_id());
        t->set_sample_index(g);
        for (int32_t id : in.ids) t->add_prompt_token_ids(id);
        for (int32_t id : c.tokens) t->add_completion_token_ids(id);
        for (float lp : c.logprobs) t->add_behaviour_logprobs(lp);
        for (int64_t v : c.versions) {
          t->add_token_policy_versions(v);
          min_version = std::min(min_version, v);
          max_version = std::max(max_version, v);
        }
        t->set_finish_reason(ToFinishReason(c.finish));
        t->set_reward(verdict.reward());
        *t->mutable_verifier() = verdict;
        t->set_completion_text(texts[i]);
        t->set_rollout_worker_id(deps_.worker_id);
        t->set_worker_incarnation(deps_.incarnation);
        v1::GenerationInfo* info = t->mutable_generation();
        auto* s = info->mutable_sampling();
        s->set_temperature(static_cast<float>(sampling_.temperature));
        s->set_top_p(static_cast<float>(sampling_.top_p));
        s->set_top_k(static_cast<int32_t>(sampling_.top_k));
        s->set_max_new_tokens(static_cast<int32_t>(sampling_.max_new_tokens));
        s->set_seed(SampleSeed(in.seed, g));
        *info->mutable_started_at() = in.started_at;
        *info->mutable_finished_at() = finished_at;
        info->set_generation_time_ms(static_cast<int64_t>(generation_seconds * 1000));
        info->set_weight_swaps(c.weight_swaps);
        info->set_reward_time_ms(reward_ms);
      }
      if (retryable_failure) {
        // The reward server could not score part of the group: training on
        // a made-up 0 would be wrong, so the prompt goes back to the pool.
        abandoned.push_back(prompt.prompt_id());
        Release({in.slot_lease}, "reward not available");
        continue;
      }
      group.set_min_policy_version(min_version == INT64_MAX ? in.initial_version : min_version);
      group.set_max_policy_version(max_version < 0 ? in.initial_version : max_version);
      *group.mutable_created_at() = TimeUtil::GetCurrentTime();
      *insert.add_groups() = std::move(group);
      completed.push_back(prompt.prompt_id());
    }
    int64_t inserted = 0;
    absl::Status fatal;
    if (insert.groups_size() > 0) {
      fatal = Insert(std::move(insert), &completed, &abandoned, &inserted);
    }
    if (deps_.on_groups_inserted && inserted > 0) deps_.on_groups_inserted(inserted);
    absl::Status reported = Report(completed, abandoned, inserted);
    return fatal.ok() ? reported : fatal;
  }

  // Inserts the groups (GroupInserter: retries, backoff, deadline) and sorts
  // their prompts by the buffer's answers (the table in rollout_run.h): a
  // group stored keeps its prompt in `completed`; a late DUPLICATE keeps it
  // there too (the prompt is in the buffer); a group refused for good (stale,
  // invalid, unknown run) or never confirmed moves its prompt to `abandoned`,
  // so the controller hands it out again. (An unconfirmed group may have been
  // stored with its ack lost; generating its prompt again costs a group the
  // buffer then refuses as a DUPLICATE, where keeping it completed would lose
  // the prompt for good if it was not stored.) The slots of unconfirmed
  // groups are released; the buffer already released those of answered ones.
  //
  // Returns the error that should end the run: a fatal InsertGroups error
  // (GroupInserter makes it sticky, so every later batch would fail too), or
  // the buffer unreachable for the whole retry deadline.
  absl::Status Insert(v1::InsertGroupsRequest request, std::vector<std::string>* completed,
                      std::vector<std::string>* abandoned, int64_t* stored) {
    std::vector<v1::Group> groups;
    groups.reserve(request.groups_size());
    for (v1::Group& group : *request.mutable_groups()) groups.push_back(std::move(group));
    std::vector<std::string> prompt_ids, slot_leases;
    for (const v1::Group& group : groups) {
      prompt_ids.push_back(group.prompt_id());
      slot_leases.push_back(group.slot_lease_id());
    }
    const auto dropped = [&](int64_t late) {
      absl::MutexLock lock(&mu_);
      status_.set_groups_dropped(status_.groups_dropped() + 1);
      status_.set_late_groups_refused(status_.late_groups_refused() + late);
    };
    const auto abandon = [&](size_t i) {
      completed->erase(std::remove(completed->begin(), completed->end(), prompt_ids[i]),
                       completed->end());
      abandoned->push_back(prompt_ids[i]);
    };

    absl::StatusOr<clients::InsertOutcome> outcome = inserter_->Insert(std::move(groups));
    if (!outcome.ok()) {
      // Nothing was sent: a fatal error of an earlier batch, or groups
      // without keys (a bug here).
      for (size_t i = 0; i < prompt_ids.size(); ++i) {
        abandon(i);
        dropped(0);
      }
      Release(slot_leases, "insert failed");
      return clients::PrefixMessage(outcome.status(), "inserting groups");
    }
    *stored = 0;
    int64_t late = 0;
    std::vector<std::string> unconfirmed_leases;
    for (size_t i = 0; i < outcome->groups.size(); ++i) {
      const clients::GroupInsertResult& result = outcome->groups[i];
      const bool duplicate = result.status == v1::INSERT_STATUS_DUPLICATE;
      if (result.status == v1::INSERT_STATUS_STORED || (duplicate && result.sends > 1)) {
        ++*stored;
        continue;
      }
      if (duplicate || result.status == v1::INSERT_STATUS_REJECTED_STALE) {
        ++late;
        dropped(1);
        log::Info("buffer refused a late group",
                  {{"run_id", run_id_},
                   {"group", result.group_id},
                   {"prompt_id", prompt_ids[i]},
                   {"status", v1::InsertStatus_Name(result.status)},
                   {"message", result.message}});
        // A DUPLICATE's prompt is in the buffer: it stays completed. A stale
        // one goes back to the pool.
        if (!duplicate) abandon(i);
        continue;
      }
      if (result.resolved()) {
        log::Warning("buffer refused a group", {{"run_id", run_id_},
                                                {"group", result.group_id},
                                                {"status", v1::InsertStatus_Name(result.status)},
                                                {"message", result.message}});
      } else {
        unconfirmed_leases.push_back(slot_leases[i]);
      }
      abandon(i);
      dropped(0);
    }
    if (!outcome->status.ok()) {
      log::Warning("groups not confirmed by the buffer; their prompts go back to the pool",
                   {{"run_id", run_id_},
                    {"groups", unconfirmed_leases.size()},
                    {"error", std::string(outcome->status.message())}});
      Release(unconfirmed_leases, "insert not confirmed");
    }
    {
      absl::MutexLock lock(&mu_);
      status_.set_groups_inserted(status_.groups_inserted() + *stored);
    }
    late_since_report_ += late;
    if (late > 0 && deps_.on_late_groups_refused) deps_.on_late_groups_refused(late);
    if (absl::Status fatal = inserter_->fatal_error(); !fatal.ok()) {
      return clients::PrefixMessage(fatal, "inserting groups");
    }
    if (clients::IsRetriesExhausted(outcome->status)) {
      return clients::PrefixMessage(outcome->status, "inserting groups");
    }
    return absl::OkStatus();
  }

  // Tells the controller which prompts are done and which go back to the
  // pool. A controller away is waited for by the client (it retries); one
  // away for the whole retry deadline ends the run (the error returned).
  // Other failures are logged: the prompt leases expire and are handed out
  // again, and a group of theirs already stored makes the next one a
  // DUPLICATE.
  absl::Status Report(const std::vector<std::string>& completed,
                      const std::vector<std::string>& abandoned, int64_t groups_inserted) {
    v1::ReportRolloutProgressRequest report;
    report.set_run_id(run_id_);
    report.set_worker_id(deps_.worker_id);
    report.set_worker_incarnation(deps_.incarnation);
    for (const auto& id : completed) report.add_completed_prompt_ids(id);
    for (const auto& id : abandoned) report.add_abandoned_prompt_ids(id);
    const int64_t tokens_reported = tokens_since_report_.load();
    const int64_t late_reported = late_since_report_.load();
    report.set_tokens_generated(tokens_reported);
    report.set_groups_inserted(groups_inserted);
    report.set_late_groups_refused(late_reported);
    report.set_policy_version(Latest().version);
    auto response = deps_.controller->ReportRolloutProgress(report);
    if (!response.ok()) {
      if (clients::IsRetriesExhausted(response.status())) {
        return clients::PrefixMessage(response.status(), "reporting progress");
      }
      log::Warning("could not report progress", {{"run_id", run_id_},
                                                 {"error", std::string(response.status().message())}});
      return absl::OkStatus();
    }
    tokens_since_report_ -= tokens_reported;
    late_since_report_ -= late_reported;
    if (response->run_done()) {
      log::Info("controller says the run is done", {{"run_id", run_id_}});
      Stop(/*abort=*/false);
    }
    return absl::OkStatus();
  }

  const std::string run_id_;
  const v1::RunSpec spec_;
  RolloutRunDeps deps_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  model::ModelConfig config_;
  std::vector<int32_t> stop_token_ids_;
  std::thread follower_;
  std::unique_ptr<clients::GroupInserter> inserter_;
  uint64_t batch_counter_ = 0;
  // The run's sampling options, set by Run once the config is loaded.
  model::SamplingOptions sampling_;
  // The generation loop's engine and its groups (Loop's thread only): in
  // the engine, keyed by its handle; done and waiting for FinishGroups.
  std::unique_ptr<model::Engine> engine_;
  std::map<int64_t, InFlightGroup> in_flight_;
  std::vector<InFlightGroup> ready_;
  // When TopUp last warned that slots or prompts could not be had.
  absl::Time last_acquire_warning_ = absl::InfinitePast();
  absl::Time last_lease_warning_ = absl::InfinitePast();
  // Leased for prompts longer than the busy engine has room for.
  std::vector<InFlightGroup> deferred_;
  int64_t sampled_tokens_seen_ = 0;
  // The loop has made its first decoding step (idle time counts from it).
  bool decoded_ = false;
  // LeasePrompts said the run is done: lease no more, finish what is held.
  bool run_done_ = false;
  // Tokens and late groups refused since the last report that reached the
  // controller (the finisher reports; a loop giving groups back, too).
  std::atomic<int64_t> tokens_since_report_{0};
  std::atomic<int64_t> late_since_report_{0};
  // The finisher (see HandOver): its thread, the batches handed to it in
  // order, and its first error.
  std::thread finisher_;
  mutable absl::Mutex finish_mu_;
  std::deque<std::vector<InFlightGroup>> finish_queue_ ABSL_GUARDED_BY(finish_mu_);
  bool finisher_exit_ ABSL_GUARDED_BY(finish_mu_) = false;
  absl::Status finish_error_ ABSL_GUARDED_BY(finish_mu_);
  // Groups queued for or in the finisher (0: it has finished all it was
  // handed), and those the loop last said it holds: together,
  // status_.groups_in_flight.
  int64_t groups_finishing_ ABSL_GUARDED_BY(finish_mu_) = 0;
  std::atomic<int32_t> loop_groups_{0};
  // What generation may use (deps_.memory_budget_bytes and the model's
  // shape), set by Run once the config is loaded.
  GenerationBudget generation_budget_;
  bool logged_chunking_ = false;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool aborting_ ABSL_GUARDED_BY(mu_) = false;
  model::PolicySnapshot latest_ ABSL_GUARDED_BY(mu_);
  // The newest version the follower refused (-1: none).
  int64_t newest_refused_version_ ABSL_GUARDED_BY(mu_) = -1;
  v1::RolloutRunStatus status_ ABSL_GUARDED_BY(mu_);
};

RolloutRun::RolloutRun(std::string run_id, v1::RunSpec spec, RolloutRunDeps deps)
    : impl_(std::make_unique<Impl>(std::move(run_id), std::move(spec), std::move(deps))) {}
RolloutRun::~RolloutRun() = default;
absl::Status RolloutRun::Run() { return impl_->Run(); }
void RolloutRun::Stop(bool abort) { impl_->Stop(abort); }
v1::RolloutRunStatus RolloutRun::Status() const { return impl_->Status(); }

}  // namespace sluice::rollout_worker
