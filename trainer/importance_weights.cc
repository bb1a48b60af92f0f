#include "trainer/importance_weights.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace sluice::trainer {
namespace {

// The values of `values` at the positions where `mask` is set, as doubles,
// with those positions' flat indices.
void MaskedValues(const torch::Tensor& values, const torch::Tensor& mask,
                  std::vector<double>* out, std::vector<int64_t>* positions) {
  // Read on the host: one copy from a GPU, none on the CPU.
  const torch::Tensor v =
      values.detach().to(torch::kCPU, torch::kFloat64).contiguous().reshape({-1});
  const torch::Tensor m = mask.detach().to(torch::kCPU, torch::kFloat64).contiguous().reshape({-1});
  const double* vp = v.data_ptr<double>();
  const double* mp = m.data_ptr<double>();
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (mp[i] == 0) continue;
    out->push_back(vp[i]);
    if (positions != nullptr) positions->push_back(i);
  }
}

// numpy.quantile's default ("linear"): position q (n - 1) between order
// statistics. `sorted` is ascending and not empty.
double Quantile(const std::vector<double>& sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return sorted[below] + fraction * (sorted[above] - sorted[below]);
}

double Fraction(const torch::Tensor& selected, const torch::Tensor& mask, double tokens) {
  return (selected.to(torch::kFloat32) * mask).sum().item<double>() / tokens;
}

}  // namespace

torch::Tensor LogLinearProximalLogProbs(const torch::Tensor& logp_current,
                                        const torch::Tensor& logp_behaviour,
                                        const torch::Tensor& token_versions,
                                        int64_t proximal_version, int64_t current_version) {
  const torch::Tensor current = logp_current.detach();
  const torch::Tensor behaviour = logp_behaviour.detach();
  const torch::Tensor versions = token_versions.to(torch::kFloat64);
  const torch::Tensor span = static_cast<double>(current_version) - versions;
  const torch::Tensor done = static_cast<double>(proximal_version) - versions;
  // alpha = 1 where the token's version is the current one (0 / 0).
  const torch::Tensor alpha =
      torch::where(span > 0, done / span.clamp_min(1.0), torch::ones_like(span))
          .to(current.scalar_type());
  return behaviour + alpha * (current - behaviour);
}

torch::Tensor SecondMomentKeepMask(const torch::Tensor& log_weight, const torch::Tensor& mask,
                                   double threshold) {
  const torch::Tensor mask_f = mask.detach().to(torch::kFloat32);
  if (threshold <= 0) return mask_f.clone();
  std::vector<double> log_w;
  std::vector<int64_t> positions;
  MaskedValues(log_weight, mask_f, &log_w, &positions);
  std::vector<double> second_moment(log_w.size());
  for (size_t i = 0; i < log_w.size(); ++i) second_moment[i] = log_w[i] * log_w[i];
  double total = std::accumulate(second_moment.begin(), second_moment.end(), 0.0);
  if (second_moment.empty() || total <= threshold * static_cast<double>(second_moment.size())) {
    return mask_f.clone();
  }
  // Smallest first; equal values in position order.
  std::vector<size_t> order(second_moment.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return second_moment[a] < second_moment[b]; });
  // The prefix means of an ascending sequence never decrease: the kept
  // tokens are the longest prefix whose mean is within the threshold.
  size_t kept = 0;
  double sum = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    sum += second_moment[order[k]];
    if (sum > threshold * static_cast<double>(k + 1)) break;
    kept = k + 1;
  }
  torch::Tensor keep = torch::zeros({mask_f.numel()}, torch::kFloat32);
  float* kp = keep.data_ptr<float>();
  for (size_t k = 0; k < kept; ++k) kp[positions[order[k]]] = 1.0f;
  return keep.reshape(mask_f.sizes()).to(mask_f.device());
}

CorrectedWeights CorrectBehaviourWeights(const torch::Tensor& log_weight, const torch::Tensor& mask,
                                         const WeightCorrectionOptions& options) {
  torch::NoGradGuard no_grad;
  CorrectedWeights out;
  const torch::Tensor mask_f = mask.to(torch::kFloat32);
  const double tokens = std::max(1.0, mask_f.sum().item<double>());
  const torch::Tensor log_w = log_weight.detach();
  torch::Tensor weight = torch::exp(log_w);
  torch::Tensor keep = mask_f.clone();

  const torch::Tensor above = weight > options.cap;
  out.above_cap_fraction = Fraction(above, mask_f, tokens);
  switch (options.mode) {
    case WeightCapMode::kTruncate:
      weight = torch::clamp_max(weight, options.cap);
      break;
    case WeightCapMode::kMask:
      out.masked_above_cap_fraction = out.above_cap_fraction;
      keep = keep * (~above).to(torch::kFloat32);
      break;
    case WeightCapMode::kNone:
      break;
  }
  if (options.floor > 0) {
    const torch::Tensor below = torch::exp(log_w) < options.floor;
    out.masked_below_floor_fraction = Fraction(below, mask_f, tokens);
    keep = keep * (~below).to(torch::kFloat32);
  }
  if (options.second_moment_threshold > 0) {
    const torch::Tensor kept = SecondMomentKeepMask(log_w, keep, options.second_moment_threshold);
    out.masked_second_moment_fraction = (keep - kept).sum().item<double>() / tokens;
    keep = kept;
  }
  out.weight = weight;
  out.keep = keep;
  return out;
}

ImportanceWeightStats SummarizeImportanceWeights(const torch::Tensor& weight,
                                                 const torch::Tensor& mask) {
  ImportanceWeightStats stats;
  std::vector<double> w;
  MaskedValues(weight, mask, &w, nullptr);
  if (w.empty()) return stats;
  stats.tokens = static_cast<int64_t>(w.size());
  double sum = 0;
  double sum_squares = 0;
  int64_t above = 0;
  int64_t below = 0;
  for (double x : w) {
    sum += x;
    sum_squares += x * x;
    above += x > 2.0 ? 1 : 0;
    below += x < 0.5 ? 1 : 0;
  }
  const double n = static_cast<double>(w.size());
  stats.effective_sample_size = sum_squares > 0 ? sum * sum / (n * sum_squares) : 1.0;
  stats.fraction_above_2 = static_cast<double>(above) / n;
  stats.fraction_below_half = static_cast<double>(below) / n;
  std::sort(w.begin(), w.end());
  stats.min = w.front();
  stats.max = w.back();
  stats.p99 = Quantile(w, 0.99);
  stats.p01 = Quantile(w, 0.01);
  return stats;
}

}  // namespace sluice::trainer
