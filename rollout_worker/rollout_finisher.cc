// RolloutRun::Impl's finisher: the thread that scores the groups the loop
// hands over, inserts them into the replay buffer and reports them done,
// beside the decoding loop (HandOver says how the two meet).
#include "rollout_worker/rollout_run_impl.h"

namespace sluice::rollout_worker {
namespace {

using google::protobuf::util::TimeUtil;

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

void RolloutRun::Impl::HandOver() {
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

void RolloutRun::Impl::Finisher() {
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

absl::Status RolloutRun::Impl::FinisherError() const {
  absl::MutexLock lock(&finish_mu_);
  return finish_error_;
}

absl::Status RolloutRun::Impl::AwaitFinisher() {
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

void RolloutRun::Impl::StopFinisher() {
  {
    absl::MutexLock lock(&finish_mu_);
    finisher_exit_ = true;
  }
  if (finisher_.joinable()) finisher_.join();
}

absl::Status RolloutRun::Impl::FinishGroups(std::vector<InFlightGroup>& groups) {
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
  std::string insert_error;
  if (insert.groups_size() > 0) {
    fatal = Insert(std::move(insert), &completed, &abandoned, &inserted, &insert_error);
  }
  if (deps_.on_groups_inserted && inserted > 0) deps_.on_groups_inserted(inserted);
  absl::Status reported = Report(completed, abandoned, inserted, insert_error);
  return fatal.ok() ? reported : fatal;
}

absl::Status RolloutRun::Impl::Insert(v1::InsertGroupsRequest request,
                                      std::vector<std::string>* completed,
                                      std::vector<std::string>* abandoned, int64_t* stored,
                                      std::string* insert_error) {
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
    *insert_error = outcome.status().ToString();
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
    // The controller shows it in the run's status (Run.conditions).
    *insert_error = outcome->status.ToString();
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

absl::Status RolloutRun::Impl::Report(const std::vector<std::string>& completed,
                                      const std::vector<std::string>& abandoned,
                                      int64_t groups_inserted, const std::string& insert_error) {
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
  report.set_insert_error(insert_error);
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

}  // namespace sluice::rollout_worker
