// What a run trains the model for, as the config's training.objective and [preference] section hold it:
// each field's initialiser is the key's default (docs/config.md shows them). The names are TRL's
// (trl 1.16: DPOConfig, CPOConfig), and so are the losses (train/preference.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}

namespace ptrain {

// sft: next-token cross-entropy on the trained tokens; dpo: TRL's DPOTrainer against a reference
// (the base with the LoRA adapters off); simpo: SimPO, reference-free (TRL's CPOTrainer with
// loss_type = "simpo" and cpo_alpha = 0); cpo: CPO, reference-free (TRL's CPOTrainer with
// loss_type sigmoid, hinge or ipo, and cpo_alpha times the chosen completions' NLL); orpo: ORPO,
// reference-free (TRL's ORPOTrainer: the chosen rows' NLL, prompt included, minus beta times the
// log-sigmoid of the log odds ratio); kto: KTO against a reference on unpaired completions, each
// desirable or not (TRL's KTOTrainer: loss_type kto or apo_zero_unpaired).
enum class Objective { sft, dpo, simpo, cpo, orpo, kto };
inline bool is_preference(Objective o) { return o != Objective::sft; }
// Scored against a reference model (the base with the adapters off, an adapter as loaded, another
// model, or its precomputed log-probabilities): DPO and KTO.
inline bool has_reference(Objective o) { return o == Objective::dpo || o == Objective::kto; }
// TRL's CPOTrainer: no reference, its own tokenization (data/samples.h).
inline bool is_cpo_trainer(Objective o) { return o == Objective::simpo || o == Objective::cpo; }
// Pairs tokenized as CPOTrainer tokenizes them (ORPOTrainer's tokenize_row is the same).
inline bool tokenized_as_cpo(Objective o) { return is_cpo_trainer(o) || o == Objective::orpo; }

// DPO's loss_type, TRL 1.16's DPOConfig names (DPOTrainer._compute_loss has each formula):
// sigmoid (DPO), hinge (SLiC), ipo (IPO, per-token average), exo_pair (EXO, label_smoothing its
// epsilon), nca_pair (NCA), robust (rDPO, label_smoothing the chance that a label is flipped),
// bco_pair (BCO), sppo_hard (SPPO), aot / aot_unpaired (AOT: sorted within a micro-batch),
// apo_zero / apo_down (APO), discopop (DiscoPOP, discopop_tau), sft (the chosen completions'
// negative log-likelihood, a token mean over the step), sigmoid_norm (DPO on per-token averages).
enum class PreferenceLoss {
  sigmoid,
  hinge,
  ipo,
  exo_pair,
  nca_pair,
  robust,
  bco_pair,
  sppo_hard,
  aot,
  aot_unpaired,
  apo_zero,
  apo_down,
  discopop,
  sft,
  sigmoid_norm,
  // KTO's (TRL 1.16's KTOConfig.loss_type): kto (desirable: 1 - sigma(beta (r - KL)), undesirable:
  // 1 - sigma(beta (KL - r)), KL estimated from mismatched completions) and apo_zero_unpaired
  // (1 - sigma(beta r) and sigma(beta r), no KL)
  kto,
  apo_zero_unpaired
};

// DPO's f-divergence between policy and reference (f-DPO; TRL's f_divergence_type): what each
// side's log-ratio u becomes before chosen minus rejected — u (reverse_kl, DPO), 1 - e^-u
// (forward_kl), log 2 + log sigma(u) (js_divergence), (e^((alpha-1)u) - 1) / (alpha - 1)
// (alpha_divergence, alpha = f_alpha_divergence_coef).
enum class FDivergence { reverse_kl, forward_kl, js_divergence, alpha_divergence };

// [preference]
struct PreferenceOptions {
  double beta = 0.1;  // DPO's beta (IPO's tau); SimPO's beta
  // dpo only: one loss or several, each times its weight (empty: all 1), summed
  std::vector<PreferenceLoss> loss_type = {PreferenceLoss::sigmoid};
  std::vector<double> loss_weights;
  double label_smoothing = 0.0;  // dpo robust, exo_pair, aot, aot_unpaired; simpo; cpo sigmoid
  double gamma = 0.5;            // simpo: the target reward margin (TRL's simpo_gamma)
  int64_t max_length = 0;        // ids per sequence, prompt + completion (TRL's max_length); 0: data.seq_len + 1
  bool precompute_ref_log_probs = false;  // dpo: the reference scored once before training (TRL's name)
  // dpo: another model as the reference (TRL's ref_model), a path as model.hf_path takes; empty:
  // the model as loaded
  std::string ref_model;
  // dpo: LD-DPO's weight of the tokens past the shorter completion's length (TRL's ld_alpha;
  // 1: every token counts alike, TRL's None)
  double ld_alpha = 1.0;
  FDivergence f_divergence_type = FDivergence::reverse_kl;  // dpo
  double f_alpha_divergence_coef = 0.5;                     // dpo, alpha_divergence: its alpha
  double discopop_tau = 0.05;                               // dpo, discopop: its temperature
  // dpo: WPO's weighting (TRL's use_weighting): each pair's loss times the product of its two
  // completions' weights, exp of the mean over each completion's tokens of log p(token) -
  // log sum_v p_v^2 under the policy, without a gradient
  bool use_weighting = false;
  // cpo, simpo: the weight of the chosen completions' negative log-likelihood (CPO's behaviour
  // cloning; TRL's cpo_alpha). The config resolves the default: 1 for cpo, 0 for simpo.
  double cpo_alpha = 0.0;
  double alpha = 0.0;  // cpo, simpo: AlphaPO's reward shape, r = (1 - p^-alpha) / alpha; 0: log p
  // kto: the weights of the desirable and the undesirable completions' losses (TRL's names)
  double desirable_weight = 1.0, undesirable_weight = 1.0;

