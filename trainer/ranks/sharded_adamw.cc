#include "trainer/ranks/sharded_adamw.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/safetensors.h"
#include "common/status_macros.h"
#include "trainer/ranks/trainer_group.h"

namespace sluice::trainer::ranks {
namespace {

// Elements [begin, end) of `tensors` flattened one after another, into
// `out` (at least end - begin elements).
void CopySlice(const std::vector<at::Tensor>& tensors, int64_t begin, int64_t end,
               const torch::Tensor& out) {
  int64_t offset = 0;
  for (const torch::Tensor& t : tensors) {
    const int64_t n = t.numel();
    const int64_t from = std::max(offset, begin);
    const int64_t to = std::min(offset + n, end);
    if (from < to) {
      out.narrow(0, from - begin, to - from)
          .copy_(t.detach().reshape({-1}).narrow(0, from - offset, to - from));
    }
    offset += n;
  }
}

}  // namespace

// Parameters whose gradients are summed as one flat tensor.
struct ShardedAdamW::Bucket {
  torch::Tensor flat;
  std::vector<size_t> params;                     // Indices into params_.
  std::vector<int64_t> offsets;                   // Of each in flat.
  size_t pending = 0;                             // Gradients of this backward not yet in flat.
  std::unique_ptr<TrainerGroup::PendingSum> sum;  // Set once launched.
};

// This rank's slice: its float32 master copy and AdamW's moments, padded to
// shard_size_ so that every rank's slice has the same size (all-gather).
struct ShardedAdamW::State {
  torch::Tensor master;
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
  torch::Tensor gathered;                        // world_size * shard_size_: every rank's slice.
  std::vector<Bucket> buckets;                   // In launch order: the last parameters first.
  std::vector<std::pair<size_t, size_t>> place;  // Per parameter: bucket, slot.
  std::vector<Bucket*> launched;                 // In the order launched (bucket order).
  size_t next_launch = 0;                        // The first bucket not launched.
  absl::Time first_launch;
};

ShardedAdamW::ShardedAdamW(std::vector<at::Tensor> params, ShardedAdamWOptions options,
                           TrainerGroup& group)
    : params_(std::move(params)), options_(options), group_(group), state_(new State) {
  for (const torch::Tensor& p : params_) total_ += p.numel();
  const int64_t world = group_.world_size();
  shard_size_ = (total_ + world - 1) / world;
  shard_begin_ = std::min(total_, shard_size_ * group_.rank());
  shard_end_ = std::min(total_, shard_begin_ + shard_size_);
  torch::NoGradGuard no_grad;
  state_->master = torch::zeros({shard_size_}, torch::kFloat32);
  CopySlice(params_, shard_begin_, shard_end_, state_->master);
  state_->exp_avg = torch::zeros_like(state_->master);
  state_->exp_avg_sq = torch::zeros_like(state_->master);
  state_->gathered = torch::zeros({shard_size_ * world}, torch::kFloat32);

  // Buckets in reverse parameter order (backward reaches the last layers
  // first), each at most bucket_bytes but at least one parameter.
  state_->place.resize(params_.size());
  std::vector<int64_t> sizes;  // Elements per bucket.
  for (size_t i = params_.size(); i-- > 0;) {
    const int64_t n = params_[i].numel();
    if (sizes.empty() ||
        (sizes.back() + n) * static_cast<int64_t>(sizeof(float)) > options_.bucket_bytes) {
      state_->buckets.emplace_back();
      sizes.push_back(0);
    }
    Bucket& bucket = state_->buckets.back();
    state_->place[i] = {state_->buckets.size() - 1, bucket.params.size()};
    bucket.params.push_back(i);
    bucket.offsets.push_back(sizes.back());
    sizes.back() += n;
  }
  for (size_t b = 0; b < sizes.size(); ++b) {
    state_->buckets[b].flat = torch::zeros({sizes[b]}, torch::kFloat32);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(
        params_[i].register_hook([this, i](const at::Tensor& grad) { OnGradient(i, grad); }));
  }
}

ShardedAdamW::~ShardedAdamW() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(hooks_[i]);
  // A reduction still running writes into the buckets: let it end.
  for (Bucket* bucket : state_->launched) bucket->sum.reset();
}

void ShardedAdamW::ReduceDuringNextBackward() {
  for (Bucket* bucket : state_->launched) bucket->sum.reset();
  state_->launched.clear();
  state_->next_launch = 0;
  for (Bucket& bucket : state_->buckets) bucket.pending = bucket.params.size();
  armed_ = true;
}

