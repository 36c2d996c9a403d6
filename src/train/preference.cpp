#include "train/preference.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "data/rows.h"
#include "model/loss.h"
#include "parallel/collectives.h"
#include "parallel/fsdp.h"
#include "train/memory.h"

namespace ptrain {

namespace {

// Rows [2P, T] (the chosen first) -> each row's summed per-token log-probabilities [2P] and its
// scored tokens. With LD-DPO's ld_alpha < 1 a row's tokens past the shorter completion of its
// pair count ld_alpha times (DPOTrainer's shared and tail masks); `plain` is the sum without
// that weighting (the sft loss reads it).
struct RowSums {
  at::Tensor logps, plain, tokens;
};
RowSums row_sums(const at::Tensor& token_logps, const at::Tensor& targets, double ld_alpha) {
  const at::Tensor t = targets.reshape({targets.size(0), -1});
  const at::Tensor per_token = token_logps.reshape(t.sizes()), scored = t.ne(kIgnoreIndex);
  RowSums r{per_token.sum(1), {}, scored.sum(1).to(at::kFloat)};
  r.plain = r.logps;
  if (ld_alpha != 1.0) {
    const int64_t P = t.size(0) / 2;
    const at::Tensor shared = at::minimum(r.tokens.slice(0, 0, P), r.tokens.slice(0, P)).repeat({2}).unsqueeze(1);
    const at::Tensor position = scored.cumsum(1).to(at::kFloat);  // 1, 2, ... along each completion
    const at::Tensor weight = at::where(position.le(shared), 1.0, ld_alpha).mul_(scored);
    r.logps = (per_token * weight).sum(1);
  }
  return r;
}

// ORPO's NLL targets (ORPOTrainer's labels): every next token of each row, the prompt's too —
// the inputs one along before the row's first scored position, the targets from there.
at::Tensor whole_row_targets(const Batch& b) {
  const at::Tensor scored = b.targets.ne(kIgnoreIndex);
  const at::Tensor first = scored.to(at::kFloat).argmax(1, /*keepdim=*/true);  // the first scored position
  const at::Tensor position = at::arange(b.targets.size(1), b.targets.options()).unsqueeze(0);
  const at::Tensor next = at::cat({b.inputs.slice(1, 1), at::full_like(b.inputs.slice(1, 0, 1), kIgnoreIndex)}, 1);
  return at::where(position.lt(first), next, b.targets);
}

// The targets the chosen rows' NLL is a mean over.
at::Tensor nll_targets(const Batch& b, Objective objective) {
  return objective == Objective::orpo ? whole_row_targets(b) : b.targets;
}

// Whether the loss holds a negative log-likelihood of the chosen sequences (DPO's sft, CPO's and
// SimPO's cpo_alpha, ORPO's), a mean over the step's tokens that needs their count first.
bool has_nll(const PreferenceObjective& o) {
  switch (o.objective) {
    case Objective::dpo:
      return o.options.reads(PreferenceLoss::sft);
    case Objective::simpo:
    case Objective::cpo:
      return o.options.cpo_alpha != 0.0;
    case Objective::orpo:
      return true;
    case Objective::sft:
    case Objective::kto:
      break;
  }
  return false;
}

// The tokens the NLL of a batch of pairs is a mean over (rows [0, P) of its NLL targets).
int64_t chosen_tokens(const Batch& b, Objective objective) {
  const at::Tensor t = nll_targets(b, objective);
  return t.slice(0, 0, t.size(0) / 2).ne(kIgnoreIndex).sum().item<int64_t>();
}

// Sums of the metrics over this batch's pairs, float64: the loss, rewards, accuracy, margins and
// logps; the sft loss's sum and the chosen tokens the NLL is a mean over; the NLL itself; ORPO's
// log-sigmoid of the log odds and the log odds; DPO's token sums over the completions (`targets`
// [2P, T]): entropy and tokens of both sides, mean logits and tokens of each, the chosen tokens the
// policy ranks first.
enum MetricSum : int64_t {
  kLoss,
  kRewardsChosen,
  kRewardsRejected,
  kAccuracies,
  kMargins,
  kLogpsChosen,
  kLogpsRejected,
  kSftSum,
  kNllTokens,
  kNll,
  kLogOddsRatio,
  kLogOdds,
  kEntropy,
  kCompletionTokens,
  kLogitsChosen,
  kChosenTokens,
  kLogitsRejected,
  kRejectedTokens,
  kTop1Chosen,
  kMetrics
};
at::Tensor metric_sums(const PairLosses& l, const PairScores& s, const at::Tensor& targets) {
  at::NoGradGuard no_grad;
  const at::Tensor rc = l.rewards_chosen.to(at::kDouble), rr = l.rewards_rejected.to(at::kDouble);
  const auto sum = [](const at::Tensor& x) { return x.detach().to(at::kDouble).sum(); };
  std::vector<at::Tensor> v(kMetrics, at::zeros({}, rc.options()));
  v[kLoss] = sum(l.loss);
  v[kRewardsChosen] = rc.sum();
  v[kRewardsRejected] = rr.sum();
  v[kAccuracies] = rc.gt(rr).to(at::kDouble).sum();
  v[kMargins] = (rc - rr).sum();
  v[kLogpsChosen] = sum(s.chosen);
  v[kLogpsRejected] = sum(s.rejected);
  if (l.sft_sum.defined()) v[kSftSum] = sum(l.sft_sum);
  v[kNllTokens] = sum(s.nll_tokens);
  v[kNll] = -sum(s.chosen_plain);
  if (l.log_odds.defined()) {
    v[kLogOddsRatio] = sum(at::log_sigmoid(l.log_odds));
    v[kLogOdds] = sum(l.log_odds);
  }
  if (s.stats.defined()) {  // masked by where: a masked position's statistics never reach a sum
    const int64_t P = targets.size(0) / 2;
    const at::Tensor scored = targets.ne(kIgnoreIndex);
    const at::Tensor stats = s.stats.reshape({targets.size(0), targets.size(1), TokenStat::count}).to(at::kDouble);
    const auto masked = [&](int64_t column, int64_t begin, int64_t end) {
      return at::where(scored.slice(0, begin, end), stats.select(2, column).slice(0, begin, end), 0.0).sum();
    };
    v[kEntropy] = masked(TokenStat::entropy, 0, 2 * P);
    v[kCompletionTokens] = scored.sum().to(at::kDouble);
    v[kLogitsChosen] = masked(TokenStat::mean_logit, 0, P);
    v[kChosenTokens] = scored.slice(0, 0, P).sum().to(at::kDouble);
    v[kLogitsRejected] = masked(TokenStat::mean_logit, P, 2 * P);
    v[kRejectedTokens] = scored.slice(0, P).sum().to(at::kDouble);
    v[kTop1Chosen] = masked(TokenStat::is_top1, 0, P);
  }
  return at::stack(v);
}

// The metrics of `pairs` pairs from their sums: means over the pairs; the loss the pairs' mean
// plus the sft loss's token mean; the token metrics means over their tokens.
PreferenceMetrics metrics_of(const at::Tensor& sums, int64_t pairs, const PreferenceObjective& objective) {
  const at::Tensor m = sums.to(at::kCPU);
  const double* v = m.data_ptr<double>();
  const double n = static_cast<double>(std::max<int64_t>(pairs, 1));
  const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };  // TRL's 0 for no tokens
  PreferenceMetrics r{pairs,
                      v[kLoss] / n + ratio(v[kSftSum], v[kNllTokens]),
                      v[kRewardsChosen] / n,
                      v[kRewardsRejected] / n,
                      v[kAccuracies] / n,
                      v[kMargins] / n,
                      v[kLogpsChosen] / n,
                      v[kLogpsRejected] / n,
                      {}};
  if (objective.objective == Objective::dpo)
    r.more = {{"entropy", ratio(v[kEntropy], v[kCompletionTokens])},
              {"logits/chosen", ratio(v[kLogitsChosen], v[kChosenTokens])},
              {"logits/rejected", ratio(v[kLogitsRejected], v[kRejectedTokens])},
              {"mean_token_accuracy", ratio(v[kTop1Chosen], v[kChosenTokens])}};
  else if (has_nll(objective))
    r.more = {{"nll_loss", ratio(v[kNll], v[kNllTokens])}};
  if (objective.objective == Objective::orpo) {
    r.more.emplace_back("log_odds_ratio", v[kLogOddsRatio] / n);
    r.more.emplace_back("log_odds_chosen", v[kLogOdds] / n);
  }
  return r;
}

// The reference model for its lifetime: the base with the adapters off, or (a loaded adapter)
// the adapter as loaded in place of the trained one, whose values come back afterwards.
class ReferenceScope {
 public:
  ReferenceScope(FsdpModel& model, const std::vector<at::Tensor>* adapter) : model_(model) {
    if (adapter == nullptr) {
      model_.set_adapters_enabled(false);
      return;
    }
    const auto& units = model_.trained_units();
    for (size_t i = 0; i < units.size(); ++i) {
      trained_.push_back(units[i].shard.detach().clone());
      units[i].shard.detach().copy_((*adapter)[i]);
    }
  }
  ~ReferenceScope() {
    model_.set_adapters_enabled(true);
    const auto& units = model_.trained_units();
    for (size_t i = 0; i < trained_.size(); ++i) units[i].shard.detach().copy_(trained_[i]);
  }
  ReferenceScope(const ReferenceScope&) = delete;
  ReferenceScope& operator=(const ReferenceScope&) = delete;

