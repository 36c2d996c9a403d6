#include "app/check.h"

#include <iostream>

#include "checkpoint/gguf_model.h"
#include "checkpoint/hf.h"
#include "common/error.h"
#include "common/log.h"
#include "config/config.h"
#include "data/rows.h"
#include "parallel/precision.h"
#include "train/memory.h"
#include "train/setup.h"

namespace ptrain {

namespace {

std::string gib(int64_t bytes) { return log::fixed(static_cast<double>(bytes) / (1024.0 * 1024 * 1024), 2) + " GiB"; }

// The resolved config, the model's size, what its HF config leaves unread, the precision table.
void print_model(const Config& c) {
  const auto& s = c.model.shape;
  std::cout << "# resolved config (" << c.source_file << ")\n"
            << to_toml(c) << "\n"
            << "# plan\nmodel: " << s.describe() << ", " << log::grouped(static_cast<double>(s.total_params()))
            << " parameters (" << s.n_layers << " blocks of " << log::grouped(static_cast<double>(s.block_params()))
            << ", embedding " << log::grouped(static_cast<double>(s.embedding_params())) << ", head "
            << log::grouped(static_cast<double>(s.head_params())) << ")\n";
  if (!c.model.hf_path.empty()) {
    if (const std::string note = model_ignored_note(c.model.hf_path, c.model.gguf_reader); !note.empty())
      std::cout << note << "\n";
    if (gguf_model_file(c.model.hf_path).empty())
      if (const std::string note = hf_untied_note(c.model.hf_path, s.tie_embeddings); !note.empty())
        std::cout << note << "\n";
  }
  std::cout << precision_policy(c).table();
}

std::string frozen_base_line(const Config& c, const MemoryReport& m, int ws) {
  if (!c.lora.enabled) return "";
  const std::string nf4 = m.nf4_params ? "; NF4 " + log::fixed(m.nf4_bytes_per_param(), 4) + " B per 4-bit weight, 1/" +
                                             std::to_string(ws) + " on each rank"
                                       : std::string();
  return "  frozen base       " + gib(m.frozen_base_bytes) + " (LoRA: not trained" + nf4 + ")\n";
}

std::string activations_line(const Config& c, const ActivationEstimate& act) {
  const std::string blocks = c.memory.activation_offloading
                                 ? "block inputs offloaded: " + gib(act.host_bytes) + " in pinned host memory, " +
                                       gib(act.in_flight_bytes) + " awaiting their copy"
                                 : std::to_string(act.layers) + " blocks x " + gib(act.per_block_bytes);
  const std::string mask = act.mask_bytes
                               ? std::string(c.data.packing ? " + packed rows'" : " + the sliding window's") +
                                     " attention mask " + gib(act.mask_bytes)
                               : std::string();
  return "  activations       " + gib(act.saved_bytes()) + " (" + blocks + " + head " + gib(act.head_bytes) + mask +
         ")\n";
}

void print_peak(const Config& c, const MemoryReport& m, const PeakPlan& plan, int ws) {
  std::cout << "predicted peak allocated memory per rank at world size " << ws << " (micro-batch "
            << c.data.micro_batch_size << (is_preference(c.training.objective) ? " pairs (chosen + rejected)" : "")
            << " x " << c.data.seq_len << " tokens, activation checkpointing "
            << name_of(c.memory.activation_checkpointing) << (c.memory.activation_offloading ? " + offloading" : "")
            << ", prefetch " << (c.parallel.prefetch ? "on" : "off") << "):\n"
            << "  params            " << gib(m.param_bytes) << "\n"
            << "  grads             " << gib(m.grad_bytes) << "\n"
            << "  optimizer state   " << gib(m.optimizer_state_bytes) << "\n"
            << "  master weights    " << gib(m.master_weight_bytes) << "\n"
            << frozen_base_line(c, m, ws) << activations_line(c, plan.activations) << "  transient         "
            << gib(std::max(plan.forward_transient_bytes, plan.backward_transient_bytes)) << " (largest of: forward "
            << gib(plan.forward_transient_bytes) << ", a block's backward " << gib(plan.backward_transient_bytes)
            << ")\n"
            << "  library workspace " << gib(plan.workspace.bytes) << " (" << plan.workspace.source << ")\n"
            << "  peak              " << gib(plan.peak_bytes()) << " ("
            << log::grouped(static_cast<double>(plan.peak_bytes()))
            << " bytes: the fullest phase below, not the sum of the parts above)\n";
  // Each phase's own peak, for the per-phase peaks a CUDA run writes to metrics.jsonl
  // (peak_forward_bytes, peak_backward_bytes, peak_optimizer_bytes).
  std::cout << "  by phase          forward " << log::grouped(static_cast<double>(plan.forward_bytes()))
            << " bytes, backward " << log::grouped(static_cast<double>(plan.backward_bytes())) << " bytes, optimizer "
            << log::grouped(static_cast<double>(plan.optimizer_bytes())) << " bytes\n"
            << "  phase starts      forward " << log::grouped(static_cast<double>(plan.forward_start_bytes()))
            << " bytes, backward " << log::grouped(static_cast<double>(plan.backward_start_bytes())) << " bytes\n";
}

// A change that lowers the peak: how to ask for it, its --set values, the world size it runs at.
struct Change {
  std::string what;
  std::vector<std::string> sets;
  int world_size;
};

// What could make the run fit, each on its own.
std::vector<Change> memory_changes(const Config& c, int ws) {
  std::vector<Change> changes;
  const bool full = c.memory.activation_checkpointing == Checkpointing::full;
  if (!full)
    changes.push_back({"--set memory.activation_checkpointing=full", {"memory.activation_checkpointing=\"full\""}, ws});
  if (!c.memory.activation_offloading)
    changes.push_back({std::string(!full ? "--set memory.activation_checkpointing=full " : "") +
                           "--set memory.activation_offloading=true",
                       {"memory.activation_checkpointing=\"full\"", "memory.activation_offloading=true"},
                       ws});
  if (c.optimizer.name != OptimizerName::adamw8bit && !c.optimizer.in_backward)
    changes.push_back({"--set optimizer.name=adamw8bit", {"optimizer.name=\"adamw8bit\""}, ws});
  if (c.precision.mode != PrecisionMode::bf16 && !c.lora.enabled)
    changes.push_back({"--set precision.mode=bf16", {"precision.mode=\"bf16\""}, ws});
  if (c.data.micro_batch_size > 1)
    changes.push_back({"--set data.micro_batch_size=" + std::to_string(c.data.micro_batch_size / 2) +
                           " (and double grad_accum_steps)",
                       {"data.micro_batch_size=" + std::to_string(c.data.micro_batch_size / 2)},
                       ws});
  changes.push_back({"--world-size " + std::to_string(2 * ws), {}, 2 * ws});
  return changes;
}

// Does the predicted peak fit --gpu-memory? Where it does not, the peak with each change and with
// all valid ones together, on stderr; exit code 2.
int fit_or_suggest(const CheckRequest& a, const Environment& env, const Config& c, const PeakPlan& plan) {
  const double gpu_gib = a.gpu_memory_gib;
  const double peak_gib = static_cast<double>(plan.peak_bytes()) / (1024.0 * 1024 * 1024);
  if (peak_gib <= gpu_gib) {
    std::cout << "fits: " << log::fixed(peak_gib, 2) << " of " << gpu_gib << " GiB per GPU (margin "
              << log::fixed(gpu_gib - peak_gib, 2) << " GiB)\n";
    return 0;
  }
  std::cerr << "error: predicted peak " << log::fixed(peak_gib, 2) << " GiB per rank does not fit in --gpu-memory "
            << gpu_gib << " GiB. Predicted peak with:\n";
  auto report = [&](const Change& ch) {
    std::vector<std::string> with = a.sets;
    with.insert(with.end(), ch.sets.begin(), ch.sets.end());
    try {
      const double p = static_cast<double>(predict_peak(load_config(a.config, with, env), ch.world_size).peak_bytes()) /
                       (1024.0 * 1024 * 1024);
      std::cerr << "  " << ch.what << ": " << log::fixed(p, 2) << " GiB" << (p <= gpu_gib ? " — fits" : "") << "\n";
      return true;
    } catch (const ConfigError&) {
      std::cerr << "  " << ch.what << ": not valid with this config\n";
      return false;
    }
  };
  Change all{"all of the valid ones together", {}, 2 * a.world_size};
  for (const auto& ch : memory_changes(c, a.world_size))
    if (report(ch)) all.sets.insert(all.sets.end(), ch.sets.begin(), ch.sets.end());
  report(all);
  return 2;
}

}  // namespace

int check(const CheckRequest& a) {
  Environment env = Environment::detect();
  env.local = !a.plan;
  const Config c = load_config(a.config, a.sets, env);
  const MemoryReport m = predict_memory(c, a.world_size);
  if (a.json) {
    std::cout << m.to_json() << "\n";
    return 0;
  }
  print_model(c);
  if (env.local) {  // the dataset as training will read it (JSONL: tokenized now)
    std::cout << "# data\n";
    for (const auto& line : open_data(c).report) std::cout << line << "\n";
  }
  const PeakPlan plan = predict_peak(c, a.world_size);
  print_peak(c, m, plan, a.world_size);
  return a.gpu_memory_gib > 0 ? fit_or_suggest(a, env, c, plan) : 0;
}

}  // namespace ptrain