void ShardedAdamW::OnGradient(size_t index, const at::Tensor& grad) {
  if (!armed_) return;
  torch::NoGradGuard no_grad;
  const auto [b, slot] = state_->place[index];
  Bucket& bucket = state_->buckets[b];
  if (bucket.sum != nullptr) return;  // Launched already (a second backward).
  const torch::Tensor& param = params_[index];
  torch::Tensor target = bucket.flat.narrow(0, bucket.offsets[slot], param.numel());
  // Earlier micro-batches' gradients are in param.grad(); this pass's is
  // added to them after this hook.
  if (param.grad().defined()) {
    torch::add_out(target, param.grad().reshape({-1}), grad.reshape({-1}));
  } else {
    target.copy_(grad.reshape({-1}));
  }
  --bucket.pending;
  // Buckets are launched in bucket order, each once all before it are: the
  // engine may hand two ready gradients to the hooks in either order, and
  // every rank must start its sums in the same one. (A failed launch shows
  // again when Step() finds the bucket not launched.)
  while (state_->next_launch < state_->buckets.size() &&
         state_->buckets[state_->next_launch].pending == 0) {
    if (!LaunchBucket(state_->buckets[state_->next_launch]).ok()) return;
  }
}

absl::Status ShardedAdamW::LaunchBucket(Bucket& bucket) {
  if (state_->launched.empty()) state_->first_launch = absl::Now();
  ASSIGN_OR_RETURN(bucket.sum, group_.StartAllReduceSum(bucket.flat));
  state_->launched.push_back(&bucket);
  ++state_->next_launch;
  return absl::OkStatus();
}

absl::Status ShardedAdamW::FinishReduction(const std::vector<at::Tensor>& grads) {
  const absl::Time backward_done = absl::Now();
  // The buckets not launched during backward (all of them when it was not
  // armed; else from a parameter without a gradient this pass on), in
  // bucket order.
  for (size_t b = state_->next_launch; b < state_->buckets.size(); ++b) {
    Bucket& bucket = state_->buckets[b];
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      bucket.flat.narrow(0, bucket.offsets[slot], grads[bucket.params[slot]].numel())
          .copy_(grads[bucket.params[slot]].reshape({-1}));
    }
    RETURN_IF_ERROR(LaunchBucket(bucket));
  }
  for (Bucket* bucket : state_->launched) {
    RETURN_IF_ERROR(bucket->sum->Wait());
    for (size_t slot = 0; slot < bucket->params.size(); ++slot) {
      const at::Tensor& grad = grads[bucket->params[slot]];
      grad.copy_(bucket->flat.narrow(0, bucket->offsets[slot], grad.numel()).view_as(grad));
    }
  }
  const absl::Time done = absl::Now();
  const double window = absl::ToDoubleSeconds(done - state_->first_launch);
  timings_.reduce_seconds = absl::ToDoubleSeconds(done - backward_done);
  timings_.reduce_window_seconds = window;
  timings_.overlap_fraction = window > 0 ? std::max(0.0, 1 - timings_.reduce_seconds / window) : 0;
  for (Bucket* bucket : state_->launched) bucket->sum.reset();
  state_->launched.clear();
  state_->next_launch = 0;
  armed_ = false;
  return absl::OkStatus();
}

