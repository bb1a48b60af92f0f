#ifndef SLUICE_CONTROLLER_RUN_CONDITIONS_H_
#define SLUICE_CONTROLLER_RUN_CONDITIONS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

// The conditions that hold a run back (Run.conditions): a service the
// controller waits for, no worker serving the run, a disk that is full. One
// home for the rule that every such wait is visible in GetRun while it lasts,
// so that a run never sits in TRAINING with nothing said.
//
// A condition is keyed by (kind, service): setting it again updates its
// message and keeps its `since`; clearing it drops it. Operates on the run
// proto it is given; not thread-safe (the driver calls it under its lock).
// O(conditions) per call, and a run has a handful.
class RunConditions {
 public:
  // Adds the condition, or updates the message of the one with the same
  // kind and service. Returns true when the run changed.
  static bool Set(v1::Run *run, absl::string_view kind, absl::string_view service,
                  absl::string_view message, absl::Time now);
  // Drops the condition of that kind and service. Returns true when one was
  // dropped.
  static bool Clear(v1::Run *run, absl::string_view kind, absl::string_view service);
  // Drops every condition of `kind` (any service). Returns true when one was.
  static bool ClearKind(v1::Run *run, absl::string_view kind);
  // Drops them all (the run ended). Returns true when there were any.
  static bool ClearAll(v1::Run *run);
  // The condition of that kind and service, or null.
  static const v1::RunCondition *Find(const v1::Run &run, absl::string_view kind,
                                      absl::string_view service);
  // One line per condition, "<service>: <message> (since 12 s)", for logs
  // and the CLI; empty when there are none.
  static std::string Describe(const v1::Run &run, absl::Time now);
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_CONDITIONS_H_
