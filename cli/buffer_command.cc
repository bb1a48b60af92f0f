#include "cli/buffer_command.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "controller/proto_json.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/transport_security.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::cli {
namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;
using Json = nlohmann::ordered_json;

constexpr char kCommand[] = "sluice buffer stats";

// gRPC messages can span lines; a CLI error is one.
std::string OneLine(absl::string_view text) {
  return absl::StrReplaceAll(absl::StripAsciiWhitespace(text), {{"\r\n", " "}, {"\n", " "}});
}

// "EVICTION_REASON_MAX_TIMES_SAMPLED" of EvictionReason -> "max_times_sampled";
// "SAMPLER_KIND_FIFO" of SamplerKind -> "FIFO" (with lower = false).
std::string EnumWord(const EnumDescriptor& type, const std::string& value_name, bool lower) {
  std::string prefix;
  for (char c : type.name()) {
    if (std::isupper(static_cast<unsigned char>(c)) && !prefix.empty()) prefix += '_';
    prefix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  prefix += '_';
  std::string word =
      absl::StartsWith(value_name, prefix) ? value_name.substr(prefix.size()) : value_name;
  return lower ? absl::AsciiStrToLower(word) : word;
}

// Every eviction reason this build knows, in enum order, with its count (0
// when the stats do not mention it), then any reason it does not know.
std::vector<std::pair<std::string, int64_t>> Evictions(const v1::BufferStats& stats) {
  std::map<int, int64_t> by_number;
  for (const v1::EvictionCount& count : stats.evictions()) {
    by_number[static_cast<int>(count.reason())] += count.groups();
  }
  std::vector<std::pair<std::string, int64_t>> evictions;
  const EnumDescriptor& type = *v1::EvictionReason_descriptor();
  for (int i = 0; i < type.value_count(); ++i) {
    const EnumValueDescriptor& value = *type.value(i);
    if (value.number() == 0) continue;
    auto it = by_number.find(value.number());
    evictions.emplace_back(EnumWord(type, value.name(), /*lower=*/true),
                           it == by_number.end() ? 0 : it->second);
    if (it != by_number.end()) by_number.erase(it);
  }
  for (const auto& [number, groups] : by_number) {
    evictions.emplace_back(absl::StrCat("reason_", number), groups);
  }
  return evictions;
}

// A histogram with its cumulative counts; tolerant of a counts array of the
// wrong length (missing buckets count 0, extra ones go to +Inf).
struct Histogram {
  struct Bucket {
    bool infinite = false;
    int64_t upper_bound = 0;
    int64_t count = 0;
    int64_t cumulative = 0;
  };
  std::vector<Bucket> buckets;
  int64_t count = 0;
  int64_t sum = 0;
  bool has_mean() const { return count > 0; }
  double mean() const {
    return count > 0 ? static_cast<double>(sum) / static_cast<double>(count) : 0.0;
  }
};

Histogram ReadHistogram(const v1::StalenessHistogram& proto) {
  Histogram histogram;
  const int bounds = proto.bucket_upper_bounds_size();
  for (int i = 0; i <= bounds; ++i) {
    Histogram::Bucket bucket;
    bucket.infinite = i == bounds;
    if (!bucket.infinite) bucket.upper_bound = proto.bucket_upper_bounds(i);
    if (i < proto.counts_size()) bucket.count = proto.counts(i);
    if (bucket.infinite) {
      for (int extra = bounds + 1; extra < proto.counts_size(); ++extra) {
        bucket.count += proto.counts(extra);
      }
    }
    histogram.count += bucket.count;
    bucket.cumulative = histogram.count;
    histogram.buckets.push_back(bucket);
  }
  histogram.sum = proto.sum();
  return histogram;
}

Json HistogramToJson(const v1::StalenessHistogram& proto) {
  const Histogram histogram = ReadHistogram(proto);
  Json buckets = Json::array();
  for (const Histogram::Bucket& bucket : histogram.buckets) {
    Json entry = Json::object();
    entry["le"] = bucket.infinite ? Json("+Inf") : Json(bucket.upper_bound);
    entry["count"] = bucket.count;
    entry["cumulative"] = bucket.cumulative;
    buckets.push_back(std::move(entry));
  }
  Json json = Json::object();
  json["buckets"] = std::move(buckets);
  json["count"] = histogram.count;
  json["sum"] = histogram.sum;
  json["mean"] = histogram.has_mean() ? Json(histogram.mean()) : Json(nullptr);
  return json;
}

// "512 B", "1.5 KiB", "12.0 MiB"
std::string Bytes(int64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string Plural(int64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

// The config's fields that differ from their defaults, "name=value" each.
std::string ConfigText(const v1::BufferConfig& config) {
  std::vector<std::string> fields;
  const Reflection& reflection = *config.GetReflection();
  const google::protobuf::Descriptor& type = *config.GetDescriptor();
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor& field = *type.field(i);
    if (field.is_repeated()) {
      if (reflection.FieldSize(config, &field) > 0) {
        fields.push_back(
            absl::StrCat(field.name(), "=[", reflection.FieldSize(config, &field), " entries]"));
      }
      continue;
    }
    if (!reflection.HasField(config, &field)) continue;  // proto3: set = not the default
    std::string value;
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        value = absl::StrCat(reflection.GetInt32(config, &field));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        value = absl::StrCat(reflection.GetInt64(config, &field));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        value = absl::StrCat(reflection.GetUInt32(config, &field));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        value = absl::StrCat(reflection.GetUInt64(config, &field));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        value = absl::StrCat(reflection.GetDouble(config, &field));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        value = absl::StrCat(reflection.GetFloat(config, &field));
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        value = reflection.GetBool(config, &field) ? "true" : "false";
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumValueDescriptor& enum_value = *reflection.GetEnum(config, &field);
        value = EnumWord(*field.enum_type(), enum_value.name(), /*lower=*/false);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        value = absl::StrCat("\"", reflection.GetString(config, &field), "\"");
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        value = "{...}";
        break;
    }
    fields.push_back(absl::StrCat(field.name(), "=", value));
  }
  return fields.empty() ? "all defaults" : absl::StrJoin(fields, " ");
}

void AppendHistogramText(const std::string& title, const v1::StalenessHistogram& proto,
                         std::string* text) {
  constexpr int kBarWidth = 40;
  const Histogram histogram = ReadHistogram(proto);
  absl::StrAppend(text, "\n", title, ": ", histogram.count, " observed");
  if (histogram.has_mean()) {
    absl::StrAppend(text, absl::StrFormat(", mean %.2f versions", histogram.mean()));
  }
  absl::StrAppend(text, "\n");
  int64_t largest = 0;
  for (const Histogram::Bucket& bucket : histogram.buckets) {
    largest = std::max(largest, bucket.count);
  }
  for (size_t i = 0; i < histogram.buckets.size(); ++i) {
    const Histogram::Bucket& bucket = histogram.buckets[i];
    std::string label = absl::StrCat("<= ", bucket.upper_bound);
    if (bucket.infinite) {
      label = i == 0 ? "all" : absl::StrCat("> ", histogram.buckets[i - 1].upper_bound);
    }
    const int bar =
        largest > 0 ? static_cast<int>((bucket.count * kBarWidth + largest - 1) / largest) : 0;
    absl::StrAppend(text, absl::StrFormat("  %-8s %10d", label, bucket.count),
                    bar > 0 ? absl::StrCat("  ", std::string(bar, '#')) : "", "\n");
  }
}

}  // namespace

