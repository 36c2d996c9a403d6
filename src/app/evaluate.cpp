#include "app/evaluate.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "common/log.h"
#include "config/config.h"
#include "data/rows.h"
#include "data/token_file.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "train/preference.h"
#include "train/setup.h"
#include "train/trainer.h"

namespace ptrain {

namespace fs = std::filesystem;

int run_eval(const EvalRequest& a) {
  std::vector<std::string> sets = a.sets;
  if (!a.data.empty()) {
    // An explicit file replaces data.path before the config is checked, and is identified by
    // content: token files carry a magic header, JSONL / JSON / Parquet files end in .jsonl /
    // .json / .parquet (tokenized with data.tokenizer / model.hf_path), anything else is text.
    const std::string& data = a.data;
    if (!fs::is_regular_file(data)) throw UsageError("no such data file '" + data + "'");
    char magic[8] = {};
    std::ifstream(data, std::ios::binary).read(magic, 8);
    const char* format = std::memcmp(magic, kTokenMagic, 8) == 0    ? "tokens"
                         : fs::path(data).extension() == ".jsonl"   ? "jsonl"
                         : fs::path(data).extension() == ".json"    ? "json"
                         : fs::path(data).extension() == ".parquet" ? "parquet"
                                                                    : "text";
    sets.push_back("data.path=" + data);
    sets.push_back(std::string("data.format=") + format);
  }
  const Config c = load_config(a.config, sets);
  const std::string& path = c.data.path;
  const DistEnv env = DistEnv::detect();
  const c10::Device device = resolve_device(c, env);
  const std::shared_ptr<Collectives> comm = connect(c, env, device);
  const RunData data = open_data(c, comm.get(), device, /*eval_only=*/true);
  const bool ref_model = has_reference(c.training.objective) && !c.preference.ref_model.empty();
  at::Tensor reference_logps;  // precompute_ref_log_probs: by the model as loaded, before the checkpoint
  if (ref_model)               // or by preference.ref_model, freed before the policy is built
    reference_logps = score_ref_model(c, device, comm, dynamic_cast<const PairedRows&>(*data.rows));
  auto model = build_model(c, device, comm);
  const bool print = model->comm().rank() == 0;
  std::string source = c.model.hf_path.empty() ? "init(seed=" + std::to_string(c.run.seed) + ")" : c.model.hf_path;
  // before a checkpoint replaces it: DPO's reference keeps lora.adapter_path's adapter as loaded
  const std::vector<at::Tensor> reference =
      reference_adapter(*model, c.training.objective, !c.lora.adapter_path.empty() && !ref_model);
  PreferenceObjective objective{c.training.objective, c.preference, reference.empty() ? nullptr : &reference};
  if (has_reference(c.training.objective) && c.preference.precompute_ref_log_probs && !ref_model)
    reference_logps = precompute_reference(*model, dynamic_cast<const PairedRows&>(*data.rows), c.data.micro_batch_size,
                                           c.memory.loss_chunk_tokens, objective);
  if (reference_logps.defined()) objective.reference_logps = &reference_logps;
  if (!a.checkpoint.empty()) {
    TrainProgress progress;
    load_checkpoint(a.checkpoint, *model, nullptr, progress);
    source = a.checkpoint;
  }
  if (is_preference(c.training.objective)) {
    const PreferenceMetrics m =
        evaluate_preference(*model, *data.rows, c.data.micro_batch_size, c.memory.loss_chunk_tokens, objective);
    if (!print) return 0;
    if (a.json) {  // TRL's evaluate() names
      nlohmann::ordered_json j = {{"data", path},
                                  {"model", source},
                                  {"objective", name_of(c.training.objective)},
                                  {m.kto ? "examples" : "pairs", m.pairs},
                                  {"eval_loss", m.loss}};
      for (const auto& [name, value] : trl_metrics(m, "eval_")) j[name] = value;
      std::cout << j.dump() << "\n";
    } else if (m.kto) {  // KTOTrainer's metrics
      std::cout << "eval " << path << " with " << source << " (kto): loss " << log::fixed(m.loss, 6);
      for (const auto& [name, value] : m.more) std::cout << " | " << name << " " << log::fixed(value, 6);
      std::cout << " | " << m.pairs << " examples\n";
    } else {
      std::cout << "eval " << path << " with " << source << " (" << name_of(c.training.objective) << "): loss "
                << log::fixed(m.loss, 6) << " | rewards chosen " << log::fixed(m.rewards_chosen, 6) << ", rejected "
                << log::fixed(m.rewards_rejected, 6) << ", margin " << log::fixed(m.margins, 6) << ", accuracy "
                << log::fixed(m.accuracies, 4) << " | logps chosen " << log::fixed(m.logps_chosen, 4) << ", rejected "
                << log::fixed(m.logps_rejected, 4) << " | " << m.pairs << " pairs\n";
    }
    return 0;
  }
  EvalResult r =
      evaluate(*model, *data.rows, c.data.micro_batch_size, c.memory.loss_chunk_tokens, -1, c.training.token_metrics);
  if (r.rows == 0) throw RuntimeError("'" + path + "' is shorter than one window of seq_len+1 tokens");
  if (!print) return 0;
  const bool windows = !holds_records(c.data.format);
  if (a.json) {
    nlohmann::ordered_json j = {{"data", path},
                                {"model", source},
                                {"seq_len", c.data.seq_len},
                                {windows ? "windows" : "rows", r.rows},
                                {"tokens", r.tokens},
                                {"mean_loss", r.mean_loss},
                                {"perplexity", r.perplexity}};
    if (!std::isnan(r.entropy)) {  // TRL's SFTTrainer's metrics (training.token_metrics)
      j["entropy"] = r.entropy;
      j["mean_token_accuracy"] = r.mean_token_accuracy;
    }
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "eval " << path << " with " << source << ": mean_loss " << log::fixed(r.mean_loss, 6)
              << " nats/token | perplexity " << log::fixed(r.perplexity, 4)
              << (std::isnan(r.entropy) ? std::string()
                                        : " | entropy " + log::fixed(r.entropy, 4) + " nats | token accuracy " +
                                              log::fixed(r.mean_token_accuracy, 4))
              << " | " << r.tokens
              << (windows
                      ? " tokens in " + std::to_string(r.rows) + " windows of " + std::to_string(c.data.seq_len + 1)
                      : " trained tokens in " + std::to_string(r.rows) + " rows of " + std::to_string(c.data.seq_len))
              << "\n";
  }
  return 0;
}

}  // namespace ptrain
