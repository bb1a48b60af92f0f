// libFuzzer target for what any client can insert into the replay buffer: a
// serialized InsertGroupsRequest (the InsertGroups stream's message) whose
// groups are checked by ValidateGroup before anything of them is stored or
// logged. Arbitrary bytes must give a parse error or, per group, a
// validation result naming the field; never a crash.
//
// Each group is validated against limits matching the group itself (its own
// run_id and size, unbounded vocabulary and rewards), so that the fuzzer
// reaches the per-token checks without first guessing the run, and then
// inserted into a real RunTable ("run-fuzz", G = 4, vocabulary 1000, rewards
// in [0, 1]): its validation against the run, the admission gate and the
// bookkeeping, a fresh table per input so that memory stays bounded.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "replay_buffer/group_validation.h"
#include "replay_buffer/run_table.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace {

namespace replay_buffer = sluice::replay_buffer;
namespace v1 = sluice::v1;

constexpr char kRun[] = "run-fuzz";

void Validate(const v1::Group& group, const replay_buffer::GroupLimits& limits) {
  absl::StatusOr<replay_buffer::GroupVersions> versions =
      replay_buffer::ValidateGroup(group, limits);
  if (!versions.ok()) return;
  if (versions->min_policy_version > versions->max_policy_version) __builtin_trap();
  // A valid group's versions are non-negative and non-decreasing: none is
  // ahead of the newest, and the oldest is ahead of the version before it.
  if (!replay_buffer::CheckVersionsNotAhead(group, versions->max_policy_version).ok() ||
      replay_buffer::CheckVersionsNotAhead(group, versions->min_policy_version - 1).ok()) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf logs every string field that is not UTF-8; the fuzzer makes
  // thousands a second.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  v1::InsertGroupsRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const v1::Group& group : request.groups()) {
    replay_buffer::GroupLimits own;
    own.run_id = group.run_id();
    own.group_size = group.trajectories_size();
    Validate(group, own);
  }
  replay_buffer::RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = 2;
  config.max_staleness = 2;
  config.group_size = 4;
  config.vocab_size = 1000;
  config.min_reward = 0.0;
  config.max_reward = 1.0;
  absl::StatusOr<std::unique_ptr<replay_buffer::RunTable>> table =
      replay_buffer::RunTable::Create(config);
  if (!table.ok()) __builtin_trap();
  for (const v1::Group& group : request.groups()) {
    (void)(*table)->Insert(group, /*rate_limit_wait=*/absl::ZeroDuration());
  }
  return 0;
}