std::string BufferStatsToJson(const v1::BufferStats& stats) {
  Json json = Json::object();
  json["run_id"] = stats.run_id();
  json["groups"] = stats.size_groups();
  json["trajectories"] = stats.size_trajectories();
  json["bytes"] = stats.size_bytes();
  json["policy_version"] = stats.policy_version();
  json["accepted"] = stats.accepted();
  json["running"] = stats.running();
  json["admission_limit"] = stats.admission_limit();
  json["batch_size_groups"] = stats.batch_size_groups();
  json["max_staleness"] = stats.max_staleness();
  json["inserted_groups"] = stats.inserted_groups();
  json["duplicate_inserts"] = stats.duplicate_inserts();
  json["rejected_inserts"] = stats.rejected_inserts();
  json["sampled_groups"] = stats.sampled_groups();
  Json evictions = Json::object();
  for (const auto& [reason, groups] : Evictions(stats)) evictions[reason] = groups;
  json["evictions"] = std::move(evictions);
  Json staleness = Json::object();
  staleness["sampled_groups"] = HistogramToJson(stats.sampled_group_staleness());
  staleness["sampled_tokens"] = HistogramToJson(stats.sampled_token_staleness());
  json["staleness"] = std::move(staleness);
  Json rate_limiter = Json::object();
  rate_limiter["insert_blocked_ms"] = stats.rate_limiter_insert_blocked_ms();
  rate_limiter["sample_blocked_ms"] = stats.rate_limiter_sample_blocked_ms();
  json["rate_limiter"] = std::move(rate_limiter);
  json["admission_blocked_ms"] = stats.admission_blocked_ms();
  json["config"] = Json::parse(controller::ProtoToJson(stats.config(), /*pretty=*/false));
  return json.dump(2);
}

