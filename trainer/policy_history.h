#ifndef SLUICE_TRAINER_POLICY_HISTORY_H_
#define SLUICE_TRAINER_POLICY_HISTORY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "trainer/weight_store.h"

namespace sluice::trainer {

// The weights of the last `retain` versions the trainer published, for the
// rollout verifier (rollout_verifier.h) to recompute a token under the
// version that sampled it. A trainable group's tokens are at most eta
// versions older than the trainer's version when the batch was sampled, and
// its minibatches publish up to minibatches_per_batch - 1 more before the
// last one trains: retain = eta + minibatches_per_batch + 1 holds all of them.
//
// Cheaper than keeping a model per version: it pins the PublishedVersion the
// trainer already serialised for the weight store (shared, not copied; the
// store keeps its newest 4 anyway) and builds a model of a version only when
// a verified group needs it, caching it while the version is retained. So
// the extra memory is (retain - 4) serialised versions beyond the store's,
// plus one model per version that verified groups actually carry (with
// eta = 1, two).
//
// After a resume only the versions published since are held: groups with
// older tokens are unverifiable, not failed.
//
// Not thread-safe: the run's thread owns it.
class PolicyHistory {
 public:
  PolicyHistory(model::ModelConfig config, int retain) : config_(std::move(config)), retain_(retain) {}

  // Holds `version` (versions increase; a republished one replaces its
  // predecessor) and forgets what falls out of the window.
  void Add(std::shared_ptr<const PublishedVersion> version);

  // The weights of `version` as a model, built on first use; null when not
  // held (or when its bytes do not load, which a published version's do).
  std::shared_ptr<const model::Transformer> Get(int64_t version);

  // The newest version held (-1 when none).
  int64_t newest() const { return versions_.empty() ? -1 : versions_.back()->info.version(); }
  int retain() const { return retain_; }

 private:
  const model::ModelConfig config_;
  const int retain_;
  std::deque<std::shared_ptr<const PublishedVersion>> versions_;
  std::map<int64_t, std::shared_ptr<const model::Transformer>> models_;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_POLICY_HISTORY_H_