 private:
  FsdpModel& model_;
  std::vector<at::Tensor> trained_;
};

}  // namespace

std::vector<std::pair<std::string, double>> trl_metrics(const PreferenceMetrics& m, const std::string& prefix) {
  if (m.kto) {  // KTOTrainer's own list, each logged where it has a value (PreferenceMetrics::more)
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [name, value] : m.more) out.emplace_back(prefix + name, value);
    return out;
  }
  std::vector<std::pair<std::string, double>> out = {
      {prefix + "rewards/chosen", m.rewards_chosen}, {prefix + "rewards/rejected", m.rewards_rejected},
      {prefix + "rewards/accuracies", m.accuracies}, {prefix + "rewards/margins", m.margins},
      {prefix + "logps/chosen", m.logps_chosen},     {prefix + "logps/rejected", m.logps_rejected}};
  for (const auto& [name, value] : m.more) out.emplace_back(prefix + name, value);
  return out;
}

namespace {
// f-DPO: a side's score from its log-ratio u (DPOTrainer, f_divergence_type).
at::Tensor f_score(const at::Tensor& u, const PreferenceOptions& o) {
  switch (o.f_divergence_type) {
    case FDivergence::reverse_kl:
      return u;
    case FDivergence::forward_kl:
      return 1 - at::exp(-u);
    case FDivergence::js_divergence:
      return at::log_sigmoid(u) + std::log(2.0);
    case FDivergence::alpha_divergence: {
      const double a = o.f_alpha_divergence_coef;
      if (std::abs(a - 1.0) < 1e-6) return u;  // the limit: reverse_kl, as TRL falls back
      return (at::exp(((a - 1.0) * u).clamp_max(80.0)) - 1.0) * (1.0 / (a - 1.0));
    }
  }
  return u;
}

// A smoothed logistic loss of z: -(1 - e) log sigma(beta z) - e log sigma(-beta z) (AOT, CPO, SimPO).
at::Tensor smoothed_logistic(const at::Tensor& z, double beta, double e) {
  return -at::log_sigmoid(z * beta) * (1 - e) - at::log_sigmoid(z * -beta) * e;
}

at::Tensor sorted(const at::Tensor& x) { return std::get<0>(at::sort(x, 0)); }
}  // namespace