std::string BufferStatsToText(const v1::BufferStats& stats) {
  std::string text;
  const auto row = [&text](absl::string_view name, absl::string_view value) {
    absl::StrAppend(&text, absl::StrFormat("%-16s %s\n", name, value));
  };
  row("run", stats.run_id());
  row("size", absl::StrCat(Plural(stats.size_groups(), "group", "groups"), ", ",
                           Plural(stats.size_trajectories(), "trajectory", "trajectories"), ", ",
                           Bytes(stats.size_bytes())));
  row("policy version", absl::StrCat(stats.policy_version()));
  row("admission gate",
      absl::StrCat("accepted ", stats.accepted(), ", running ", stats.running(), ", limit ",
                   stats.admission_limit(), " (B ", stats.batch_size_groups(), ", eta ",
                   stats.max_staleness(), ")"));
  row("inserts", absl::StrCat(stats.inserted_groups(), " stored, ", stats.duplicate_inserts(),
                              " duplicate, ", stats.rejected_inserts(), " rejected"));
  row("samples", absl::StrCat(Plural(stats.sampled_groups(), "group", "groups"), " handed out"));
  std::vector<std::string> evictions;
  for (const auto& [reason, groups] : Evictions(stats)) {
    evictions.push_back(absl::StrCat(reason, " ", groups));
  }
  row("evictions", absl::StrJoin(evictions, ", "));
  row("blocked", absl::StrCat("rate limiter: inserts ", stats.rate_limiter_insert_blocked_ms(),
                              " ms, samples ", stats.rate_limiter_sample_blocked_ms(),
                              " ms; admission gate ", stats.admission_blocked_ms(), " ms"));
  row("config", ConfigText(stats.config()));
  AppendHistogramText("staleness of sampled groups", stats.sampled_group_staleness(), &text);
  AppendHistogramText("staleness of sampled tokens", stats.sampled_token_staleness(), &text);
  return text;
}

absl::StatusOr<v1::BufferStats> FetchBufferStats(const std::string& target,
                                                 const std::string& run_id,
                                                 absl::Duration timeout) {
  auto stub = v1::ReplayBufferService::NewStub(
      runtime::CreateChannel(target));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::GetStatsRequest request;
  request.set_run_id(run_id);
  v1::GetStatsResponse response;
  const absl::Status status = runtime::FromGrpcStatus(stub->GetStats(&context, request, &response));
  if (status.ok()) return response.stats();
  const std::string detail = OneLine(status.message());
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return absl::Status(status.code(),
                          absl::StrCat("cannot reach the replay buffer at ", target, ": ", detail));
    case absl::StatusCode::kNotFound:
      // The buffer's message only restates that the run is not configured.
      return absl::NotFoundError(
          absl::StrCat("the replay buffer at ", target, " has no run \"", run_id,
                       "\"; `sluice runs list` shows the controller's runs"));
    case absl::StatusCode::kUnimplemented:
      return absl::UnimplementedError(absl::StrCat(
          target,
          " does not serve the replay buffer API (is it the replay buffer's address?): ", detail));
    default:
      return absl::Status(status.code(),
                          absl::StrCat("replay buffer GetStats on ", target, ": ", detail));
  }
}

