#include "common/run/run_objective.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace sluice::run {

void ResolveObjectiveDefaults(v1::AlgorithmConfig* algorithm, int64_t max_new_tokens,
                              int64_t max_context_tokens) {
  v1::AlgorithmConfig& a = *algorithm;
  if (a.objective() == v1::OBJECTIVE_UNSPECIFIED) a.set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  if (!a.has_max_staleness()) a.set_max_staleness(kDefaultMaxStaleness);
  if (a.clip_eps_low() == 0) a.set_clip_eps_low(kDefaultClipEps);
  if (a.clip_eps_high() == 0) a.set_clip_eps_high(a.clip_eps_low());
  if (a.behaviour_weight_cap() == 0) a.set_behaviour_weight_cap(kDefaultBehaviourWeightCap);
  if (a.behaviour_weight_mode() == v1::BEHAVIOUR_WEIGHT_MODE_UNSPECIFIED) {
    a.set_behaviour_weight_mode(v1::BEHAVIOUR_WEIGHT_MODE_TRUNCATE);
  }
  if (a.tb_beta() == 0) a.set_tb_beta(kDefaultTbBeta);
  if (!a.has_normalize_advantage_by_std()) a.set_normalize_advantage_by_std(true);
  if (a.advantage_eps() == 0) a.set_advantage_eps(kDefaultAdvantageEps);
  if (a.staleness_bound() == v1::STALENESS_BOUND_UNSPECIFIED) {
    a.set_staleness_bound(v1::STALENESS_BOUND_GROUP);
  }
  if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_UNSPECIFIED) {
    a.set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_RECOMPUTE);
  }
  if (a.loss_aggregation() == v1::LOSS_AGGREGATION_UNSPECIFIED) {
    a.set_loss_aggregation(v1::LOSS_AGGREGATION_TOKEN_MEAN);
  }
  if (a.loss_aggregation() == v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER &&
      a.loss_normalizer_tokens() == 0) {
    // Dr. GRPO's constant: the longest completion. A Hugging Face model's
    // context may be unknown (0): the trainer then takes its own.
    a.set_loss_normalizer_tokens(max_new_tokens > 0 ? max_new_tokens : max_context_tokens);
  }
  if (a.dynamic_sampling() == v1::DYNAMIC_SAMPLING_UNSPECIFIED) {
    // Groups with equal rewards carry no advantage, but trajectory balance
    // learns from them.
    a.set_dynamic_sampling(a.objective() == v1::OBJECTIVE_TRAJECTORY_BALANCE
                               ? v1::DYNAMIC_SAMPLING_KEEP
                               : v1::DYNAMIC_SAMPLING_DROP);
  }
}

int64_t ResolvedMaxStaleness(const v1::AlgorithmConfig& a) {
  return a.has_max_staleness() ? a.max_staleness() : kDefaultMaxStaleness;
}

