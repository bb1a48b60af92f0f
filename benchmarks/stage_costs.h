#ifndef SLUICE_BENCHMARKS_STAGE_COSTS_H_
#define SLUICE_BENCHMARKS_STAGE_COSTS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/common.pb.h"

namespace sluice::bench {

// One stage of an item's way through the service or the raw baseline,
// timed alone on one thread: microseconds of CPU (wall, single thread) per
// item. They say where the loopback throughput goes: on a machine with few
// cores, client and server share them, so items/s is bounded by about
// cores / (the sum of a path's stages + gRPC's own per-message costs).
struct StageCost {
  std::string name;  // e.g. "insert.server_parse"
  std::string path;  // "service_insert", "service_sample", "raw_push" or "raw_pull"
  double us_per_item = 0;
};

// Times each stage on copies of `group` (for about `min_time` each), sampling
// in batches of `sample_batch_groups` like the loopback samplers.
absl::StatusOr<std::vector<StageCost>> MeasureStageCosts(const v1::Group& group,
                                                         int sample_batch_groups,
                                                         absl::Duration min_time);

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_STAGE_COSTS_H_