PairLosses pair_losses(const PairScores& s, const PreferenceObjective& objective) {
  const PreferenceOptions& o = objective.options;
  const double beta = o.beta, e = o.label_smoothing;
  PairLosses out;
  if (objective.objective == Objective::orpo) {  // ORPOTrainer.odds_ratio_loss: per-token means
    // log(1 - e^x) stably (ORPOTrainer's log1mexp)
    const auto log1mexp = [](const at::Tensor& x) {
      return at::where(x.lt(-0.6931471805599453), at::log1p(-at::exp(x)), at::log(-at::expm1(x)));
    };
    const at::Tensor log_odds = (s.chosen - s.rejected) - (log1mexp(s.chosen) - log1mexp(s.rejected));
    out.loss = -at::log_sigmoid(log_odds) * beta;
    out.log_odds = log_odds.detach();
    out.sft_sum = -s.chosen_plain.sum();  // the chosen sequences' NLL, prompt included
    out.rewards_chosen = s.chosen.detach() * beta;
    out.rewards_rejected = s.rejected.detach() * beta;
    return out;
  }
  if (is_cpo_trainer(objective.objective)) {  // CPOTrainer.cpo_loss, no reference
    // the rewards: log p, or AlphaPO's (1 - p^-alpha) / alpha (p of the mean for simpo and ipo)
    const auto reward = [&](const at::Tensor& logp) {
      return o.alpha == 0.0 ? logp : (1 - at::exp(logp * -o.alpha)) / o.alpha;
    };
    const at::Tensor chosen = reward(s.chosen), rejected = reward(s.rejected), logits = chosen - rejected;
    const PreferenceLoss loss = objective.objective == Objective::simpo ? PreferenceLoss::sigmoid : o.loss_type.at(0);
    if (loss == PreferenceLoss::hinge)
      out.loss = at::relu(1 - logits * beta);
    else if (loss == PreferenceLoss::ipo)
      out.loss = (logits - 1 / (2 * beta)).pow(2);
    else  // sigmoid; simpo's with its target margin
      out.loss = smoothed_logistic(objective.objective == Objective::simpo ? logits - o.gamma / beta : logits, beta, e);
    if (o.cpo_alpha != 0.0) out.sft_sum = -s.chosen_plain.sum() * o.cpo_alpha;  // the NLL, a token mean
    out.rewards_chosen = chosen.detach() * beta;
    out.rewards_rejected = rejected.detach() * beta;
    return out;
  }
  const at::Tensor chosen_ratio = s.chosen - s.ref_chosen, rejected_ratio = s.rejected - s.ref_rejected;
  const at::Tensor chosen_score = f_score(chosen_ratio, o), rejected_score = f_score(rejected_ratio, o);
  const at::Tensor delta = chosen_score - rejected_score;
  const at::Tensor chosen_mean = chosen_score / s.tokens_chosen.clamp_min(1.0),
                   rejected_mean = rejected_score / s.tokens_rejected.clamp_min(1.0);
  at::Tensor loss = at::zeros_like(delta);
  for (size_t i = 0; i < o.loss_type.size(); ++i) {  // DPOTrainer._compute_loss
    const double w = o.weight(i);
    switch (o.loss_type[i]) {
      case PreferenceLoss::sigmoid:
        loss = loss - at::log_sigmoid(delta * beta) * w;
        break;
      case PreferenceLoss::hinge:
        loss = loss + at::relu(1 - delta * beta) * w;
        break;
      case PreferenceLoss::ipo:
        loss = loss + (chosen_mean - rejected_mean - 1 / (2 * beta)).pow(2) * w;
        break;
      case PreferenceLoss::exo_pair: {  // KL(softmax of beta times the scores || (1 - e, e))
        const at::Tensor z = delta * beta;
        loss = loss + (at::sigmoid(z) * (at::log_sigmoid(z) - std::log1p(-e)) +
                       at::sigmoid(-z) * (at::log_sigmoid(-z) - std::log(e))) *
                          w;
        break;
      }
      case PreferenceLoss::nca_pair: {
        const at::Tensor c = chosen_ratio * beta, r = rejected_ratio * beta;
        loss = loss + (-at::log_sigmoid(c) - 0.5 * at::log_sigmoid(-c) - 0.5 * at::log_sigmoid(-r)) * w;
        break;
      }
      case PreferenceLoss::robust:
        loss =
            loss + (-at::log_sigmoid(delta * beta) * (1 - e) + at::log_sigmoid(delta * -beta) * e) * (w / (1 - 2 * e));
        break;
      case PreferenceLoss::bco_pair:
        loss = loss + (-at::log_sigmoid(chosen_ratio * beta) - at::log_sigmoid(-rejected_ratio * beta)) * w;
        break;
      case PreferenceLoss::sppo_hard:
        loss = loss + ((chosen_ratio - 0.5 / beta).pow(2) + (rejected_ratio + 0.5 / beta).pow(2)) * w;
        break;
      case PreferenceLoss::aot:  // the batch's policy and reference margins, each sorted
        loss = loss +
               smoothed_logistic(sorted(s.chosen - s.rejected) - sorted(s.ref_chosen - s.ref_rejected), beta, e) * w;
        break;
      case PreferenceLoss::aot_unpaired:
        loss = loss + smoothed_logistic(sorted(chosen_ratio) - sorted(rejected_ratio), beta, e) * w;
        break;
      case PreferenceLoss::apo_zero:
        loss = loss + (1 - at::sigmoid(chosen_ratio * beta) + at::sigmoid(rejected_ratio * beta)) * w;
        break;
      case PreferenceLoss::apo_down:
        loss = loss + (at::sigmoid(chosen_ratio * beta) + 1 - at::sigmoid((chosen_ratio - rejected_ratio) * beta)) * w;
        break;
      case PreferenceLoss::discopop: {  // logistic and exponential losses mixed by sigma(z / tau)
        const at::Tensor z = delta * beta, mix = at::sigmoid(z / o.discopop_tau);
        loss = loss + (-at::log_sigmoid(z) * (1 - mix) + at::exp(-z) * mix) * w;
        break;
      }
      case PreferenceLoss::sft: {  // a token mean over the step: summed here, divided by the caller
        const at::Tensor nll = -s.chosen_plain.sum() * w;
        out.sft_sum = out.sft_sum.defined() ? out.sft_sum + nll : nll;
        break;
      }
      case PreferenceLoss::sigmoid_norm:
        loss = loss - at::log_sigmoid((chosen_mean - rejected_mean) * beta) * w;
        break;
      case PreferenceLoss::kto:
      case PreferenceLoss::apo_zero_unpaired:  // KTO's, on its own rows (accumulate_kto); the config refuses them here
        throw RuntimeError("preference.loss_type " +
                           std::string(o.loss_type[i] == PreferenceLoss::kto ? "kto" : "apo_zero_unpaired") +
                           " is KTO's: training.objective = \"kto\"");
    }
  }
  out.loss = s.weights.defined() ? loss * s.weights : loss;  // WPO: each pair's losses times its weight
  out.rewards_chosen = chosen_ratio.detach() * beta;
  out.rewards_rejected = rejected_ratio.detach() * beta;
  return out;
}