void ShardedAdamW::ZeroGrad() {
  for (torch::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

int64_t ShardedAdamW::state_bytes() const {
  return 3 * shard_size_ * static_cast<int64_t>(sizeof(float));
}

absl::Status ShardedAdamW::Step(double* grad_norm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (torch::Tensor& p : params_) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  timings_ = ShardedStepTimings();
  RETURN_IF_ERROR(FinishReduction(grads));
  timings_.reduced_bytes = total_ * static_cast<int64_t>(sizeof(float));
  absl::Time start = absl::Now();

  // This rank's slice of the summed gradient; the global norm from every
  // rank's slice (one scalar summed over the ranks), not from a pass over
  // every gradient on every rank.
  torch::Tensor grad = torch::zeros({shard_size_}, torch::kFloat32);
  CopySlice(grads, shard_begin_, shard_end_, grad);
  torch::Tensor norm_squared = torch::full({1}, grad.dot(grad).item<double>(), torch::kFloat64);
  RETURN_IF_ERROR(group_.AllReduceSum({norm_squared}));
  const double norm = std::sqrt(norm_squared.item<double>());
  if (grad_norm != nullptr) *grad_norm = norm;
  const double scale = options_.max_grad_norm > 0 && norm > options_.max_grad_norm
                           ? options_.max_grad_norm / (norm + 1e-6)
                           : 1.0;
  if (scale != 1.0) grad.mul_(scale);

  // AdamW (decoupled weight decay), as torch::optim::AdamW without amsgrad.
  ++steps_;
  torch::Tensor& p = state_->master;
  p.mul_(1 - options_.lr * options_.weight_decay);
  state_->exp_avg.mul_(options_.beta1).add_(grad, 1 - options_.beta1);
  state_->exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
  const double bias1 = 1 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bias2 = 1 - std::pow(options_.beta2, static_cast<double>(steps_));
  const torch::Tensor denom = (state_->exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(options_.eps);
  p.addcdiv_(state_->exp_avg, denom, -options_.lr / bias1);

  timings_.update_seconds = absl::ToDoubleSeconds(absl::Now() - start);

  // Every rank's updated slice into every rank's parameters.
  start = absl::Now();
  RETURN_IF_ERROR(group_.AllGather(state_->master, state_->gathered));
  int64_t offset = 0;
  for (torch::Tensor& param : params_) {
    const int64_t n = param.numel();
    param.detach().copy_(state_->gathered.narrow(0, offset, n).view_as(param));
    offset += n;
  }
  timings_.gather_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  timings_.gathered_bytes = state_->gathered.numel() * static_cast<int64_t>(sizeof(float));
  return absl::OkStatus();
}

namespace {

constexpr const char* kStateNames[] = {"master", "exp_avg", "exp_avg_sq"};

std::string ShardFileName(int rank, int world) {
  return absl::StrCat("optimizer-rank-", rank, "-of-", world, ".safetensors");
}

absl::string_view Bytes(const torch::Tensor& t) {
  return absl::string_view(static_cast<const char*>(t.data_ptr()),
                           static_cast<size_t>(t.numel()) * sizeof(float));
}

}  // namespace

absl::Status ShardedAdamW::SaveShard(const std::string& dir) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const int64_t n = shard_end_ - shard_begin_;
  const torch::Tensor pieces[] = {state_->master.narrow(0, 0, n).contiguous(),
                                  state_->exp_avg.narrow(0, 0, n).contiguous(),
                                  state_->exp_avg_sq.narrow(0, 0, n).contiguous()};
  std::vector<sluice::model::TensorToWrite> tensors;
  for (int i = 0; i < 3; ++i) {
    tensors.push_back({kStateNames[i], sluice::model::DType::kF32, {n}, Bytes(pieces[i])});
  }
  const std::map<std::string, std::string> metadata = {
      {"world_size", absl::StrCat(group_.world_size())},
      {"rank", absl::StrCat(group_.rank())},
      {"parameters", absl::StrCat(total_)},
      {"shard_begin", absl::StrCat(shard_begin_)},
      {"shard_end", absl::StrCat(shard_end_)},
      {"steps", absl::StrCat(steps_)}};
  return sluice::model::WriteSafetensors(
      (std::filesystem::path(dir) / ShardFileName(group_.rank(), group_.world_size())).string(),
      tensors, metadata);
}

absl::Status ShardedAdamW::LoadShards(const std::string& dir) {
  // The checkpoint's world size, from its file names.
  const std::regex pattern(R"(optimizer-rank-(\d+)-of-(\d+)\.safetensors)");
  std::set<int> world_sizes;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern)) world_sizes.insert(std::stoi(match[2].str()));
  }
  if (error || world_sizes.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no optimizer shards (optimizer-rank-R-of-N.safetensors) in ", dir,
                     error ? absl::StrCat(": ", error.message()) : ""));
  }
  if (world_sizes.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " holds optimizer shards of ", *world_sizes.begin(), " and of ",
                     *world_sizes.rbegin(), " ranks: one checkpoint per directory"));
  }
  const int old_world = *world_sizes.begin();
  torch::NoGradGuard no_grad;
  int64_t steps = -1;
  for (int old_rank = 0; old_rank < old_world; ++old_rank) {
    const std::string path =
        (std::filesystem::path(dir) / ShardFileName(old_rank, old_world)).string();
    auto file = sluice::model::SafetensorsFile::Open(path);
    if (!file.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the optimizer checkpoint of ", old_world,
                                                        " ranks in ", dir, " lacks rank ", old_rank,
                                                        "'s shard: ", file.status().message()));
    }
    const std::map<std::string, std::string>& meta = (*file)->metadata();
    int64_t parameters = 0, begin = 0, end = 0, file_steps = 0;
    const auto number = [&meta](const char* key, int64_t* out) {
      auto it = meta.find(key);
      return it != meta.end() && absl::SimpleAtoi(it->second, out);
    };
    if (!number("parameters", &parameters) || !number("shard_begin", &begin) ||
        !number("shard_end", &end) || !number("steps", &file_steps) || begin < 0 || end < begin) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is not an optimizer shard of a trainer group (its metadata)"));
    }
    if (parameters != total_) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " holds the optimizer state of a model of ", parameters,
                       " parameters; this model has ", total_));
    }
    if (steps >= 0 && file_steps != steps) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is at step ", file_steps, ", the checkpoint's other shards at ", steps));
    }
    steps = file_steps;
    const int64_t from = std::max(begin, shard_begin_);
    const int64_t to = std::min(end, shard_end_);
    if (from >= to) continue;
    torch::Tensor* targets[] = {&state_->master, &state_->exp_avg, &state_->exp_avg_sq};
    for (int i = 0; i < 3; ++i) {
      const sluice::model::TensorView* view = (*file)->Find(kStateNames[i]);
      if (view == nullptr || view->dtype != sluice::model::DType::kF32 ||
          view->num_elements() != end - begin) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": its ", kStateNames[i], " is missing or not ", end - begin, " float32 values"));
      }
      // The view is not aligned in general: copy bytes.
      std::memcpy(static_cast<char*>(targets[i]->data_ptr()) +
                      (from - shard_begin_) * static_cast<int64_t>(sizeof(float)),
                  view->data.data() + (from - begin) * static_cast<int64_t>(sizeof(float)),
                  static_cast<size_t>(to - from) * sizeof(float));
    }
  }
  steps_ = steps;
  return absl::OkStatus();
}

}  // namespace sluice::trainer::ranks
