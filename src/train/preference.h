// Preference objectives (training.objective = "dpo" | "simpo" | "cpo" | "orpo"), as TRL computes
// them (trl 1.16: DPOTrainer._compute_loss, CPOTrainer.cpo_loss, ORPOTrainer.odds_ratio_loss):
// each micro-batch holds pairs, the chosen sequences first and then the rejected ones
// (data/rows.h PairRows); a sequence's log-probability is the sum of its completion tokens'
// (SimPO, CPO's ipo, ORPO: their mean). DPO's reference is the same model with the LoRA adapters
// off, run without autograd before the policy's forward, or precomputed.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/objective.h"
#include "train/step.h"

namespace ptrain {

class FsdpModel;
class PairedRows;
class RowSource;

// The metrics under TRL's names, each with `prefix` ("" while training, "eval_" for an
// evaluation): rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
// logps/chosen, logps/rejected, then the objective's own (PreferenceMetrics::more; the loss and
// the pair count are the caller's to name).
std::vector<std::pair<std::string, double>> trl_metrics(const PreferenceMetrics& m, const std::string& prefix);

// Sequence scores of P pairs, each [P] float32: the policy's (autograd) and, for DPO, the
// reference's; `tokens_*`: each completion's scored tokens.
struct PairScores {
  at::Tensor chosen, rejected;
  at::Tensor ref_chosen, ref_rejected;  // DPO; undefined for SimPO
  at::Tensor tokens_chosen, tokens_rejected;
  // the sums the chosen completions' NLL (DPO's sft, CPO's, ORPO's) is taken over, [P] (autograd):
  // without ld_alpha's weighting; ORPO's of the whole chosen sequences, prompt included; and the
  // tokens they hold
  at::Tensor chosen_plain, nll_tokens;
  // DPO with use_weighting: WPO's weight of each pair [P], the product of its completions' (no
  // autograd); undefined otherwise
  at::Tensor weights;
  // DPO: the policy's per-token statistics [2P * T, TokenStat::count] (model/loss.h; no autograd),
  // the token metrics' source; undefined otherwise
  at::Tensor stats;
};
// Each pair's loss [P] (autograd through the policy's scores: the weighted sum of the objective's
// losses but sft) and the pairs' rewards [P] each (no autograd), for the objective's losses (TRL's
// formulas; model/objective.h lists them). aot and aot_unpaired sort within these P pairs. With
// the sft loss, `sft_sum` is its weight times the chosen completions' summed negative
// log-likelihood (autograd), which the caller divides by the chosen tokens it is a mean over.
struct PairLosses {
  at::Tensor loss, rewards_chosen, rewards_rejected;
  at::Tensor sft_sum;
  at::Tensor log_odds;  // ORPO: each pair's log odds ratio [P] (no autograd)
};
PairLosses pair_losses(const PairScores& scores, const PreferenceObjective& objective);

// The sequence scores of a batch of 2P rows (inputs/targets [2P, T]): sums of the per-token
// log-probabilities of each row's trained targets (SimPO: their means), chosen = rows [0, P); the
// reference's from objective.reference_logps by the batch's pairs where precomputed.
PairScores pair_scores(FsdpModel& model, const Batch& batch, int64_t loss_chunk, const PreferenceObjective& objective);

// precompute_ref_log_probs: the reference's log-probabilities of every pair of `data` (training
// and validation), [pairs, 2] float32 on the host, scored by the model as it is now (with
// objective.reference_adapter in place of its adapter where given) without autograd, `batch`
// pairs a forward; each rank scores a share and one all-reduce gives every rank all of them.
at::Tensor precompute_reference(FsdpModel& model, const PairedRows& data, int64_t batch, int64_t loss_chunk,
                                const PreferenceObjective& objective);

// The forward and backward of a step's micro-batches, each a batch of pairs. The loss is the
// mean over every pair of the step — all micro-batches of all ranks — so the gradient is that of
// TRL's mean over its global batch. Fills the result's loss, trained_tokens, peaks and
// preference metrics (means over the step's pairs, all ranks).
void accumulate_preference(FsdpModel& model, const MicroBatchFn& micro_batch, const StepOptions& options,
                           const PreferenceObjective& objective, StepResult& result);

// KTO's step and evaluation (training.objective kto: TRL's KTOTrainer), on KtoRows' batches (an
// example's row and its KL row), which accumulate_preference and evaluate_preference hand over to.
// Each micro-batch's KL term — the mean over its examples of the policy's minus the reference's
// KL-sequence log-probability, averaged over the ranks and at least 0 — enters its examples'
// losses without a gradient; the step's loss is the mean over its examples, all ranks; the
// metrics are KTOTrainer's: each micro-batch's value, averaged over the micro-batches.
void accumulate_kto(FsdpModel& model, const MicroBatchFn& micro_batch, const StepOptions& options,
                    const PreferenceObjective& objective, StepResult& result);
PreferenceMetrics evaluate_kto(FsdpModel& model, const RowSource& data, int64_t batch, int64_t loss_chunk,
                               const PreferenceObjective& objective, int64_t max_examples = -1);

// DPO from a loaded adapter (`adapter_loaded`: lora.adapter_path): a copy of this rank's adapter
// shards as they are now, before training or a checkpoint changes them — the reference's adapter
// (PreferenceObjective::reference_adapter). Empty otherwise: the reference is the base.
std::vector<at::Tensor> reference_adapter(const FsdpModel& model, Objective objective, bool adapter_loaded);

// The metrics over the first `max_pairs` validation pairs of `data` (all when < 0), `batch`
// pairs at a time, no autograd; every rank scores the same pairs.
PreferenceMetrics evaluate_preference(FsdpModel& model, const RowSource& data, int64_t batch, int64_t loss_chunk,
                                      const PreferenceObjective& objective, int64_t max_pairs = -1);

}  // namespace ptrain