namespace {
// The reference's summed log-probabilities of a batch's rows [2P], without autograd.
at::Tensor reference_sums(FsdpModel& model, const Batch& b, int64_t loss_chunk, const PreferenceObjective& objective) {
  at::NoGradGuard no_grad;
  ReferenceScope reference(model, objective.reference_adapter);
  return row_sums(model.token_logprobs(b.inputs, b.targets, loss_chunk), b.targets, objective.options.ld_alpha).logps;
}

// WPO's pair weights [P] (DPOTrainer with use_weighting): each completion's exp of the mean over
// its tokens of log p(token) - log sum_v p_v^2 (`stats`' column), chosen times rejected; no autograd.
at::Tensor wpo_weights(const at::Tensor& token_logps, const at::Tensor& stats, const at::Tensor& targets) {
  at::NoGradGuard no_grad;
  const at::Tensor t = targets.reshape({targets.size(0), -1});
  const at::Tensor scored = t.ne(kIgnoreIndex).to(at::kFloat);
  const at::Tensor sum_sq = stats.select(1, TokenStat::log_sum_sq).reshape(t.sizes());
  const at::Tensor aligned = (token_logps.detach().reshape(t.sizes()) - sum_sq) * scored;
  const at::Tensor w = at::exp(aligned.sum(1) / scored.sum(1).clamp_min(1.0));
  const int64_t P = t.size(0) / 2;
  return w.slice(0, 0, P) * w.slice(0, P);
}
}  // namespace

