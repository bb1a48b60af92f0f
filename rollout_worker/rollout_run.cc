#include "rollout_worker/rollout_run.h"

#include "common/run/run_placement.h"
#include "common/run/run_weight_sync.h"
#include "rollout_worker/rollout_run_impl.h"

namespace sluice::rollout_worker {
namespace {

using google::protobuf::util::TimeUtil;

}  // namespace

absl::Status RolloutRun::Impl::Run() {
  RETURN_IF_ERROR(Init());
  // Where the model runs (model.device / model.dtype); a device this binary
  // cannot use fails the run here, before any weights are fetched.
  {
    absl::StatusOr<model::ModelPlacement> placement =
        run::RunModelPlacement(spec_.model(), /*training=*/false);
    if (!placement.ok()) {
      return absl::Status(placement.status().code(),
                          absl::StrCat("model.device: ", placement.status().message()));
    }
    placement_ = *placement;
  }
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

void RolloutRun::Impl::Stop(bool abort) {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (abort) aborting_ = true;
  }
  if (deps_.retry_cancellation != nullptr) deps_.retry_cancellation->Cancel();
}

v1::RolloutRunStatus RolloutRun::Impl::Status() const {
  absl::MutexLock lock(&mu_);
  v1::RolloutRunStatus status = status_;
  status.set_draining(stopping_);
  status.set_policy_version(latest_.model ? latest_.version : -1);
  return status;
}

bool RolloutRun::Impl::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool RolloutRun::Impl::aborting() const {
  absl::MutexLock lock(&mu_);
  return aborting_;
}

void RolloutRun::Impl::Pause(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
}

absl::Status RolloutRun::Impl::Init() {
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
    // The controller shows it in the run's status while the retries go on
    // (they may last the whole retry deadline), not only once they end.
    if (absl::Now() - last_insert_error_report_ >= kInsertErrorReportInterval) {
      last_insert_error_report_ = absl::Now();
      Report({}, {}, 0, why.ToString()).IgnoreError();
    }
  };
  ASSIGN_OR_RETURN(inserter_, clients::GroupInserter::Create(*deps_.buffer, std::move(options)));
  if (deps_.trainer != nullptr) {
    // How versions reach this worker: the spec's resolved weight_sync.
    const run::WeightSync sync = run::ResolveWeightSync(spec_);
    weights::WeightReceiverDeps receiver;
    receiver.trainer = deps_.trainer;
    receiver.relay_fetcher = deps_.weight_fetcher;
    receiver.on_delta_fallback = deps_.on_weight_delta_fallback;
    ASSIGN_OR_RETURN(weight_receiver_,
                     weights::NewWeightReceiver(sync.transport, sync.delta, std::move(receiver)));
  }
  return absl::OkStatus();
}

absl::Status RolloutRun::Impl::Loop() {
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

void RolloutRun::Impl::AddIdleSeconds(absl::Time since) {
  if (!decoded_) return;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - since);
  absl::MutexLock lock(&mu_);
  status_.set_idle_seconds(status_.idle_seconds() + seconds);
}

int32_t RolloutRun::Impl::LoopGroups() const {
  return static_cast<int32_t>(in_flight_.size() + ready_.size() + deferred_.size());
}

void RolloutRun::Impl::SetGroupsInFlight(int32_t loop_groups) {
  loop_groups_.store(loop_groups);
  int64_t finishing = 0;
  {
    absl::MutexLock lock(&finish_mu_);
    finishing = groups_finishing_;
  }
  absl::MutexLock lock(&mu_);
  status_.set_groups_in_flight(static_cast<int32_t>(loop_groups + finishing));
}

void RolloutRun::Impl::Release(const std::vector<std::string>& leases, const std::string& reason) {
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

absl::Status RolloutRun::Impl::TopUp(int groups, int group_size, bool busy) {
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

absl::Status RolloutRun::Impl::AddToEngine(std::vector<InFlightGroup> groups_in, int group_size) {
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

int RolloutRun::Impl::MaxGroups() const {
  return spec_.rollout().max_concurrent_groups_per_worker() > 0
             ? spec_.rollout().max_concurrent_groups_per_worker()
             : spec_.algorithm().batch_size_groups();
}

int64_t RolloutRun::Impl::ContextTokens() const {
  return generation_budget_.context_tokens > 0 ? generation_budget_.context_tokens
                                               : config_.max_position_embeddings;
}

absl::Status RolloutRun::Impl::MakeEngine(int64_t longest, int group_size) {
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

model::SamplingOptions RolloutRun::Impl::RunSampling() const {
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

uint64_t RolloutRun::Impl::BatchSeed() const {
  const auto& sampling_spec = spec_.rollout().sampling();
  return sampling_spec.has_seed()
             ? sampling_spec.seed() + batch_counter_
             : absl::HashOf(spec_.seed(), deps_.worker_id, deps_.incarnation, batch_counter_);
}

int64_t RolloutRun::Impl::NewestRefused() const {
  absl::MutexLock lock(&mu_);
  return newest_refused_version_;
}

void RolloutRun::Impl::RecordStep(int64_t tokens, double seconds) {
  if (tokens > 0 && deps_.on_batch_generated) deps_.on_batch_generated(tokens, seconds);
  absl::MutexLock lock(&mu_);
  status_.set_decode_seconds(status_.decode_seconds() + seconds);
  if (tokens > 0) status_.set_tokens_generated(status_.tokens_generated() + tokens);
}

std::vector<const RolloutRun::Impl::InFlightGroup*> RolloutRun::Impl::Pointers(
    const std::vector<InFlightGroup>& groups, size_t from) {
  std::vector<const InFlightGroup*> pointers;
  for (size_t i = from; i < groups.size(); ++i) pointers.push_back(&groups[i]);
  return pointers;
}

void RolloutRun::Impl::GiveBack(const std::vector<const InFlightGroup*>& groups,
                                const std::string& reason) {
  if (groups.empty()) return;
  std::vector<std::string> leases, prompts;
  for (const InFlightGroup* group : groups) {
    leases.push_back(group->slot_lease);
    prompts.push_back(group->prompt.prompt_id());
  }
  Release(leases, reason);
  Report({}, prompts, 0).IgnoreError();  // the leases expire otherwise
}

void RolloutRun::Impl::AbandonAll(const std::string& reason) {
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


RolloutRun::RolloutRun(std::string run_id, v1::RunSpec spec, RolloutRunDeps deps)
    : impl_(std::make_unique<Impl>(std::move(run_id), std::move(spec), std::move(deps))) {}
RolloutRun::~RolloutRun() = default;
absl::Status RolloutRun::Run() { return impl_->Run(); }
void RolloutRun::Stop(bool abort) { impl_->Stop(abort); }
v1::RolloutRunStatus RolloutRun::Status() const { return impl_->Status(); }

}  // namespace sluice::rollout_worker
