// RolloutRun::Impl's weights: following the trainer's published versions,
// downloading and building each, and waiting for one.
#include "common/run/run_weight_sync.h"
#include "rollout_worker/rollout_run_impl.h"
#include "services/weights/weight_dtype.h"

namespace sluice::rollout_worker {

void RolloutRun::Impl::FollowWeights() {
  const bool deltas = run::ResolveWeightSync(spec_).delta;
  int64_t have = -1;
  while (!stopping()) {
    auto announced = deps_.trainer->WaitForVersionAfter(run_id_, have, absl::Milliseconds(500));
    if (!announced.ok()) {
      if (!absl::IsDeadlineExceeded(announced.status())) Pause(absl::Milliseconds(200));
      continue;
    }
    const absl::Time start = absl::Now();
    // Ask for the latest, not the announced one: a slow worker skips
    // versions rather than falling further behind.
    WeightTransfer transfer;
    auto fetched = Download(&transfer);
    if (!fetched.ok()) {
      log::Warning("weight download failed", {{"run_id", run_id_},
                                              {"error", std::string(fetched.status().message())}});
      Pause(absl::Milliseconds(200));
      continue;
    }
    const int64_t version = fetched->manifest.version().version();
    transfer.version = version;
    transfer.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (deps_.on_weights_transferred) deps_.on_weights_transferred(transfer);
    auto model = BuildModel(*fetched);
    if (!model.ok()) {
      // Sampling from it would fail (or train on garbage): keep the
      // version we have, and wait for the next one rather than fetching
      // this one again.
      log::Error("refused a weight version; generating on with the one held",
                 {{"run_id", run_id_},
                  {"version", version},
                  {"held_version", Latest().model ? Latest().version : -1},
                  {"error", std::string(model.status().message())}});
      {
        absl::MutexLock lock(&mu_);
        newest_refused_version_ = std::max(newest_refused_version_, version);
        status_.set_weight_versions_refused(status_.weight_versions_refused() + 1);
      }
      if (deps_.on_weights_refused) deps_.on_weights_refused(version);
      have = std::max(have, version);
      continue;
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    {
      absl::MutexLock lock(&mu_);
      latest_ = model::PolicySnapshot{std::move(*model), version};
      status_.set_weight_syncs(status_.weight_syncs() + 1);
      status_.set_last_weight_sync_ms(static_cast<int64_t>(seconds * 1000));
    }
    have = version;
    // The base of the next delta: the version as it came, whole and verified.
    if (deltas) held_weights_ = std::make_unique<clients::FetchedWeights>(std::move(*fetched));
    if (deps_.on_weights_loaded) deps_.on_weights_loaded(version, seconds);
  }
}

absl::StatusOr<clients::FetchedWeights> RolloutRun::Impl::Download(WeightTransfer* transfer) {
  if (weight_receiver_ == nullptr) {
    return absl::FailedPreconditionError("the rollout run has no trainer to receive weights from");
  }
  ASSIGN_OR_RETURN(weights::ReceivedWeights received,
                   weight_receiver_->ReceiveLatest(run_id_, held_weights_.get()));
  transfer->transport = std::move(received.transport);
  transfer->wire_bytes = received.wire_bytes;
  transfer->full_bytes = received.full_bytes;
  return std::move(received.weights);
}

absl::StatusOr<std::shared_ptr<const model::Transformer>> RolloutRun::Impl::BuildModel(
    const clients::FetchedWeights& fetched) {
  torch::NoGradGuard no_grad;
  std::vector<model::NamedTensor> tensors;
  // Widened copies of 16-bit tensors (a deque: views into them must stay put).
  std::deque<std::string> widened_bytes;
  for (int i = 0; i < fetched.manifest.tensors_size(); ++i) {
    const v1::TensorSpec& spec = fetched.manifest.tensors(i);
    // bf16 / f16 versions (weight_sync.dtype) widen to float32 here, exactly,
    // as the trainer's rollout verifier widens them; LoadWeights converts to
    // the compute dtype.
    const std::string* bytes = &fetched.tensor_bytes[i];
    if (spec.dtype() != v1::DTYPE_FLOAT32) {
      absl::StatusOr<std::string> widened =
          weights::BytesToFloat32(spec.dtype(), fetched.tensor_bytes[i]);
      if (!widened.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", spec.name(), ": ", widened.status().message()));
      }
      widened_bytes.push_back(*std::move(widened));
      bytes = &widened_bytes.back();
    }
    // Views over the received bytes: LoadWeights copies them once, into
    // the parameters (fetched outlives this function's use of them).
    ASSIGN_OR_RETURN(torch::Tensor t,
                     model::Float32TensorView(
                         std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), *bytes));
    if (!torch::isfinite(t).all().item<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", spec.name(), " holds ", (~torch::isfinite(t)).sum().item<int64_t>(),
          " non-finite values (NaN or infinity)"));
    }
    tensors.push_back({spec.name(), std::move(t)});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::Transformer> model,
                   model::Transformer::CreateUninitialized(config_, placement_));
  RETURN_IF_ERROR(model->LoadWeights(tensors));
  return std::shared_ptr<const model::Transformer>(std::move(model));
}

model::PolicySnapshot RolloutRun::Impl::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

bool RolloutRun::Impl::AwaitVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (latest_.model != nullptr && (latest_.version >= version ||
                                                      newest_refused_version_ >= version));
  };
  mu_.Await(absl::Condition(&ready));
  return !stopping_;
}

}  // namespace sluice::rollout_worker