PairScores pair_scores(FsdpModel& model, const Batch& b, int64_t loss_chunk, const PreferenceObjective& objective) {
  const at::Tensor &inputs = b.inputs, &targets = b.targets;
  const int64_t P = inputs.size(0) / 2;
  PairScores s;
  if (objective.objective == Objective::dpo && objective.reference_logps) {
    if (!b.pairs.defined() || b.pairs.size(0) != P)
      throw RuntimeError("precomputed reference log-probabilities need the batch's pairs");
    const at::Tensor ref = objective.reference_logps->index_select(0, b.pairs).to(inputs.device());
    s.ref_chosen = ref.select(1, 0);
    s.ref_rejected = ref.select(1, 1);
  } else if (objective.objective == Objective::dpo) {
    const at::Tensor ref = reference_sums(model, b, loss_chunk, objective);
    s.ref_chosen = ref.slice(0, 0, P);
    s.ref_rejected = ref.slice(0, P);
  }
  const bool dpo = objective.objective == Objective::dpo, orpo = objective.objective == Objective::orpo;
  // ORPO scores every next token of a row for its NLL, the completion's for its odds ratio
  const at::Tensor nll = nll_targets(b, objective.objective);
  // DPO: the policy's token statistics, for WPO's weights and DPOTrainer's token metrics
  at::Tensor token_logps = model.token_logprobs(inputs, nll, loss_chunk, dpo ? &s.stats : nullptr), whole;
  if (dpo && objective.options.use_weighting) s.weights = wpo_weights(token_logps, s.stats, targets);
  if (orpo) {
    token_logps = token_logps.reshape(nll.sizes());
    whole = token_logps.sum(1);
    token_logps = token_logps * targets.ne(kIgnoreIndex);
  }
  RowSums policy = row_sums(token_logps, targets, dpo ? objective.options.ld_alpha : 1.0);
  // CPOTrainer and ORPOTrainer: length-normalized, the mean over the completion, for SimPO, CPO's
  // ipo and ORPO
  if (objective.objective == Objective::simpo || orpo ||
      (objective.objective == Objective::cpo && objective.options.loss_type.at(0) == PreferenceLoss::ipo))
    policy.logps = policy.logps / policy.tokens;
  s.chosen_plain = (orpo ? whole : policy.plain).slice(0, 0, P);
  s.nll_tokens = nll.slice(0, 0, P).ne(kIgnoreIndex).sum(1).to(at::kFloat);
  s.chosen = policy.logps.slice(0, 0, P);
  s.rejected = policy.logps.slice(0, P);
  s.tokens_chosen = policy.tokens.slice(0, 0, P);
  s.tokens_rejected = policy.tokens.slice(0, P);
  return s;
}

void accumulate_preference(FsdpModel& model, const MicroBatchFn& micro_batch, const StepOptions& o,
                           const PreferenceObjective& objective, StepResult& r) {
  if (objective.objective == Objective::kto) return accumulate_kto(model, micro_batch, o, objective, r);
  std::vector<Batch> batches;
  int64_t pairs = 0, tokens = 0, chosen = 0, ids = 0;
  const bool nll = has_nll(objective);
  for (int64_t a = 0; a < o.grad_accum_steps; ++a) {
    batches.push_back(micro_batch(a));
    pairs += batches.back().inputs.size(0) / 2;
    tokens += batches.back().trained_tokens();
    ids += batches.back().num_tokens;
    if (nll) chosen += chosen_tokens(batches.back(), objective.objective);
  }
  Collectives& comm = model.comm();
  at::Tensor total = at::tensor(
      {static_cast<double>(pairs), static_cast<double>(tokens), static_cast<double>(chosen), static_cast<double>(ids)},
      at::kDouble);
  comm.all_reduce_sum(total);
  const double n = total[0].item<double>(), chosen_total = std::max(total[2].item<double>(), 1.0);
  if (n <= 0) throw RuntimeError("a training step has no preference pairs");
  at::Tensor sums = at::zeros({kMetrics}, at::TensorOptions(at::kDouble).device(model.device()));
  for (const Batch& b : batches) {
    const PhasePeak forward(model.device());
    const PairScores scores = pair_scores(model, b, o.loss_chunk, objective);
    const PairLosses losses = pair_losses(scores, objective);
    r.peaks.forward = std::max(r.peaks.forward, forward.peak());
    r.peaks.forward_start = std::max(r.peaks.forward_start, forward.start());
    const PhasePeak backward(model.device());
    r.peaks.backward_start = std::max(r.peaks.backward_start, backward.start());
    // The reduce-scatter averages over ranks: times the world size, the mean over all pairs.
    // The sft loss is the mean over the step's chosen tokens, all ranks (DPOTrainer's, one batch).
    at::Tensor loss = losses.loss.sum() * (comm.world_size() / n);
    if (losses.sft_sum.defined()) loss = loss + losses.sft_sum * (comm.world_size() / chosen_total);
    loss.backward();
    model.finish_backward();
    r.peaks.backward = std::max(r.peaks.backward, backward.peak());
    sums += metric_sums(losses, scores, b.targets);
  }
  comm.all_reduce_sum(sums);
  r.preference = metrics_of(sums, static_cast<int64_t>(n), objective);
  r.preference.num_tokens = static_cast<int64_t>(total[3].item<double>());
  r.loss = r.preference.loss;
  r.trained_tokens = static_cast<int64_t>(total[1].item<double>());
}

at::Tensor precompute_reference(FsdpModel& model, const PairedRows& data, int64_t batch, int64_t loss_chunk,
                                const PreferenceObjective& objective) {
  const int64_t n = data.pairs();
  Collectives& comm = model.comm();
  const int64_t ws = comm.world_size(), rank = comm.rank();
  at::Tensor table = at::zeros({n, 2}, at::kDouble);
  // Forward k of rank r scores pairs [(k ws + r) B, +B): every rank runs as many forwards (the
  // gathers are collective), one with nothing left scores pair 0 and drops it.
  for (int64_t first = 0; first < n; first += batch * ws) {
    const int64_t begin = std::min(n, first + rank * batch), end = std::min(n, begin + batch);
    std::vector<int64_t> pairs;
    for (int64_t p = begin; p < end; ++p) pairs.push_back(p);
    const bool idle = pairs.empty();
    if (idle) pairs.push_back(0);
    const Batch b = data.pair_batch(pairs).to(model.device());
    const at::Tensor sums = reference_sums(model, b, loss_chunk, objective).to(at::kCPU).to(at::kDouble);
    if (idle) continue;
    const auto P = static_cast<int64_t>(pairs.size());
    table.slice(0, begin, end).copy_(at::stack({sums.slice(0, 0, P), sums.slice(0, P)}, 1));
  }
  comm.all_reduce_sum(table);  // each pair scored by one rank, zeros elsewhere
  return table.to(at::kFloat);
}

