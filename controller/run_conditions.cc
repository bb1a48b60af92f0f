#include "controller/run_conditions.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace sluice::controller {
namespace {

absl::Time FromTimestamp(const google::protobuf::Timestamp &timestamp) {
  return absl::FromUnixSeconds(timestamp.seconds()) + absl::Nanoseconds(timestamp.nanos());
}

void ToTimestamp(absl::Time time, google::protobuf::Timestamp *timestamp) {
  const int64_t nanos = absl::ToUnixNanos(time);
  timestamp->set_seconds(nanos / 1000000000);
  timestamp->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

int IndexOf(const v1::Run &run, absl::string_view kind, absl::string_view service) {
  for (int i = 0; i < run.conditions_size(); ++i) {
    const v1::RunCondition &condition = run.conditions(i);
    if (condition.kind() == kind && condition.service() == service) return i;
  }
  return -1;
}

}  // namespace

bool RunConditions::Set(v1::Run *run, absl::string_view kind, absl::string_view service,
                        absl::string_view message, absl::Time now) {
  if (const int i = IndexOf(*run, kind, service); i >= 0) {
    v1::RunCondition *condition = run->mutable_conditions(i);
    if (condition->message() == message) return false;
    condition->set_message(std::string(message));
    return true;
  }
  v1::RunCondition *condition = run->add_conditions();
  condition->set_kind(std::string(kind));
  condition->set_service(std::string(service));
  condition->set_message(std::string(message));
  ToTimestamp(now, condition->mutable_since());
  return true;
}

bool RunConditions::Clear(v1::Run *run, absl::string_view kind, absl::string_view service) {
  const int i = IndexOf(*run, kind, service);
  if (i < 0) return false;
  run->mutable_conditions()->DeleteSubrange(i, 1);
  return true;
}

bool RunConditions::ClearKind(v1::Run *run, absl::string_view kind) {
  auto *conditions = run->mutable_conditions();
  const int before = conditions->size();
  conditions->erase(std::remove_if(conditions->begin(), conditions->end(),
                                   [&](const v1::RunCondition &c) { return c.kind() == kind; }),
                    conditions->end());
  return conditions->size() != before;
}

bool RunConditions::ClearAll(v1::Run *run) {
  if (run->conditions_size() == 0) return false;
  run->clear_conditions();
  return true;
}

const v1::RunCondition *RunConditions::Find(const v1::Run &run, absl::string_view kind,
                                            absl::string_view service) {
  const int i = IndexOf(run, kind, service);
  return i < 0 ? nullptr : &run.conditions(i);
}

std::string RunConditions::Describe(const v1::Run &run, absl::Time now) {
  std::string out;
  for (const v1::RunCondition &condition : run.conditions()) {
    const double seconds =
        std::max(0.0, absl::ToDoubleSeconds(now - FromTimestamp(condition.since())));
    absl::StrAppend(&out, condition.service().empty() ? condition.kind() : condition.service(),
                    ": ", condition.message(), " (since ", std::llround(seconds), " s)\n");
  }
  return out;
}

}  // namespace sluice::controller
