#ifndef SLUICE_BENCHMARKS_BENCH_GROUP_H_
#define SLUICE_BENCHMARKS_BENCH_GROUP_H_

#include <cstdint>
#include <string>

#include "sluice/v1/common.pb.h"

namespace sluice::bench {

// A valid group (it passes RunTable's checks) shaped like a rollout worker's:
// `group_size` trajectories, each with prompt tokens, completion tokens, one
// behaviour logprob and one policy version (all `policy_version`) per
// completion token, a reward and a verifier result. The completion length is
// chosen so that the serialized group is as close to `target_bytes` as the
// shape allows (a few bytes off; never less than one completion token per
// trajectory, so tiny targets give somewhat bigger groups). Token ids are
// drawn from `seed`, all with 3-byte varints, so that size is linear in the
// length. group_id is `group_id`, idempotency key "<run_id>/<group_id>".
v1::Group MakeBenchGroup(const std::string& run_id, const std::string& group_id, int group_size,
                         int64_t target_bytes, int64_t policy_version = 0, uint64_t seed = 1);

// The same with exactly `completion_tokens` completion tokens per trajectory
// (and a quarter as many prompt tokens, at least one).
v1::Group MakeBenchGroupWithTokens(const std::string& run_id, const std::string& group_id,
                                   int group_size, int completion_tokens,
                                   int64_t policy_version = 0, uint64_t seed = 1);

// Gives `group` a new identity (group_id, trajectory group ids and ids,
// idempotency key "<run_id>/<group_id>") without touching its token arrays.
void RenameGroup(const std::string& group_id, v1::Group* group);

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_BENCH_GROUP_H_