std::vector<at::Tensor> reference_adapter(const FsdpModel& model, Objective objective, bool adapter_loaded) {
  std::vector<at::Tensor> copy;
  if (has_reference(objective) && adapter_loaded)
    for (const auto& u : model.trained_units()) copy.push_back(u.shard.detach().clone());
  return copy;
}

PreferenceMetrics evaluate_preference(FsdpModel& model, const RowSource& data, int64_t batch, int64_t loss_chunk,
                                      const PreferenceObjective& objective, int64_t max_pairs) {
  if (objective.objective == Objective::kto) return evaluate_kto(model, data, batch, loss_chunk, objective, max_pairs);
  at::NoGradGuard no_grad;
  int64_t n = data.val_rows();
  if (max_pairs >= 0) n = std::min(n, max_pairs);
  at::Tensor sums = at::zeros({kMetrics}, at::TensorOptions(at::kDouble).device(model.device()));
  for (int64_t first = 0; first < n; first += batch) {
    const Batch b = data.val_batch(first, std::min(batch, n - first)).to(model.device());
    const PairScores scores = pair_scores(model, b, loss_chunk, objective);
    sums += metric_sums(pair_losses(scores, objective), scores, b.targets);
  }
  return metrics_of(sums, n, objective);
}

// ---- KTO (TRL 1.16's KTOTrainer._compute_loss) ----
namespace {

// A KTO micro-batch of B examples (rows [0, B): each example, [B, 2B): its KL sequence) scored:
// the policy's sums of the examples' completion log-probabilities (autograd) and its token
// statistics; the reference's; and, for the kto loss, both models' sums of the KL sequences'
// (no autograd).
struct KtoScores {
  at::Tensor logps, ref_logps;    // [B]
  at::Tensor kl, ref_kl;          // [B]; undefined for apo_zero_unpaired
  at::Tensor stats;               // [B * T, TokenStat::count]
  at::Tensor targets, desirable;  // the examples' targets [B, T]; labels [B] (bool, on the device)
};

bool kto_has_kl(const PreferenceObjective& o) { return o.options.reads(PreferenceLoss::kto); }

KtoScores kto_scores(FsdpModel& model, const Batch& b, int64_t loss_chunk, const PreferenceObjective& objective) {
  const int64_t B = b.inputs.size(0) / 2;
  const bool kl = kto_has_kl(objective);
  KtoScores s;
  s.targets = b.targets.slice(0, 0, B);
  s.desirable = b.labels.to(b.inputs.device());
  const Batch examples{b.inputs.slice(0, 0, B), s.targets, at::Tensor(), b.pairs, b.labels};
  const Batch kl_rows{b.inputs.slice(0, B), b.targets.slice(0, B), at::Tensor(), b.pairs, b.labels};
  if (objective.reference_logps) {
    if (!b.pairs.defined() || b.pairs.size(0) != B)
      throw RuntimeError("precomputed reference log-probabilities need the batch's examples");
    const at::Tensor ref = objective.reference_logps->index_select(0, b.pairs).to(b.inputs.device());
    s.ref_logps = ref.select(1, 0);
    if (kl) s.ref_kl = ref.select(1, 1);
  } else {
    const at::Tensor ref = reference_sums(model, kl ? b : examples, loss_chunk, objective);
    s.ref_logps = ref.slice(0, 0, B);
    if (kl) s.ref_kl = ref.slice(0, B);
  }
  if (kl) {
    at::NoGradGuard no_grad;
    s.kl = row_sums(model.token_logprobs(kl_rows.inputs, kl_rows.targets, loss_chunk), kl_rows.targets, 1.0).logps;
  }
  s.logps =
      row_sums(model.token_logprobs(examples.inputs, examples.targets, loss_chunk, &s.stats), s.targets, 1.0).logps;
  return s;
}

// The KL term of a micro-batch: the mean over its examples of the policy's minus the reference's
// KL-sequence log-probabilities, averaged over the ranks' micro-batches (TRL's gather), at least 0.
at::Tensor kto_kl(const KtoScores& s, Collectives& comm) {
  if (!s.kl.defined()) return at::zeros({}, s.logps.options().dtype(at::kFloat));
  at::Tensor mean = (s.kl - s.ref_kl).to(at::kFloat).mean().detach().reshape({1}).to(at::kCPU).to(at::kDouble);
  comm.all_reduce_sum(mean);
  return (mean / static_cast<double>(comm.world_size())).clamp_min(0.0).to(at::kFloat).squeeze().to(s.logps.device());
}

// Each example's weighted loss [B] (autograd) and its reward beta * (logp - ref logp) (no autograd).
std::pair<at::Tensor, at::Tensor> kto_losses(const KtoScores& s, const at::Tensor& kl, const PreferenceOptions& o) {
  const at::Tensor ratio = s.logps - s.ref_logps;
  const double beta = o.beta;
  at::Tensor good, bad;
  if (o.reads(PreferenceLoss::kto)) {
    good = 1 - at::sigmoid(beta * (ratio - kl));
    bad = 1 - at::sigmoid(beta * (kl - ratio));
  } else {  // apo_zero_unpaired
    good = 1 - at::sigmoid(beta * ratio);
    bad = at::sigmoid(beta * ratio);
  }
  const at::Tensor loss = at::where(s.desirable, o.desirable_weight * good, o.undesirable_weight * bad);
  return {loss, ratio.detach() * beta};
}

// One micro-batch's metric sums (this rank's), float64: what KTOTrainer gathers for each of its
// logged means.
enum KtoSum : int64_t {
  kKtoLoss,
  kKtoExamples,
  kKtoKl,  // the micro-batch's KL term (the same on every rank: divided by the world size when summed)
  kKtoEntropy,
  kKtoTokens,
  kKtoLogitsChosen,
  kKtoChosenTokens,
  kKtoLogitsRejected,
  kKtoRejectedTokens,
  kKtoRewardsChosen,
  kKtoLogpsChosen,
  kKtoChosen,
  kKtoRewardsRejected,
  kKtoLogpsRejected,
  kKtoRejected,
  kKtoSums
};
at::Tensor kto_sums(const KtoScores& s, const at::Tensor& loss, const at::Tensor& rewards, const at::Tensor& kl,
                    int64_t world_size, bool evaluation) {
  at::NoGradGuard no_grad;
  const at::Tensor good = s.desirable, bad = s.desirable.logical_not();
  const at::Tensor scored = s.targets.ne(kIgnoreIndex);
  const at::Tensor stats = s.stats.reshape({s.targets.size(0), s.targets.size(1), TokenStat::count}).to(at::kDouble);
  const auto masked = [&](int64_t column, const at::Tensor& rows) {
    return at::where(scored.logical_and(rows.unsqueeze(1)), stats.select(2, column), 0.0).sum();
  };
  const auto sum_where = [](const at::Tensor& x, const at::Tensor& rows) {
    return at::where(rows, x.detach().to(at::kDouble), 0.0).sum();
  };
  const auto count = [](const at::Tensor& x) { return x.sum().to(at::kDouble); };
  const at::Tensor all = at::ones_like(good);
  std::vector<at::Tensor> v(kKtoSums);
  // training: the micro-batch's mean (the ranks' summed); evaluation: the sum (TRL's evaluation
  // loop weighs each batch's mean by its size)
  v[kKtoLoss] = evaluation ? loss.detach().to(at::kDouble).sum() : loss.detach().to(at::kDouble).mean();
  v[kKtoExamples] = count(all);
  v[kKtoKl] = kl.detach().to(at::kDouble) / static_cast<double>(world_size);
  v[kKtoEntropy] = masked(TokenStat::entropy, all);
  v[kKtoTokens] = count(scored);
  v[kKtoLogitsChosen] = masked(TokenStat::mean_logit, good);
  v[kKtoChosenTokens] = count(scored.logical_and(good.unsqueeze(1)));
  v[kKtoLogitsRejected] = masked(TokenStat::mean_logit, bad);
  v[kKtoRejectedTokens] = count(scored.logical_and(bad.unsqueeze(1)));
  v[kKtoRewardsChosen] = sum_where(rewards, good);
  v[kKtoLogpsChosen] = sum_where(s.logps, good);
  v[kKtoChosen] = count(good);
  v[kKtoRewardsRejected] = sum_where(rewards, bad);
  v[kKtoLogpsRejected] = sum_where(s.logps, bad);
  v[kKtoRejected] = count(bad);
  return at::stack(v);
}

// The metrics of micro-batches [M, kKtoSums] (each summed over the ranks), as KTOTrainer logs them:
// each metric a micro-batch's value — a mean over its examples or tokens, all ranks —, logged where
// the micro-batch has any, then averaged over the micro-batches (TRL's log()); the loss the mean
// over the ranks' micro-batches of their means (`ranks` micro-batches in each row), or in an
// evaluation the mean over the examples.
PreferenceMetrics kto_metrics(const at::Tensor& sums, int64_t ranks, bool evaluation) {
  const at::Tensor m = sums.to(at::kCPU).contiguous();
  const double* v = m.data_ptr<double>();
  const int64_t M = m.size(0);
  struct Mean {
    double sum = 0;
    int64_t n = 0;
    void add(double x) { sum += x, ++n; }
  };
  Mean kl, entropy, logits_chosen, logits_rejected, rewards_chosen, logps_chosen, rewards_rejected, logps_rejected,
      margins;
  double loss = 0, examples = 0;
  for (int64_t i = 0; i < M; ++i) {
    const double* r = v + i * kKtoSums;
    loss += r[kKtoLoss];
    examples += r[kKtoExamples];
    kl.add(r[kKtoKl]);
    entropy.add(r[kKtoTokens] > 0 ? r[kKtoEntropy] / r[kKtoTokens] : 0.0);
    if (r[kKtoChosenTokens] > 0) logits_chosen.add(r[kKtoLogitsChosen] / r[kKtoChosenTokens]);
    if (r[kKtoRejectedTokens] > 0) logits_rejected.add(r[kKtoLogitsRejected] / r[kKtoRejectedTokens]);
    if (r[kKtoChosen] > 0) {
      rewards_chosen.add(r[kKtoRewardsChosen] / r[kKtoChosen]);
      logps_chosen.add(r[kKtoLogpsChosen] / r[kKtoChosen]);
    }
    if (r[kKtoRejected] > 0) {
      rewards_rejected.add(r[kKtoRewardsRejected] / r[kKtoRejected]);
      logps_rejected.add(r[kKtoLogpsRejected] / r[kKtoRejected]);
    }
    if (r[kKtoChosen] > 0 && r[kKtoRejected] > 0)
      margins.add(r[kKtoRewardsChosen] / r[kKtoChosen] - r[kKtoRewardsRejected] / r[kKtoRejected]);
  }
  PreferenceMetrics out;
  out.kto = true;
  out.pairs = static_cast<int64_t>(examples);
  out.loss = evaluation ? (examples > 0 ? loss / examples : 0.0) : M > 0 ? loss / static_cast<double>(M * ranks) : 0.0;
  out.rewards_chosen = rewards_chosen.n ? rewards_chosen.sum / static_cast<double>(rewards_chosen.n) : 0.0;
  out.rewards_rejected = rewards_rejected.n ? rewards_rejected.sum / static_cast<double>(rewards_rejected.n) : 0.0;
  out.margins = margins.n ? margins.sum / static_cast<double>(margins.n) : 0.0;
  out.logps_chosen = logps_chosen.n ? logps_chosen.sum / static_cast<double>(logps_chosen.n) : 0.0;
  out.logps_rejected = logps_rejected.n ? logps_rejected.sum / static_cast<double>(logps_rejected.n) : 0.0;
  for (const auto& [name, mean] : {std::pair<const char*, const Mean*>{"kl", &kl},
                                   {"entropy", &entropy},
                                   {"logits/chosen", &logits_chosen},
                                   {"logits/rejected", &logits_rejected},
                                   {"rewards/chosen", &rewards_chosen},
                                   {"logps/chosen", &logps_chosen},
                                   {"rewards/rejected", &rewards_rejected},
                                   {"logps/rejected", &logps_rejected},
                                   {"rewards/margins", &margins}})
    if (mean->n) out.more.emplace_back(name, mean->sum / static_cast<double>(mean->n));
  return out;
}

}  // namespace

