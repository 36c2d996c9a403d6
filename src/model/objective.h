// What a run trains the model for, as the config's training.objective and [preference] section hold it:
// each field's initialiser is the key's default (docs/config.md shows them). The names are TRL's
// (trl 1.16: DPOConfig, CPOConfig), and so are the losses (train/preference.h).
#pragma once
#include <cstdint>
#include <vector>

namespace at {
class Tensor;
}

namespace ptrain {

// sft: next-token cross-entropy on the trained tokens; dpo: TRL's DPOTrainer against a reference
// (the base with the LoRA adapters off); simpo: SimPO, reference-free (TRL's CPOTrainer with
// loss_type = "simpo" and cpo_alpha = 0).
enum class Objective { sft, dpo, simpo };
inline bool is_preference(Objective o) { return o != Objective::sft; }

// DPO's loss_type: sigmoid (DPO), hinge (SLiC), ipo (IPO, per-token average), robust (rDPO,
// label_smoothing the chance that a label is flipped).
enum class PreferenceLoss { sigmoid, hinge, ipo, robust };

// [preference]
struct PreferenceOptions {
  double beta = 0.1;                                   // DPO's beta (IPO's tau); SimPO's beta
  PreferenceLoss loss_type = PreferenceLoss::sigmoid;  // dpo only
  double label_smoothing = 0.0;                        // dpo robust; simpo
  double gamma = 0.5;                                  // simpo: the target reward margin (TRL's simpo_gamma)
  int64_t max_length = 0;  // ids per sequence, prompt + completion (TRL's max_length); 0: data.seq_len + 1
  bool precompute_ref_log_probs = false;  // dpo: the reference scored once before training (TRL's name)
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
};

}  // namespace ptrain
