#include "trainer/ranks/sharded_adamw.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

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

// This rank's slice: its float32 master copy and AdamW's moments, padded to
// shard_size_ so that every rank's slice has the same size (all-gather).
struct ShardedAdamW::State {
  torch::Tensor master;
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
  torch::Tensor gathered;  // world_size * shard_size_: every rank's slice.
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
}

ShardedAdamW::~ShardedAdamW() = default;

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
  RETURN_IF_ERROR(group_.AllReduceSum(grads, options_.bucket_bytes));

  // Every rank holds the summed gradients: each computes the same norm.
  double norm_squared = 0;
  for (const torch::Tensor& g : grads) norm_squared += g.pow(2).sum().item<double>();
  const double norm = std::sqrt(norm_squared);
  if (grad_norm != nullptr) *grad_norm = norm;
  const double scale = options_.max_grad_norm > 0 && norm > options_.max_grad_norm
                           ? options_.max_grad_norm / (norm + 1e-6)
                           : 1.0;

  // This rank's slice of the gradient.
  torch::Tensor grad = torch::zeros({shard_size_}, torch::kFloat32);
  CopySlice(grads, shard_begin_, shard_end_, grad);
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

  // Every rank's updated slice into every rank's parameters.
  RETURN_IF_ERROR(group_.AllGather(state_->master, state_->gathered));
  int64_t offset = 0;
  for (torch::Tensor& param : params_) {
    const int64_t n = param.numel();
    param.detach().copy_(state_->gathered.narrow(0, offset, n).view_as(param));
    offset += n;
  }
  return absl::OkStatus();
}

}  // namespace sluice::trainer::ranks