void accumulate_kto(FsdpModel& model, const MicroBatchFn& micro_batch, const StepOptions& o,
                    const PreferenceObjective& objective, StepResult& r) {
  std::vector<Batch> batches;
  int64_t examples = 0, tokens = 0, ids = 0;
  for (int64_t a = 0; a < o.grad_accum_steps; ++a) {
    batches.push_back(micro_batch(a));
    const int64_t B = batches.back().inputs.size(0) / 2;
    examples += B;
    tokens += batches.back().targets.slice(0, 0, B).ne(kIgnoreIndex).sum().item<int64_t>();
    ids += batches.back().num_tokens;
  }
  Collectives& comm = model.comm();
  at::Tensor total =
      at::tensor({static_cast<double>(examples), static_cast<double>(tokens), static_cast<double>(ids)}, at::kDouble);
  comm.all_reduce_sum(total);
  const double n = total[0].item<double>();
  if (n <= 0) throw RuntimeError("a training step has no KTO examples");
  std::vector<at::Tensor> sums;
  for (const Batch& b : batches) {
    const PhasePeak forward(model.device());
    const KtoScores scores = kto_scores(model, b, o.loss_chunk, objective);
    const at::Tensor kl = kto_kl(scores, comm);
    const auto [losses, rewards] = kto_losses(scores, kl, objective.options);
    r.peaks.forward = std::max(r.peaks.forward, forward.peak());
    r.peaks.forward_start = std::max(r.peaks.forward_start, forward.start());
    const PhasePeak backward(model.device());
    r.peaks.backward_start = std::max(r.peaks.backward_start, backward.start());
    // TRL's: each micro-batch's mean over its examples, averaged over the micro-batches and (the
    // reduce-scatter's average) the ranks — the mean over the step's examples where the
    // micro-batches are equal, as all but an epoch's last are
    (losses.mean() / static_cast<double>(o.grad_accum_steps)).backward();
    model.finish_backward();
    r.peaks.backward = std::max(r.peaks.backward, backward.peak());
    sums.push_back(kto_sums(scores, losses, rewards, kl, comm.world_size(), false));
  }
  at::Tensor all = at::stack(sums);
  comm.all_reduce_sum(all);
  r.preference = kto_metrics(all, comm.world_size(), false);
  r.preference.num_tokens = static_cast<int64_t>(total[2].item<double>());
  r.loss = r.preference.loss;
  r.trained_tokens = static_cast<int64_t>(total[1].item<double>());
}

PreferenceMetrics evaluate_kto(FsdpModel& model, const RowSource& data, int64_t batch, int64_t loss_chunk,
                               const PreferenceObjective& objective, int64_t max_examples) {
  at::NoGradGuard no_grad;
  int64_t n = data.val_rows();
  if (max_examples >= 0) n = std::min(n, max_examples);
  // every rank scores the same examples: the KL term's mean over the ranks is each one's
  Collectives& comm = model.comm();
  std::vector<at::Tensor> sums;
  for (int64_t first = 0; first < n; first += batch) {
    const Batch b = data.val_batch(first, std::min(batch, n - first)).to(model.device());
    const KtoScores scores = kto_scores(model, b, loss_chunk, objective);
    const at::Tensor kl = kto_kl(scores, comm);
    const auto [losses, rewards] = kto_losses(scores, kl, objective.options);
    sums.push_back(kto_sums(scores, losses, rewards, kl, 1, true));
  }
  if (sums.empty()) return kto_metrics(at::zeros({0, kKtoSums}, at::kDouble), 1, true);
  return kto_metrics(at::stack(sums), 1, true);
}

}  // namespace ptrain