int RunBufferStats(const BufferStatsFlags& flags, std::ostream& out, std::ostream& err) {
  std::vector<v1::BufferStats> runs;
  if (!flags.run_id.empty()) {
    absl::StatusOr<v1::BufferStats> stats =
        FetchBufferStats(flags.target, flags.run_id, absl::Milliseconds(flags.timeout_ms));
    if (!stats.ok()) {
      err << kCommand << ": " << stats.status().message() << "\n";
      return 1;
    }
    runs.push_back(*std::move(stats));
  } else {
    absl::StatusOr<std::vector<v1::BufferStats>> all =
        FetchAllBufferStats(flags.target, absl::Milliseconds(flags.timeout_ms));
    if (!all.ok()) {
      err << kCommand << ": " << all.status().message() << "\n";
      return 1;
    }
    runs = *std::move(all);
  }
  // One run (named, or the only one): that run's object. Otherwise the
  // buffer's totals with every run under "runs".
  if (runs.size() == 1) {
    out << (flags.json ? BufferStatsToJson(runs[0]) + "\n" : BufferStatsToText(runs[0]));
    return 0;
  }
  out << (flags.json ? BufferSummaryToJson(runs) + "\n" : BufferSummaryToText(runs));
  return 0;
}

absl::StatusOr<std::vector<v1::BufferStats>> FetchAllBufferStats(const std::string& target,
                                                                 absl::Duration timeout) {
  auto stub = v1::ReplayBufferService::NewStub(
      runtime::CreateChannel(target));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  const absl::Status status = runtime::FromGrpcStatus(stub->GetStats(&context, request, &response));
  if (!status.ok()) {
    const std::string detail = OneLine(status.message());
    if (status.code() == absl::StatusCode::kUnavailable ||
        status.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(status.code(),
                          absl::StrCat("cannot reach the replay buffer at ", target, ": ", detail));
    }
    return absl::Status(status.code(),
                        absl::StrCat("replay buffer GetStats on ", target, ": ", detail));
  }
  return std::vector<v1::BufferStats>(response.runs().begin(), response.runs().end());
}

std::string BufferSummaryToJson(const std::vector<v1::BufferStats>& runs) {
  Json json = Json::object();
  int64_t groups = 0, trajectories = 0, bytes = 0;
  Json list = Json::array();
  for (const v1::BufferStats& run : runs) {
    groups += run.size_groups();
    trajectories += run.size_trajectories();
    bytes += run.size_bytes();
    list.push_back(Json::parse(BufferStatsToJson(run)));
  }
  json["groups"] = groups;
  json["trajectories"] = trajectories;
  json["bytes"] = bytes;
  json["runs"] = std::move(list);
  return json.dump(2);
}

std::string BufferSummaryToText(const std::vector<v1::BufferStats>& runs) {
  int64_t groups = 0;
  for (const v1::BufferStats& run : runs) groups += run.size_groups();
  std::string text = absl::StrCat(runs.size(), " runs, ", groups, " groups held\n");
  for (const v1::BufferStats& run : runs) absl::StrAppend(&text, "\n", BufferStatsToText(run));
  return text;
}

CLI::App* AddBufferCommand(CLI::App& app, BufferStatsFlags* flags) {
  CLI::App* buffer = app.add_subcommand("buffer", "Inspect the replay buffer");
  buffer->require_subcommand(1);
  CLI::App* stats = buffer->add_subcommand(
      "stats",
      "Print one run's buffer statistics: size, gate, counters, evictions, staleness histograms");
  stats->add_option("--target", flags->target, "replay buffer HOST:PORT")->required();
  stats->add_option("--run-id", flags->run_id,
                    "the run whose table to describe (default: every run; one run's object "
                    "when the buffer holds exactly one)");
  stats->add_flag("--json", flags->json, "print one JSON object instead of the summary");
  stats->add_option("--timeout-ms", flags->timeout_ms, "give up after this long")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return buffer;
}

}  // namespace sluice::cli