void ValidateObjectiveChoices(const v1::AlgorithmConfig& a, std::vector<std::string>* problems) {
  const auto add = [problems](absl::string_view path, const auto&... args) {
    problems->push_back(absl::StrCat(path, ": ", args...));
  };

  const bool decoupled = a.objective() == v1::OBJECTIVE_DECOUPLED_PPO;
  const bool trajectory_balance = a.objective() == v1::OBJECTIVE_TRAJECTORY_BALANCE;
  const std::string objective = v1::Objective_Name(a.objective());
  if (!v1::ProximalLogprobsMethod_IsValid(a.proximal_logprobs()) ||
      a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_UNSPECIFIED) {
    add("algorithm.proximal_logprobs",
        "must be PROXIMAL_LOGPROBS_METHOD_RECOMPUTE or _LOGLINEAR, got ",
        static_cast<int>(a.proximal_logprobs()));
  } else if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR && !decoupled) {
    add("algorithm.proximal_logprobs",
        "PROXIMAL_LOGPROBS_METHOD_LOGLINEAR approximates decoupled PPO's proximal policy; ",
        objective, " has none (use OBJECTIVE_DECOUPLED_PPO)");
  }
  if (a.truncated_importance_sampling()) {
    if (!decoupled) {
      add("algorithm.truncated_importance_sampling",
          "replaces decoupled PPO's proximal policy; only with OBJECTIVE_DECOUPLED_PPO, "
          "got ",
          objective);
    } else if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR) {
      add("algorithm.truncated_importance_sampling",
          "takes the current weights as the proximal policy, so proximal_logprobs "
          "LOGLINEAR would be ignored; choose one");
    }
  }
  const double cap = a.behaviour_weight_cap();
  if (!(a.behaviour_weight_floor() >= 0) || std::isinf(a.behaviour_weight_floor())) {
    add("algorithm.behaviour_weight_floor", "must be >= 0 (0 = none), got ",
        a.behaviour_weight_floor());
  } else if (a.behaviour_weight_floor() > 0) {
    if (cap > 0 && a.behaviour_weight_floor() >= cap) {
      add("algorithm.behaviour_weight_floor", "must be < behaviour_weight_cap (", cap, "), got ",
          a.behaviour_weight_floor());
    } else if (a.behaviour_weight_mode() == v1::BEHAVIOUR_WEIGHT_MODE_NONE) {
      add("algorithm.behaviour_weight_floor",
          "bounds the behaviour weight, which BEHAVIOUR_WEIGHT_MODE_NONE leaves "
          "unbounded; use _MASK (IcePop) or _TRUNCATE, or a floor of 0");
    } else if (!decoupled) {
      add("algorithm.behaviour_weight_floor", "bounds decoupled PPO's behaviour weight; ",
          objective, " has none (w = 1), use OBJECTIVE_DECOUPLED_PPO");
    }
  }
  if (!(a.second_moment_threshold() >= 0 && a.second_moment_threshold() <= kMaxCoefficient)) {
    add("algorithm.second_moment_threshold", "must be in [0, ", kMaxCoefficient,
        "] (0 = off; M2PO uses 0.04), got ", a.second_moment_threshold());
  } else if (a.second_moment_threshold() > 0 && !decoupled) {
    add("algorithm.second_moment_threshold", "masks by decoupled PPO's behaviour weight; ",
        objective, " has none (w = 1), use OBJECTIVE_DECOUPLED_PPO");
  }
  if (!v1::LossAggregation_IsValid(a.loss_aggregation()) ||
      a.loss_aggregation() == v1::LOSS_AGGREGATION_UNSPECIFIED) {
    add("algorithm.loss_aggregation",
        "must be LOSS_AGGREGATION_TOKEN_MEAN, _SEQUENCE_MEAN or _CONSTANT_NORMALIZER, got ",
        static_cast<int>(a.loss_aggregation()));
  } else if (trajectory_balance && a.loss_aggregation() != v1::LOSS_AGGREGATION_TOKEN_MEAN) {
    add("algorithm.loss_aggregation",
        "trajectory balance's loss is a mean over sequences already; only the default "
        "LOSS_AGGREGATION_TOKEN_MEAN, got ",
        v1::LossAggregation_Name(a.loss_aggregation()));
  }
  if (a.loss_normalizer_tokens() < 0) {
    add("algorithm.loss_normalizer_tokens",
        "must be >= 0 (0 = rollout.sampling.max_new_tokens), got ", a.loss_normalizer_tokens());
  }
  if (a.loss_normalizer_tokens() > kMaxNormalizerTokens) {
    add("algorithm.loss_normalizer_tokens", "must be <= ", kMaxNormalizerTokens, ", got ",
        a.loss_normalizer_tokens());
  }
  if (!v1::DynamicSampling_IsValid(a.dynamic_sampling()) ||
      a.dynamic_sampling() == v1::DYNAMIC_SAMPLING_UNSPECIFIED) {
    add("algorithm.dynamic_sampling", "must be DYNAMIC_SAMPLING_KEEP, _DROP or _REFILL, got ",
        static_cast<int>(a.dynamic_sampling()));
  }
  if (!(a.entropy_coef() >= 0 && a.entropy_coef() <= kMaxCoefficient)) {
    add("algorithm.entropy_coef", "must be in [0, ", kMaxCoefficient, "], got ", a.entropy_coef());
  } else if (trajectory_balance && a.entropy_coef() > 0) {
    add("algorithm.entropy_coef",
        "is a term of the GRPO and decoupled-PPO losses, not of trajectory balance");
  }
  if (trajectory_balance && a.kl_coef() > 0) {
    add("algorithm.kl_coef",
        "is a term of the GRPO and decoupled-PPO losses; trajectory balance takes its "
        "reference inside the residual: set tb_use_reference (and tb_beta) instead");
  }
  if (a.tb_use_reference() && !trajectory_balance) {
    add("algorithm.tb_use_reference",
        "is trajectory balance's (OBJECTIVE_TRAJECTORY_BALANCE); for a KL to the "
        "reference with ",
        objective, " set kl_coef");
  }
  if (!v1::StalenessBound_IsValid(a.staleness_bound()) ||
      a.staleness_bound() == v1::STALENESS_BOUND_UNSPECIFIED) {
    add("algorithm.staleness_bound", "must be STALENESS_BOUND_GROUP or _TOKEN, got ",
        static_cast<int>(a.staleness_bound()));
  } else if (a.staleness_bound() == v1::STALENESS_BOUND_TOKEN && trajectory_balance) {
    add("algorithm.staleness_bound",
        "STALENESS_BOUND_TOKEN drops single tokens from the loss; trajectory balance's "
        "loss is over whole sequences (use STALENESS_BOUND_GROUP)");
  }
}

}  // namespace sluice::run
