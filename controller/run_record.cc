#include "controller/run_record.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/run/run_weight_sync.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "controller/proto_json.h"
#include "controller/run_files.h"

namespace sluice::controller {
namespace {

namespace fs = std::filesystem;

constexpr int kStateFormat = 1;
constexpr size_t kFinalRewardSteps = 10;

bool IsTerminalState(v1::RunState state) {
  return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED ||
         state == v1::RUN_STATE_CANCELLED;
}

void PutTime(nlohmann::json& object, const char* key, absl::Time time) {
  if (time != absl::InfinitePast()) object[key] = absl::ToUnixNanos(time);
}

bool GetTime(const nlohmann::json& object, const char* key, absl::Time* time) {
  auto it = object.find(key);
  if (it == object.end()) {
    *time = absl::InfinitePast();
    return true;
  }
  if (!it->is_number_integer()) return false;
  *time = absl::FromUnixNanos(it->get<int64_t>());
  return true;
}

bool GetInt(const nlohmann::json& object, const char* key, int64_t* value) {
  auto it = object.find(key);
  if (it == object.end()) return true;  // Keep the default.
  if (!it->is_number_integer()) return false;
  *value = it->get<int64_t>();
  return true;
}

absl::Status ParseProto(const std::string& text, google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // Written by a newer controller.
  const auto status = google::protobuf::util::JsonStringToMessage(text, message, options);
  if (!status.ok()) return absl::DataLossError(std::string(status.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadText(const std::string& path) { return ReadFileToString(path); }

// The messages of a .jsonl file, skipping (and logging) lines that do not
// parse. Empty when the file does not exist.
template <typename Message>
std::vector<Message> ReadJsonLines(const std::string& path) {
  std::vector<Message> messages;
  absl::StatusOr<CompleteLines> lines = ReadCompleteLines(path);
  if (!lines.ok()) {
    if (!absl::IsNotFound(lines.status())) {
      log::Warning("cannot read a run file", {{"file", path},
                                              {"error", std::string(lines.status().message())}});
    }
    return messages;
  }
  for (size_t i = 0; i < lines->lines.size(); ++i) {
    if (lines->lines[i].empty()) continue;
    Message message;
    if (absl::Status parsed = ParseProto(lines->lines[i], &message); !parsed.ok()) {
      log::Warning("skipping an unreadable line of a run file",
                   {{"file", path},
                    {"line", static_cast<int64_t>(i + 1)},
                    {"error", std::string(parsed.message())}});
      continue;
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

// A run directory from before state.json: its summary.json, when terminal.
absl::StatusOr<RunRecord> LoadFromSummary(const RunFiles& files, const std::string& run_id) {
  absl::StatusOr<std::string> text = ReadText(files.Path(RunFiles::kSummary));
  if (!text.ok()) {
    return absl::DataLossError(
        absl::StrCat("no ", RunFiles::kState, " and no terminal ", RunFiles::kSummary,
                     ": the controller stopped before it recorded the run's state"));
  }
  RunRecord record;
  v1::RunSummary& summary = *record.run.mutable_summary();
  if (absl::Status parsed = ParseProto(*text, &summary); !parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat(RunFiles::kSummary, " is not a RunSummary: ", parsed.message()));
  }
  v1::RunState state = v1::RUN_STATE_UNSPECIFIED;
  if (!v1::RunState_Parse(summary.state(), &state) || !IsTerminalState(state)) {
    return absl::DataLossError(absl::StrCat("no ", RunFiles::kState, ", and ", RunFiles::kSummary,
                                            " says state \"", summary.state(),
                                            "\" rather than a terminal one"));
  }
  summary.clear_evals();  // Rebuilt from evals.jsonl like any record's.
  record.run.set_run_id(run_id);
  record.run.set_state(state);
  record.run.set_error_message(summary.error_message());
  record.last_step = summary.steps();
  record.max_policy_version = summary.weight_versions() - 1;
  return record;
}

// Progress and evaluations from the append-only files, which may be ahead of
// state.json.
void RebuildFromAppendedFiles(const RunFiles& files, RunRecord* record) {
  v1::Run& run = record->run;
  const std::vector<v1::TrainingStepMetrics> steps =
      ReadJsonLines<v1::TrainingStepMetrics>(files.Path(RunFiles::kMetrics));
  const int64_t last_logged = steps.empty() ? 0 : steps.back().step();
  if (!steps.empty() && last_logged >= record->last_step) {
    v1::RunProgress& progress = *run.mutable_progress();
    v1::RunSummary& summary = *run.mutable_summary();
    summary.clear_steps();
    summary.clear_groups_trained();
    summary.clear_tokens_trained();
    summary.clear_max_observed_staleness();
    // Deprecated, the same figure (RunSummary.max_staleness).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    summary.clear_max_staleness();
#pragma GCC diagnostic pop
    summary.clear_final_reward_mean();
    summary.clear_verification();
    summary.clear_weight_sync();
    progress.clear_groups_trained();
    record->recent_step_rewards.clear();
    int64_t last = 0;
    for (const v1::TrainingStepMetrics& step : steps) {
      if (step.step() <= last) continue;  // As the driver: a repeated report.
      last = step.step();
      ApplyStepFigures(step, &run, &record->recent_step_rewards);
      record->max_policy_version = std::max(record->max_policy_version, step.policy_version());
    }
    record->last_step = last;
  }
  if (record->max_policy_version >= 0) {
    run.mutable_progress()->set_policy_version(record->max_policy_version);
    run.mutable_summary()->set_weight_versions(record->max_policy_version + 1);
  }
  run.mutable_summary()->clear_evals();
  for (const v1::EvalResult& eval : ReadJsonLines<v1::EvalResult>(files.Path(RunFiles::kEvals))) {
    ApplyEvalFigures(eval, &run);
  }
}

}  // namespace

RunRecord NewRunRecord(v1::Run run, std::string request_id, int64_t sequence, RunSizes sizes) {
  RunRecord record;
  record.request_id = std::move(request_id);
  record.sequence = sequence;
  record.sizes = sizes;
  record.run = std::move(run);
  v1::Run& r = record.run;
  r.set_state(v1::RUN_STATE_QUEUED);
  *r.mutable_updated_at() = r.created_at();
  v1::RunProgress& progress = *r.mutable_progress();
  progress.set_total_steps(r.spec().algorithm().total_steps());
  progress.set_phase("queued");
  v1::RunSummary& summary = *r.mutable_summary();
  summary.set_run_id(r.run_id());
  summary.set_state(v1::RunState_Name(v1::RUN_STATE_QUEUED));
  summary.set_eta(r.spec().algorithm().max_staleness());
  return record;
}

std::string EncodeRunState(const RunRecord& record) {
  v1::Run run = record.run;
  run.clear_spec();
  run.mutable_summary()->clear_evals();
  run.set_queue_position(0);
  nlohmann::ordered_json state;
  state["format"] = kStateFormat;
  state["run"] = nlohmann::ordered_json::parse(ProtoToJson(run, /*pretty=*/false));
  state["request_id"] = record.request_id;
  state["sequence"] = record.sequence;
  state["sizes"] = {{"max_prompt_tokens", record.sizes.max_prompt_tokens},
                    {"max_sequence_tokens", record.sizes.max_sequence_tokens}};
  nlohmann::ordered_json driver;
  driver["last_step"] = record.last_step;
  driver["max_policy_version"] = record.max_policy_version;
  nlohmann::json times = nlohmann::json::object();
  PutTime(times, "left_pending_at_unix_ns", record.left_pending_at);
  PutTime(times, "warm_start_started_at_unix_ns", record.warm_start_started_at);
  PutTime(times, "rl_started_at_unix_ns", record.rl_started_at);
  for (const auto& [key, value] : times.items()) driver[key] = value;
  driver["recent_step_rewards"] = record.recent_step_rewards;
  nlohmann::ordered_json incarnations = nlohmann::ordered_json::object();
  for (const auto& [service, incarnation] : record.incarnations) incarnations[service] = incarnation;
  driver["incarnations"] = std::move(incarnations);
  state["driver"] = std::move(driver);
  return state.dump(2);
}

absl::StatusOr<RunRecord> DecodeRunState(absl::string_view text) {
  const nlohmann::json state =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (state.is_discarded() || !state.is_object()) {
    return absl::DataLossError("not a JSON object");
  }
  int64_t format = 0;
  if (!GetInt(state, "format", &format) || format != kStateFormat) {
    return absl::DataLossError(
        absl::StrCat("unknown format (this controller reads format ", kStateFormat, ")"));
  }
  auto run = state.find("run");
  if (run == state.end() || !run->is_object()) return absl::DataLossError("no \"run\" object");
  RunRecord record;
  if (absl::Status parsed = ParseProto(run->dump(), &record.run); !parsed.ok()) {
    return absl::DataLossError(absl::StrCat("\"run\" is not a Run: ", parsed.message()));
  }
  if (auto it = state.find("request_id"); it != state.end()) {
    if (!it->is_string()) return absl::DataLossError("\"request_id\" is not a string");
    record.request_id = it->get<std::string>();
  }
  if (!GetInt(state, "sequence", &record.sequence)) {
    return absl::DataLossError("\"sequence\" is not an integer");
  }
  if (auto sizes = state.find("sizes"); sizes != state.end()) {
    if (!sizes->is_object() ||
        !GetInt(*sizes, "max_prompt_tokens", &record.sizes.max_prompt_tokens) ||
        !GetInt(*sizes, "max_sequence_tokens", &record.sizes.max_sequence_tokens)) {
      return absl::DataLossError("\"sizes\" is not {max_prompt_tokens, max_sequence_tokens}");
    }
  }
  auto driver = state.find("driver");
  if (driver == state.end() || !driver->is_object()) {
    return absl::DataLossError("no \"driver\" object");
  }
  if (!GetInt(*driver, "last_step", &record.last_step) ||
      !GetInt(*driver, "max_policy_version", &record.max_policy_version) ||
      !GetTime(*driver, "left_pending_at_unix_ns", &record.left_pending_at) ||
      !GetTime(*driver, "warm_start_started_at_unix_ns", &record.warm_start_started_at) ||
      !GetTime(*driver, "rl_started_at_unix_ns", &record.rl_started_at)) {
    return absl::DataLossError("a \"driver\" figure is not an integer");
  }
  if (auto rewards = driver->find("recent_step_rewards"); rewards != driver->end()) {
    if (!rewards->is_array()) return absl::DataLossError("\"recent_step_rewards\" is not a list");
    for (const nlohmann::json& reward : *rewards) {
      if (!reward.is_number()) return absl::DataLossError("a recent step reward is not a number");
      record.recent_step_rewards.push_back(reward.get<double>());
    }
  }
  if (auto incarnations = driver->find("incarnations"); incarnations != driver->end()) {
    if (!incarnations->is_object()) return absl::DataLossError("\"incarnations\" is not an object");
    for (const auto& [service, incarnation] : incarnations->items()) {
      if (!incarnation.is_number_unsigned()) {
        return absl::DataLossError(absl::StrCat("incarnation of ", service, " is not a number"));
      }
      record.incarnations[service] = incarnation.get<uint64_t>();
    }
  }
  return record;
}

absl::StatusOr<RunRecord> LoadRunRecord(const std::string& dir, const std::string& run_id) {
  const RunFiles files = RunFiles::At(dir);
  std::error_code error;
  const bool has_spec = fs::exists(files.Path(RunFiles::kSpec), error);
  const bool has_state = fs::exists(files.Path(RunFiles::kState), error);
  if (!has_spec && !has_state) {
    return absl::NotFoundError(absl::StrCat(dir, " holds no run (no ", RunFiles::kSpec, ")"));
  }
  if (!has_spec) return absl::DataLossError(absl::StrCat(RunFiles::kSpec, " is missing"));
  absl::StatusOr<std::string> spec_text = ReadText(files.Path(RunFiles::kSpec));
  if (!spec_text.ok()) {
    return absl::DataLossError(absl::StrCat("cannot read ", RunFiles::kSpec, ": ",
                                            spec_text.status().message()));
  }
  v1::RunSpec spec;
  if (absl::Status parsed = ParseProto(*spec_text, &spec); !parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat(RunFiles::kSpec, " is not a RunSpec: ", parsed.message()));
  }

  absl::StatusOr<RunRecord> record;
  if (has_state) {
    absl::StatusOr<std::string> text = ReadText(files.Path(RunFiles::kState));
    record = text.ok() ? DecodeRunState(*text) : text.status();
    if (!record.ok()) {
      return absl::DataLossError(
          absl::StrCat(RunFiles::kState, " is unreadable: ", record.status().message()));
    }
    if (record->run.run_id() != run_id) {
      return absl::DataLossError(absl::StrCat(RunFiles::kState, " is the record of run \"",
                                              record->run.run_id(), "\", not of this directory"));
    }
    if (record->run.state() == v1::RUN_STATE_UNSPECIFIED) {
      return absl::DataLossError(absl::StrCat(RunFiles::kState, " has no run state"));
    }
  } else {
    record = LoadFromSummary(files, run_id);
    if (!record.ok()) return record.status();
  }
  *record->run.mutable_spec() = std::move(spec);
  record->run.mutable_progress()->set_total_steps(record->run.spec().algorithm().total_steps());
  record->run.mutable_summary()->set_run_id(run_id);
  RebuildFromAppendedFiles(files, &*record);
  return record;
}

namespace {

// The step's rollout verification added to the run's (per worker, in order
// of first appearance; a worker once quarantined stays so).
void ApplyVerificationFigures(const v1::TrainingStepMetrics& step,
                              v1::RolloutVerificationSummary* verification) {
  verification->set_groups_verified(verification->groups_verified() + step.groups_verified());
  verification->set_groups_failed(verification->groups_failed() +
                                  step.groups_verification_failed());
  verification->set_groups_unverifiable(verification->groups_unverifiable() +
                                        step.groups_unverifiable());
  verification->set_seconds(verification->seconds() + step.verification_seconds());
  if (step.groups_verified() > 0) {
    verification->set_max_abs_diff_verified(
        std::max(verification->max_abs_diff_verified(), step.verification_max_abs_diff()));
  }
  auto worker = [verification](const std::string& id) -> v1::WorkerVerification& {
    for (v1::WorkerVerification& w : *verification->mutable_workers()) {
      if (w.worker_id() == id) return w;
    }
    v1::WorkerVerification& added = *verification->add_workers();
    added.set_worker_id(id);
    return added;
  };
  for (const v1::WorkerVerification& w : step.verification_by_worker()) {
    v1::WorkerVerification& total = worker(w.worker_id());
    total.set_groups_verified(total.groups_verified() + w.groups_verified());
    total.set_groups_failed(total.groups_failed() + w.groups_failed());
    for (const std::string& connection : w.quarantined_connections()) {
      if (std::find(total.quarantined_connections().begin(), total.quarantined_connections().end(),
                    connection) == total.quarantined_connections().end()) {
        total.add_quarantined_connections(connection);
      }
    }
  }
  for (const std::string& id : step.workers_quarantined()) worker(id).set_quarantined(true);
}

// The version the step published, added to the run's weight-sync figures;
// the run's resolved weight_sync names what they are.
void ApplyWeightSyncFigures(const v1::TrainingStepMetrics& step, const v1::RunSpec& spec,
                            v1::RunSummary* summary) {
  if (step.weight_version_bytes() <= 0) return;  // a trainer without the figures
  v1::WeightSyncSummary* sync = summary->mutable_weight_sync();
  const run::WeightSync resolved = run::ResolveWeightSync(spec);
  sync->set_transport(run::WeightTransportLabel(resolved.transport));
  sync->set_dtype(run::WeightSyncDTypeName(resolved.dtype));
  sync->set_delta(resolved.delta);
  sync->set_versions(sync->versions() + 1);
  sync->set_version_bytes(sync->version_bytes() + step.weight_version_bytes());
  if (step.weight_delta_bytes() > 0) {
    sync->set_delta_versions(sync->delta_versions() + 1);
    sync->set_delta_bytes(sync->delta_bytes() + step.weight_delta_bytes());
    sync->set_delta_versions_full_bytes(sync->delta_versions_full_bytes() +
                                        step.weight_version_bytes());
    sync->set_delta_encode_seconds(sync->delta_encode_seconds() +
                                   step.weight_delta_encode_seconds());
  }
}

}  // namespace

void ApplyStepFigures(const v1::TrainingStepMetrics& step, v1::Run* run,
                      std::deque<double>* recent_step_rewards) {
  v1::RunProgress& progress = *run->mutable_progress();
  progress.set_step(step.step());
  progress.set_reward_mean(step.reward_mean());
  progress.set_pass_rate(step.pass_rate());
  progress.set_staleness_mean(step.staleness_mean());
  progress.set_staleness_max(step.staleness_max());
  progress.set_trained_tokens_per_second(step.trainer_tokens_per_second());
  progress.set_loss(step.loss());

  v1::RunSummary& summary = *run->mutable_summary();
  summary.set_steps(step.step());
  summary.set_groups_trained(summary.groups_trained() + step.groups());
  summary.set_tokens_trained(summary.tokens_trained() + step.tokens_trained());
  summary.set_max_observed_staleness(
      std::max(summary.max_observed_staleness(), step.staleness_max()));
  // Deprecated, the same figure: written one more version for old readers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  summary.set_max_staleness(summary.max_observed_staleness());
#pragma GCC diagnostic pop
  progress.set_groups_trained(summary.groups_trained());
  ApplyVerificationFigures(step, summary.mutable_verification());
  ApplyWeightSyncFigures(step, run->spec(), &summary);
  recent_step_rewards->push_back(step.reward_mean());
  while (recent_step_rewards->size() > kFinalRewardSteps) recent_step_rewards->pop_front();
  summary.set_final_reward_mean(
      std::accumulate(recent_step_rewards->begin(), recent_step_rewards->end(), 0.0) /
      static_cast<double>(recent_step_rewards->size()));
}

void ApplyEvalFigures(const v1::EvalResult& eval, v1::Run* run) {
  v1::RunSummary& summary = *run->mutable_summary();
  v1::RunProgress& progress = *run->mutable_progress();
  *summary.add_evals() = eval;
  progress.set_latest_eval_accuracy(eval.accuracy());
  progress.set_latest_eval_step(eval.step());
  if (eval.phase() == "before") summary.set_eval_before(eval.accuracy());
  if (eval.phase() == "after") summary.set_eval_after(eval.accuracy());
  if (eval.phase() == "warm_start") summary.set_warm_start_accuracy(eval.accuracy());
}

}  // namespace sluice::controller