  bool reads(PreferenceLoss l) const {
    for (PreferenceLoss x : loss_type)
      if (x == l) return true;
    return false;
  }
  double weight(size_t i) const { return loss_weights.empty() ? 1.0 : loss_weights[i]; }
};

struct PreferenceObjective {
  Objective objective = Objective::dpo;
  PreferenceOptions options;
  // DPO from a loaded adapter (lora.adapter_path): this rank's shards of it as loaded, the
  // reference's adapter — TRL's frozen "ref" copy of a pretrained adapter. Null: the reference is
  // the base with the adapters off (a new adapter starts as the base).
  const std::vector<at::Tensor>* reference_adapter = nullptr;
  // DPO with precompute_ref_log_probs: every pair's reference log-probabilities, [pairs, 2]
  // float32 on the host (chosen, rejected), looked up by Batch::pairs. Null: scored each step.
  const at::Tensor* reference_logps = nullptr;
};

// What TRL logs (means over the pairs): rewards/chosen, rewards/rejected, rewards/accuracies,
// rewards/margins, logps/chosen, logps/rejected; and the loss (the mean of the pairs' losses).
struct PreferenceMetrics {
  int64_t pairs = 0;
  double loss = 0.0;
  double rewards_chosen = 0.0, rewards_rejected = 0.0, accuracies = 0.0, margins = 0.0;
  double logps_chosen = 0.0, logps_rejected = 0.0;
  // The objective's further metrics under TRL's names: DPO's token means over the completions
  // (entropy, logits/chosen, logits/rejected, mean_token_accuracy), nll_loss where the NLL is
  // part of the loss (CPO and SimPO with cpo_alpha, ORPO), ORPO's log_odds_ratio and
  // log_odds_chosen (means over the pairs).
  std::vector<std::pair<std::string, double>> more;
  bool kto = false;  // KTOTrainer's metrics (pairs: its examples): every one it logs is in `more`
  // The ids of the step's rows, all ranks (Batch::num_tokens): what the step adds to TRL's num_tokens.
  int64_t num_tokens = 0;
};

}  // namespace ptrain
